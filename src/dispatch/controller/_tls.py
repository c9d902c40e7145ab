"""The controller's one certificate maker, its one way of serving certificate files that change, and the
guard's certificate lifecycle.

:func:`issue` makes a private CA and a serving certificate signed by it. The guard's webhooks serve with it
(the CA goes into the webhook configurations' caBundle, so the API server verifies the guard), and secure
metrics without a mounted certificate serve with its leaf (a scraper that trusts nothing of ours still gets
TLS). ECDSA P-256 keys, SHA-256 signatures, server-auth only: what controller-runtime's and cert-manager's
defaults give a webhook.

:class:`Reloading` serves ``tls.crt``/``tls.key`` files that are replaced while the server runs (a mounted
Secret that cert-manager renews, or the guard's own renewal), for the guard and for secure metrics alike.

:class:`Upkeep` is the guard's certificate lifecycle: ``--guard-cert-dir`` holding ``tls.crt``/``tls.key``
(cert-manager's Secret, mounted) is used as is; otherwise the controller makes its own CA and serving
certificate there (:func:`load_or_generate`) and adds the CA to the ``caBundle`` of its webhook configurations
(:func:`publish`: each replica its own CA, the bundle keeps the newest few, each replica re-adds its own
periodically). With ``failurePolicy: Fail`` an expired serving certificate would refuse every start, so files
someone replaced are reloaded, and a certificate of the controller's own is renewed ``RENEW_BEFORE`` ahead of
its end: the new CA is published beside the old one first, then served.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .. import _api as api
from .. import _kube as k
from ..errors import Conflict, DispatchError, NotFound

log = structlog.get_logger("dispatch.controller.tls")

BUNDLE_KEEP = 8
"""CAs kept in the caBundle: every live replica's, across a few restarts."""
RENEW_BEFORE = dt.timedelta(days=30)
"""A certificate of the controller's own is replaced this long before it ends (it lasts 365 days)."""
SWITCH_DELAY = 5.0
"""Seconds between publishing a renewed CA and serving the certificate it signed (the API server reloads a
changed webhook configuration within about a second)."""
GUARD_CA = "dispatch-guard-ca"


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


# --------------------------------------------------------------------------- the guard's certificates


@dataclass(frozen=True)
class Certs:
    """The serving certificate's files, and the CA to publish (None: someone else publishes it)."""

    cert: Path
    key: Path
    ca_pem: bytes | None


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def generate_certs(directory: Path, hosts: Sequence[str], *, days: int = 365) -> Certs:
    """A fresh CA and a serving certificate for ``hosts`` (DNS names or IP addresses) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    made = issue(hosts, ca_name=GUARD_CA, days=days)
    _write(directory / "tls.key", made.key_pem, 0o600)
    _write(directory / "ca.crt", made.ca_pem, 0o644)
    _write(directory / "tls.crt", made.cert_pem, 0o644)
    return Certs(directory / "tls.crt", directory / "tls.key", made.ca_pem)


def renewal_due(cert: Path, *, now: dt.datetime | None = None, before: dt.timedelta | None = None) -> bool:
    """Whether the certificate in ``cert`` ends within ``before`` (default ``RENEW_BEFORE``), has ended,
    or cannot be read."""
    try:
        leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    except (OSError, ValueError):
        return True
    margin = RENEW_BEFORE if before is None else before
    return leaf.not_valid_after_utc - (now or dt.datetime.now(dt.UTC)) < margin


def renewable(directory: Path) -> bool:
    """Whether the certificates in ``directory`` are the controller's own to replace: a writable directory
    (an emptyDir). A mounted Secret (cert-manager's) is read-only and renewed by its owner."""
    return os.access(directory, os.W_OK)


def load_or_generate(directory: Path | None, hosts: Sequence[str], *, renew: bool = True) -> Certs:
    """``tls.crt``/``tls.key`` already in ``directory`` (cert-manager, or an earlier start) are used, with
    its ``ca.crt`` if present, unless they are the controller's own and due for renewal (``renew``: the
    controller publishes its CA, so a new one will be trusted); otherwise a new CA and certificate are made
    there (a private temporary directory when none is given)."""
    if directory is not None and (directory / "tls.crt").is_file() and (directory / "tls.key").is_file():
        if not (renew and renewal_due(directory / "tls.crt") and renewable(directory)):
            ca = directory / "ca.crt"
            return Certs(directory / "tls.crt", directory / "tls.key", ca.read_bytes() if ca.is_file() else None)
        log.info("guard certificate due for renewal; making a new one", directory=str(directory))
    return generate_certs(directory or Path(tempfile.mkdtemp(prefix="dispatch-guard-")), hosts)


def merged_bundle(existing: bytes, ours: bytes, *, keep: int = BUNDLE_KEEP) -> bytes:
    """``existing`` with ``ours`` added: expired CAs dropped, the newest ``keep`` kept (ours always)."""
    now = dt.datetime.now(dt.UTC)
    mine = x509.load_pem_x509_certificate(ours)
    try:
        others = x509.load_pem_x509_certificates(existing) if existing.strip() else []
    except ValueError:
        others = []  # an unparseable bundle is replaced: the API server could not have used it either
    kept = [c for c in others if c != mine and c.not_valid_after_utc > now]
    kept.sort(key=lambda c: c.not_valid_before_utc, reverse=True)
    chosen = [mine, *kept[: max(0, keep - 1)]]
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chosen)


