"""``/healthz``, ``/readyz`` and ``/metrics`` on one small asyncio HTTP server.

A hand-written server keeps the probes on the controller's own event loop: if the loop is wedged the
probe times out and the kubelet restarts the pod, which a server on a separate thread would not notice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Probe = Callable[[], tuple[bool, str]]


async def serve(
    host: str, port: int, *, healthz: Probe, readyz: Probe, registry: CollectorRegistry
) -> asyncio.Server:
    """Start serving; the caller closes the returned server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        line = request.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        method = parts[0] if parts else ""
        path = (parts[1] if len(parts) > 1 else "/").split("?", 1)[0]
        status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
        if method not in ("GET", "HEAD"):
            status, body = 405, b"method not allowed\n"
        elif path == "/metrics":
            status, ctype, body = 200, CONTENT_TYPE_LATEST, generate_latest(registry)
        elif path in ("/healthz", "/livez", "/readyz"):
            ok, text = (readyz if path == "/readyz" else healthz)()
            status, body = (200 if ok else 503), (text + "\n").encode()
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}[status]
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        try:
            writer.write(head + (b"" if method == "HEAD" else body))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
