"""The controller's one certificate maker, and its one way of serving certificate files that change.

:func:`issue` makes a private CA and a serving certificate signed by it. The guard's webhooks serve with it
(the CA goes into the webhook configurations' caBundle, so the API server verifies the guard), and secure
metrics without a mounted certificate serve with its leaf (a scraper that trusts nothing of ours still gets
TLS). ECDSA P-256 keys, SHA-256 signatures, server-auth only: what controller-runtime's and cert-manager's
defaults give a webhook.

:class:`Reloading` serves ``tls.crt``/``tls.key`` files that are replaced while the server runs (a mounted
Secret that cert-manager renews, or the guard's own renewal), for the guard and for secure metrics alike.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = structlog.get_logger("dispatch.controller.tls")


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


Signature = tuple[tuple[int, int], ...]


def signature(*paths: Path) -> Signature:
    """What changes when the files are replaced (a Secret volume swaps a symlink; stat follows it); an
    unreadable file is (0, 0)."""
    out = []
    for path in paths:
        try:
            st = path.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, 0))
    return tuple(out)


class Reloading:
    """A server's TLS context whose certificate files may be replaced while it serves.

    A reload builds a fresh context from the files and, only once they have loaded, hands it to every later
    handshake (the SNI callback, which OpenSSL calls for every handshake, with a server name or without):
    open connections keep theirs, and files that do not load (half-written during a rotation) leave the
    previous certificate served. ``load_cert_chain`` again on the serving context would not: a new
    certificate read beside the old key leaves that context with no usable key, and every handshake fails.
    """

    recheck_seconds: float | None = None
    """None: only :meth:`reload` reads the files (an owner that keeps them, like the guard's upkeep, calls
    it); else a handshake re-reads changed files at most this often."""

    def __init__(self, make: Callable[[], ssl.SSLContext], cert: Path, key: Path, *, what: str) -> None:
        self._make = make
        self.what = what
        self.cert, self.key = cert, key
        self.loaded = signature(cert, key)
        """The files' signature when last loaded."""
        self.context = self._current = make()
        self.context.load_cert_chain(cert, key)
        self.context.sni_callback = self._pick
        self._checked = 0.0

    def changed(self) -> bool:
        return signature(self.cert, self.key) != self.loaded

    def reload(self, cert: Path | None = None, key: Path | None = None) -> bool:
        """Serve ``cert``/``key`` (by default the same paths again) from the next handshake on; False, the
        previous certificate still served, when they do not load."""
        cert, key = cert or self.cert, key or self.key
        sig = signature(cert, key)
        try:
            fresh = self._make()
            fresh.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            log.warning(f"{self.what} certificate not reloaded", cert=str(cert), error=str(exc))
            return False
        self.cert, self.key, self.loaded, self._current = cert, key, sig, fresh
        return True

    def _pick(self, sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
        if self.recheck_seconds is not None:
            now = time.monotonic()
            if now - self._checked >= self.recheck_seconds:
                self._checked = now
                if self.changed() and self.reload():
                    log.info(f"{self.what} certificate reloaded", cert=str(self.cert))
        if self._current is not self.context:
            sock.context = self._current