async def publish_ca(kube: k.Kube, webhook: str, ca_pem: bytes, res: k.Res = api.VALIDATING_WEBHOOKS) -> bool:
    """Make every webhook of configuration ``webhook`` (of kind ``res``) trust ``ca_pem``; True if anything
    was written, False if nothing needed to be (or another writer won every try)."""

    async def once() -> bool:
        obj = await kube.get(res, webhook)
        hooks = list(obj.get("webhooks") or [])
        changed = False
        for hook in hooks:
            client = hook.setdefault("clientConfig", {})
            current = base64.b64decode(client.get("caBundle") or "")
            bundle = merged_bundle(current, ca_pem)
            if bundle != current:
                client["caBundle"] = base64.b64encode(bundle).decode()
                changed = True
        if not changed:
            return False
        body = {"metadata": {"resourceVersion": obj.get("metadata", {}).get("resourceVersion")}, "webhooks": hooks}
        await kube.merge_patch(res, webhook, body)
        return True

    try:
        return await k.on_conflict(once, f"{res.plural}/{webhook}")
    except Conflict:
        return False


async def publish(kube: k.Kube, webhook: str, ca_pem: bytes) -> bool:
    """Our CA into the validating configuration ``webhook`` and, when installed, enrolment's mutating one
    of the same name (enrolment is optional: its absence is no warning). True once the API server can
    trust this replica: the CA is in the validating bundle, or there is no such configuration to call it."""
    trusted = True
    try:
        if await publish_ca(kube, webhook, ca_pem):
            log.info("guard CA published", webhook=webhook)
    except NotFound:
        log.warning("guard webhook configuration not found; its caBundle is not kept", webhook=webhook)
    except DispatchError as exc:
        trusted = False
        log.warning("guard CA not published", webhook=webhook, error=str(exc))
    try:
        if await publish_ca(kube, webhook, ca_pem, api.MUTATING_WEBHOOKS):
            log.info("guard CA published", webhook=webhook, kind=api.MUTATING_WEBHOOKS.kind)
    except NotFound:
        log.debug("no mutating webhook configuration of enrolment; none kept", webhook=webhook)
    except DispatchError as exc:
        log.warning("guard CA not published", webhook=webhook, kind=api.MUTATING_WEBHOOKS.kind, error=str(exc))
    return trusted


def read_ca_file(ca_file: str, *, option: str) -> bytes:
    """The PEM bytes of a file of one or more CA certificates, or a ValueError naming ``option`` and what is
    wrong (no such file, no certificate in it)."""
    try:
        pem = Path(ca_file).read_bytes()
    except OSError as exc:
        raise ValueError(f"{option} {ca_file}: {exc.strerror or exc}") from None
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError:
        found = []
    if not found:
        raise ValueError(f"{option} {ca_file} holds no PEM certificate")
    return pem


