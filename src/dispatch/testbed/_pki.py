"""Test PKI for the local control plane.

One CA signs one leaf used for every TLS endpoint (apiserver, webhooks, controllers' client auth), because
the testbed only ever talks to 127.0.0.1 and fewer moving parts make start-up fast and failures obvious.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ADMIN_USER = "dispatch-testbed-admin"


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             now: dt.datetime) -> x509.CertificateBuilder:
    """A certificate of ``key`` valid from an hour before ``now`` (for clock skew) for ten years."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=3650))
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Both sign digitally; the CA signs certificates and CRLs, the TLS leaf enciphers keys."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=not ca, data_encipherment=False,
        key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )


def ensure_pki(pki: Path) -> None:
    """Create CA, the shared leaf and the service-account key pair under ``pki`` unless present."""
    if (pki / "admin.crt").exists() and (pki / "sa.pub").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dispatch-testbed-ca")])
    ca = (
        _builder(ca_name, ca_name, ca_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, ADMIN_USER),
        ]
    )
    leaf = (
        _builder(leaf_name, ca_name, leaf_key, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes"),
                    x509.DNSName("kubernetes.default"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    _write_key(pki / "ca.key", ca_key)
    _write_cert(pki / "ca.crt", ca)
    _write_key(pki / "admin.key", leaf_key)
    _write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    _write_cert(pki / "admin.crt", leaf)  # written last: its presence marks a complete PKI


def _pair_matches(crt: Path, key: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        priv = serialization.load_pem_private_key(key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(
        cert.public_key().public_bytes(serialization.Encoding.PEM, pub)
        == priv.public_key().public_bytes(serialization.Encoding.PEM, pub)
    )


def install_kueue_metrics_cert(d: Path) -> None:
    """Make sure ``d`` holds a matching tls.crt/tls.key pair, keeping one that is already there.

    Kueue reads its metrics certificate from one hard-coded directory (``/etc/kueue/metrics/certs``) at
    start-up and watches it afterwards, so every testbed on the machine shares it. The testbed turns
    Kueue's metrics off, so any valid pair will do: keeping an existing one means a second testbed never
    rewrites files that a running Kueue may be re-reading, and a pair is only ever written whole (new
    files renamed into place, under a lock) so a Kueue starting meanwhile never reads half of one.
    """
    d.mkdir(parents=True, exist_ok=True)
    with (d.parent / ".dispatch-testbed.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _pair_matches(d / "tls.crt", d / "tls.key"):
            return
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dispatch-testbed-kueue-metrics")])
        cert = (
            _builder(name, name, key, dt.datetime.now(dt.UTC))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        tmp_key, tmp_crt = d / ".tls.key.new", d / ".tls.crt.new"
        _write_key(tmp_key, key)
        _write_cert(tmp_crt, cert)
        os.replace(tmp_key, d / "tls.key")
        os.replace(tmp_crt, d / "tls.crt")
