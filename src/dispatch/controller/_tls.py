"""The controller's one certificate maker: a private CA and a serving certificate signed by it.

The guard's webhooks serve with it (the CA goes into the webhook configurations' caBundle, so the API
server verifies the guard), and secure metrics without a mounted certificate serve with its leaf (a
scraper that trusts nothing of ours still gets TLS). ECDSA P-256 keys, SHA-256 signatures, server-auth
only: what controller-runtime's and cert-manager's defaults give a webhook.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A CA's certificate and a serving certificate with its private key, all PEM."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=not ca,
                         data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                         encipher_only=False, decipher_only=False)


def _names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def issue(hosts: Sequence[str], *, ca_name: str, days: int = 365) -> Issued:
    """A fresh CA (``ca_name`` plus a random suffix, so two replicas' CAs never share a name) and a serving
    certificate for ``hosts`` (DNS names or IP addresses) signed by it, valid from five minutes ago."""
    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{ca_name}-{os.urandom(4).hex()}")])
    ca = (x509.CertificateBuilder().subject_name(issuer).issuer_name(issuer).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(_key_usage(ca=True), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "dispatch")]))
            .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return Issued(ca.public_bytes(serialization.Encoding.PEM), leaf.public_bytes(serialization.Encoding.PEM),
                  key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