def server_context() -> ssl.SSLContext:
    """A webhook server's TLS context: TLS 1.2 or later, HTTP/1.1."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass
class Upkeep:
    """The guard's certificate, served and kept fresh: renewed ahead of its end when it is its own, reloaded
    when someone else replaced its files, and its CA kept in the webhook configurations' caBundle."""

    certs: Certs
    context: Reloading
    webhook: str = ""
    """The configuration whose caBundle this replica keeps ("": someone else keeps it, cert-manager)."""
    hosts: tuple[str, ...] = ()
    kube: k.Kube | None = None
    reloads: int = 0
    loaded: Signature = ()
    """The files' signature when last loaded (a change means someone replaced them)."""
    trusted: bool = False
    """Whether the API server can trust our certificate: the CA we keep is in the webhook's bundle (set by
    the first round), or another party (cert-manager) keeps the bundle."""

    @classmethod
    def start(cls, cert_dir: str, hosts: Sequence[str], webhook: str, kube: k.Kube | None, *,
              make: Callable[[], ssl.SSLContext] = server_context) -> Upkeep:
        """The certificate the guard starts serving (``load_or_generate``), its context (each one ``make``
        builds: the guard's asks for client certificates when told to), and the upkeep of it."""
        certs = load_or_generate(Path(cert_dir) if cert_dir else None, hosts, renew=bool(webhook))
        if renewal_due(certs.cert, before=dt.timedelta(0)):
            log.warning("guard certificate has expired: the API server will refuse to call the guard",
                        cert=str(certs.cert))
        context = Reloading(make, certs.cert, certs.key, what="guard")
        return cls(certs, context, webhook=webhook if certs.ca_pem is not None else "", hosts=tuple(hosts),
                   kube=kube, loaded=context.loaded)

    def ready(self) -> tuple[bool, str]:
        """Whether this replica can answer the API server now, for ``/readyz``: a replica whose CA is not yet
        trusted would fail every review (failurePolicy Fail), so it must not receive them."""
        if not self.loaded:
            return False, "guard certificate not loaded"
        if self.webhook and not self.trusted:
            return False, f"guard CA not yet in the caBundle of {self.webhook}"
        return True, "guard serving"

    async def refresh(self, *, switch_delay: float = SWITCH_DELAY) -> None:
        """One round: renew a certificate of our own that is due (publishing its CA before serving it), reload
        files that someone else replaced, and re-publish our CA."""
        directory = self.certs.cert.parent
        # Only a certificate whose CA this replica publishes is its own to renew: nobody would trust
        # another one.
        if self.webhook and renewal_due(self.certs.cert) and renewable(directory):
            fresh = generate_certs(directory, self.hosts)
            if self.kube is not None and fresh.ca_pem is not None:
                self.trusted = await publish(self.kube, self.webhook, fresh.ca_pem)
                await asyncio.sleep(switch_delay)
            self.certs = fresh
            if self._load():
                log.info("guard certificate renewed", cert=str(fresh.cert))
        elif signature(self.certs.cert, self.certs.key) != self.loaded and self._load():
            log.info("guard certificate reloaded", cert=str(self.certs.cert))
        if self.webhook and self.kube is not None and self.certs.ca_pem is not None:
            self.trusted = await publish(self.kube, self.webhook, self.certs.ca_pem) or self.trusted

    def _load(self) -> bool:
        """Serve the current files; False (the old pair still served, a warning logged) when they do not
        load, as a half-written rotation does: the next round tries again."""
        if not self.context.reload(self.certs.cert, self.certs.key):
            return False
        ca = self.certs.cert.parent / "ca.crt"
        if self.certs.ca_pem is not None and ca.is_file():
            self.certs = Certs(self.certs.cert, self.certs.key, ca.read_bytes())
        self.loaded = self.context.loaded
        self.reloads += 1
        return True

    async def run(self, every: float) -> None:
        """Rounds every ``every`` seconds, until cancelled."""
        while True:
            try:
                await self.refresh()
            except Exception as exc:   # upkeep must never stop: the next round tries again
                log.warning("guard certificate upkeep failed", error=str(exc))
            await asyncio.sleep(every)
