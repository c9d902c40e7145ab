"""``/healthz``, ``/readyz`` and ``/metrics`` on small asyncio HTTP servers.

A hand-written server keeps the probes on the controller's own event loop: if the loop is wedged the
probe times out and the kubelet restarts the pod, which a server on a separate thread would not notice.

The probes are always plain HTTP (the kubelet probes them without credentials). ``/metrics`` is served
either next to them (the default), or on a listener of its own (:class:`MetricsServing`): bound to
localhost only, or over HTTPS where each scrape must carry a bearer token that the API server
authenticates (TokenReview) and authorizes for ``get`` on the non-resource URL ``/metrics``
(SubjectAccessReview): what controller-runtime's secure metrics do, so a cluster's Prometheus set up
for other controllers scrapes this one the same way (its ServiceAccount bound to a ClusterRole such as
``dispatch-metrics-reader``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import _kube as k
from ..errors import DispatchError

Probe = Callable[[], tuple[bool, str]]
log = structlog.get_logger("dispatch.controller.http")

TOKEN_REVIEWS = k.Res("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
ACCESS_REVIEWS = k.Res("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                       namespaced=False)
METRICS_PATH = "/metrics"
_REASONS = {200: "OK", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True)
class MetricsServing:
    """``/metrics`` on a listener of its own instead of next to the probes.

    ``secure`` serves HTTPS and lets through only scrapes whose bearer token the API server accepts and
    authorizes for ``get /metrics``. The certificate is ``tls.crt``/``tls.key`` in ``cert_dir`` (re-read
    when they change, as a mounted Secret rotates), or a self-signed one made at start when ``cert_dir``
    is None (Prometheus then scrapes with ``insecure_skip_verify``, as for controller-runtime's default).
    """

    host: str
    port: int
    secure: bool = False
    cert_dir: str | None = None

    @staticmethod
    def parse(bind_address: str, *, secure: bool = False, cert_dir: str | None = None) -> MetricsServing:
        """``HOST:PORT``, ``:PORT`` (every address) or ``[IPv6]:PORT``; a clear ValueError otherwise."""
        host, sep, port_text = bind_address.rpartition(":")
        if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ValueError(f"metrics bind address {bind_address!r} is not HOST:PORT, :PORT or [IPv6]:PORT")
        host = host.strip("[]") or "0.0.0.0"
        if cert_dir is not None and not secure:
            raise ValueError("a metrics certificate directory needs secure metrics (--metrics-secure)")
        if cert_dir is not None:
            missing = [f for f in ("tls.crt", "tls.key") if not (Path(cert_dir) / f).is_file()]
            if missing:
                raise ValueError(f"metrics certificate directory {cert_dir} lacks {', '.join(missing)}")
        return MetricsServing(host=host, port=int(port_text), secure=secure, cert_dir=cert_dir)


class Authorizer:
    """Authenticate a bearer token and authorize ``get /metrics`` through the API server.

    Answers are kept for ``ttl`` seconds per token (a scrape every few seconds costs two API requests
    a minute, not two a scrape); only a hash of the token is kept.
    """

    def __init__(self, kube: k.Kube, *, ttl: float = 60.0, max_entries: int = 256) -> None:
        self.kube = kube
        self.ttl = ttl
        self.max_entries = max_entries
        self._cache: dict[str, tuple[float, int, str]] = {}

    async def check(self, authorization: str | None, path: str) -> tuple[int, str]:
        """(HTTP status, reason): 200 let through, 401 no or a rejected token, 403 not allowed, 500 API error."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "a bearer token is required"
        key = hashlib.sha256(f"{path}\0{token}".encode()).hexdigest()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        try:
            status, reason = await self._review(token, path)
        except DispatchError as exc:
            log.warning("metrics authorization failed", error=str(exc))
            return 500, "could not review the token with the API server"
        if len(self._cache) >= self.max_entries:
            self._cache = {kk: v for kk, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
        self._cache[key] = (now + self.ttl, status, reason)
        return status, reason

    async def _review(self, token: str, path: str) -> tuple[int, str]:
        review = await self.kube.create(TOKEN_REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status: dict[str, Any] = review.get("status") or {}
        if not status.get("authenticated"):
            return 401, "the token was not accepted"
        user: dict[str, Any] = status.get("user") or {}
        spec: dict[str, Any] = {"user": user.get("username", ""), "groups": user.get("groups") or [],
                                "nonResourceAttributes": {"path": path, "verb": "get"}}
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = await self.kube.create(ACCESS_REVIEWS, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
        if (access.get("status") or {}).get("allowed"):
            return 200, "allowed"
        return 403, f"{user.get('username', 'the caller')} may not get {path}"


def _self_signed_pem() -> bytes:
    """A certificate and key (PEM) for this pod, for secure metrics without a provided certificate."""
    from . import _tls as tls

    host = socket.gethostname()
    made = tls.issue([host, "localhost", "127.0.0.1"], ca_name=f"dispatch-controller@{host}")
    return made.cert_pem + made.key_pem


def _load_pem(ctx: ssl.SSLContext, pem: bytes) -> None:
    """Load an in-memory certificate and key: ``ssl`` reads only files, and the root filesystem is read-only."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("dispatch-metrics-tls")
        try:
            os.write(fd, pem)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile(suffix=".pem") as f:  # not Linux: a private temporary file
        f.write(pem)
        f.flush()
        ctx.load_cert_chain(f.name)


def _server_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class _Certificates:
    """The TLS context of the secure metrics listener, re-read when the mounted certificate changes."""

    recheck_seconds = 10.0
    """How often a handshake looks at the files' modification times (a Secret's update lands in about a minute)."""

    def __init__(self, cert_dir: str | None) -> None:
        self.cert_dir = Path(cert_dir) if cert_dir else None
        self.context = _server_context()
        self._stamp: tuple[float, float] | None = None
        self._checked = 0.0
        self._current = self.context
        if self.cert_dir is None:
            _load_pem(self.context, _self_signed_pem())
        else:
            self._current = self._load()
            self.context.load_cert_chain(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
            self.context.sni_callback = self._pick

    def _files_stamp(self) -> tuple[float, float]:
        assert self.cert_dir is not None
        return ((self.cert_dir / "tls.crt").stat().st_mtime, (self.cert_dir / "tls.key").stat().st_mtime)

    def _load(self) -> ssl.SSLContext:
        assert self.cert_dir is not None
        ctx = _server_context()
        self._stamp = self._files_stamp()
        ctx.load_cert_chain(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
        return ctx

    def _pick(self, sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
        now = time.monotonic()
        if now - self._checked >= self.recheck_seconds:
            self._checked = now
            try:
                if self._files_stamp() != self._stamp:
                    self._current = self._load()
                    log.info("metrics certificate reloaded", directory=str(self.cert_dir))
            except (OSError, ssl.SSLError) as exc:  # half-written during a rotation: keep the old one
                log.warning("metrics certificate not reloaded", error=str(exc))
        sock.context = self._current


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]] | None:
    try:
        request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError):
        return None
    lines = request.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return (parts[0] if parts else ""), (parts[1] if len(parts) > 1 else "/").split("?", 1)[0], headers


async def _respond(writer: asyncio.StreamWriter, method: str, status: int, ctype: str, body: bytes,
                   extra: str = "") -> None:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    ).encode()
    try:
        writer.write(head + (b"" if method == "HEAD" else body))
        await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


TEXT = "text/plain; charset=utf-8"
Answer = tuple[int, str, bytes, str]
"""An HTTP answer: status, content type, body and any extra header lines."""
NOT_FOUND: Answer = (404, TEXT, b"not found\n", "")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _handler(route: Callable[[str, dict[str, str]], Awaitable[Answer]]) -> Handler:
    """One connection's handling, the same for every listener: its one request read (an unreadable one
    closes the connection), any method but GET and HEAD refused, else ``route``'s answer to the path and
    headers."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        if request is None:
            writer.close()
            return
        method, path, headers = request
        if method not in ("GET", "HEAD"):
            await _respond(writer, method, 405, TEXT, b"method not allowed\n")
        else:
            await _respond(writer, method, *await route(path, headers))

    return handle


async def serve(
    host: str, port: int, *, healthz: Probe, readyz: Probe, registry: CollectorRegistry, metrics: bool = True
) -> asyncio.Server:
    """Start the plain HTTP server of the probes (and of ``/metrics`` unless ``metrics`` is False)."""

    async def route(path: str, _headers: dict[str, str]) -> Answer:
        if path == METRICS_PATH and metrics:
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry), ""
        if path in ("/healthz", "/livez", "/readyz"):
            ok, text = (readyz if path == "/readyz" else healthz)()
            return (200 if ok else 503), TEXT, (text + "\n").encode(), ""
        return NOT_FOUND

    return await asyncio.start_server(_handler(route), host, port)


async def serve_metrics(serving: MetricsServing, *, registry: CollectorRegistry,
                        kube: k.Kube | None = None) -> asyncio.Server:
    """Start ``/metrics`` on its own listener; ``secure`` needs ``kube`` to review each scrape's token."""
    tls: ssl.SSLContext | None = None
    authorizer: Authorizer | None = None
    if serving.secure:
        if kube is None:
            raise ValueError("secure metrics review tokens through the API server: a Kube is needed")
        tls = _Certificates(serving.cert_dir).context
        authorizer = Authorizer(kube)

    async def route(path: str, headers: dict[str, str]) -> Answer:
        if path != METRICS_PATH:
            return NOT_FOUND
        if authorizer is not None:
            status, reason = await authorizer.check(headers.get("authorization"), path)
            if status != 200:
                challenge = 'WWW-Authenticate: Bearer realm="dispatch-controller"\r\n' if status == 401 else ""
                return status, TEXT, (reason + "\n").encode(), challenge
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry), ""

    return await asyncio.start_server(_handler(route), serving.host, serving.port, ssl=tls)
