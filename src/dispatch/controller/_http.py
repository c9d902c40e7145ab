"""The controller's one HTTP/1.1 server core, and ``/healthz``, ``/readyz`` and ``/metrics`` on it.

A hand-written server keeps the probes on the controller's own event loop: if the loop is wedged the
probe times out and the kubelet restarts the pod, which a server on a separate thread would not notice.
The guard's webhook (``_guard``) is served by the same core (:class:`Listener`, :func:`start`): the
request read within bounds and answered one way, each listener choosing its methods, whether it reads a
body and whether it keeps connections alive.

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
import contextlib
import hashlib
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import _kube as k
from ..errors import DispatchError
from . import _tls as tls

Probe = Callable[[], tuple[bool, str]]
log = structlog.get_logger("dispatch.controller.http")

TOKEN_REVIEWS = k.Res("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
ACCESS_REVIEWS = k.Res("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                       namespaced=False)
METRICS_PATH = "/metrics"
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 413: "Payload Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


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


class _Certificates(tls.Reloading):
    """The mounted certificate of the secure metrics listener: nothing else keeps it, so a handshake looks
    for new files."""

    recheck_seconds: float | None = 10.0
    """How often a handshake looks at the files (a Secret's update lands in about a minute)."""

    def __init__(self, cert_dir: Path) -> None:
        super().__init__(_server_context, cert_dir / "tls.crt", cert_dir / "tls.key", what="metrics")


def _metrics_context(cert_dir: str | None) -> ssl.SSLContext:
    """The secure metrics listener's TLS context: the mounted certificate, or a self-signed one."""
    if cert_dir is not None:
        return _Certificates(Path(cert_dir)).context
    ctx = _server_context()
    _load_pem(ctx, _self_signed_pem())
    return ctx


# --------------------------------------------------------------------------- the HTTP/1.1 server core


TEXT = "text/plain; charset=utf-8"
Answer = tuple[int, str, bytes, str]
"""An HTTP answer: status, content type, body and any extra header lines."""
NOT_FOUND: Answer = (404, TEXT, b"not found\n", "")
READS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Request:
    """One request as read: its method, target, headers (names lower-cased) and body."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""
    peer: Mapping[str, Any] | None = None
    """The client certificate the TLS handshake verified (``SSLSocket.getpeercert()``'s form); None when the
    listener asks for none (or serves plain HTTP)."""

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


Route = Callable[[Request], Awaitable[Answer]]


@dataclass(frozen=True)
class Listener:
    """How one listener speaks HTTP/1.1; the defaults are the probes' and metrics' (one bodiless GET or
    HEAD a connection, read within 5 s)."""

    route: Route
    """The answer to a request that passed the checks below."""
    methods: frozenset[str] = READS
    paths: frozenset[str] | None = None
    """The only paths served, any other answered ``not_found`` before its method is looked at; None:
    ``route`` answers every path."""
    keep_alive: bool = False
    """Read the next request on the same connection; else answer ``Connection: close`` and close."""
    max_head: int = 2**16
    """Longest request line and headers; a longer head closes the connection unanswered."""
    max_body: int = 0
    """Longest body, a longer one answered ``too_large`` (the connection then closed); 0: bodies are not
    read (nor their Content-Length)."""
    timeout: float = 5.0
    """Seconds to read one request (on a kept-alive connection, also to wait for it); then the connection
    is closed unanswered."""
    max_connections: int = 0
    """Connections served at once; one more is closed unanswered (0: no bound). With ``max_buffered`` it bounds
    what any client that can reach the port can make the process hold in memory."""
    max_buffered: int = 0
    """Body bytes held at once over every connection; a request whose body would pass it is answered ``busy``
    and its connection closed (0: no bound beyond ``max_body`` a connection)."""
    not_found: Answer = NOT_FOUND
    not_allowed: Answer = (405, TEXT, b"method not allowed\n", "")
    too_large: Answer = (413, TEXT, b"too large\n", "")
    busy: Answer = (503, TEXT, b"busy\n", "")


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


@dataclass
class _Budget:
    """The body bytes every connection of one listener holds at once (``Listener.max_buffered``)."""

    limit: int
    held: int = 0

    def take(self, n: int) -> None:
        if self.limit and self.held + n > self.limit:
            raise _Busy
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


async def _read(reader: asyncio.StreamReader, listener: Listener, budget: _Budget | None = None) -> Request:
    """One request, or an exception: _TooLarge for a body over the bound, _Busy when every connection's bodies
    together would pass ``max_buffered``, else the connection is unusable."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    parts = head[0].split()
    headers: dict[str, str] = {}
    for line in head[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    request = Request(parts[0] if parts else "", parts[1] if len(parts) > 1 else "/", headers)
    if not listener.max_body:
        return request
    length = int(headers.get("content-length") or 0)
    if length > listener.max_body or length < 0:
        raise _TooLarge
    if budget is None or not length:
        return Request(request.method, request.target, headers, await reader.readexactly(length) if length else b"")
    budget.take(length)
    try:
        return Request(request.method, request.target, headers, await reader.readexactly(length))
    finally:
        budget.give(length)


async def _answer(listener: Listener, request: Request) -> Answer:
    if listener.paths is not None and request.path not in listener.paths:
        return listener.not_found
    if request.method not in listener.methods:
        return listener.not_allowed
    return await listener.route(request)


def _encode(listener: Listener, method: str, answer: Answer) -> bytes:
    status, ctype, body, extra = answer
    close = "" if listener.keep_alive else "Connection: close\r\n"
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}{close}\r\n").encode() + (b"" if method == "HEAD" else body)


def handler(listener: Listener) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """Every listener's connection handling: requests read within the bounds, checked, and answered by
    ``listener.route``; one request a connection unless ``keep_alive``."""

    budget = _Budget(listener.max_buffered)
    open_now = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_now[0] += 1
        try:
            if listener.max_connections and open_now[0] > listener.max_connections:
                return
            peer = writer.get_extra_info("peercert") or None
            while True:
                try:
                    request = await asyncio.wait_for(_read(reader, listener, budget), timeout=listener.timeout)
                except _TooLarge:
                    writer.write(_encode(listener, "", listener.too_large))
                    await writer.drain()
                    return
                except _Busy:
                    writer.write(_encode(listener, "", listener.busy))
                    await writer.drain()
                    return
                except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                    return
                if peer is not None:
                    request = replace(request, peer=peer)
                writer.write(_encode(listener, request.method, await _answer(listener, request)))
                await writer.drain()
                if not listener.keep_alive:
                    return
        except (ConnectionError, ssl.SSLError):
            return
        finally:
            open_now[0] -= 1
            with contextlib.suppress(Exception):
                writer.close()

    return handle


async def start(listener: Listener, host: str, port: int, *, context: ssl.SSLContext | None = None
                ) -> asyncio.Server:
    """Serve ``listener`` on ``host:port`` (0: any free port), over TLS when given a context."""
    return await asyncio.start_server(handler(listener), host, port, ssl=context, limit=listener.max_head)


# --------------------------------------------------------------------------- the probes and /metrics


async def serve(
    host: str, port: int, *, healthz: Probe, readyz: Probe, registry: CollectorRegistry, metrics: bool = True
) -> asyncio.Server:
    """Start the plain HTTP server of the probes (and of ``/metrics`` unless ``metrics`` is False)."""

    async def route(request: Request) -> Answer:
        path = request.path
        if path == METRICS_PATH and metrics:
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry), ""
        if path in ("/healthz", "/livez", "/readyz"):
            ok, text = (readyz if path == "/readyz" else healthz)()
            return (200 if ok else 503), TEXT, (text + "\n").encode(), ""
        return NOT_FOUND

    return await start(Listener(route), host, port)


async def serve_metrics(serving: MetricsServing, *, registry: CollectorRegistry,
                        kube: k.Kube | None = None) -> asyncio.Server:
    """Start ``/metrics`` on its own listener; ``secure`` needs ``kube`` to review each scrape's token."""
    context: ssl.SSLContext | None = None
    authorizer: Authorizer | None = None
    if serving.secure:
        if kube is None:
            raise ValueError("secure metrics review tokens through the API server: a Kube is needed")
        context = _metrics_context(serving.cert_dir)
        authorizer = Authorizer(kube)

    async def route(request: Request) -> Answer:
        path = request.path
        if path != METRICS_PATH:
            return NOT_FOUND
        if authorizer is not None:
            status, reason = await authorizer.check(request.headers.get("authorization"), path)
            if status != 200:
                challenge = 'WWW-Authenticate: Bearer realm="dispatch-controller"\r\n' if status == 401 else ""
                return status, TEXT, (reason + "\n").encode(), challenge
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry), ""

    return await start(Listener(route), serving.host, serving.port, context=context)
