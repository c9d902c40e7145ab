"""The HTTP/1.1 server core that the probes, ``/metrics`` and the guard share: its bounds and checks.

Over plain local sockets, with one listener configured like the probes (the defaults: GET or HEAD, no body,
one request a connection) and one like the guard (POST with a bounded body, known paths, kept alive).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatch.controller import _http as h
from dispatch.controller import _tls as tls

JSON = "application/json"


async def echo(request: h.Request) -> h.Answer:
    return 200, h.TEXT, f"{request.method} {request.path} {len(request.body)}\n".encode(), "X-Seen: yes\r\n"


@pytest.fixture
async def probes() -> AsyncIterator[int]:
    server = await h.start(h.Listener(echo, max_head=1024), "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()


@pytest.fixture
async def webhook() -> AsyncIterator[int]:
    listener = h.Listener(echo, methods=frozenset({"POST"}), paths=frozenset({"/in"}), keep_alive=True,
                          max_head=1024, max_body=16, timeout=0.5,
                          not_found=(404, JSON, b'{"error":"not found"}', ""),
                          too_large=(413, JSON, b'{"error":"too large"}', ""))
    server = await h.start(listener, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()


async def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=5)
    except ConnectionResetError:                                     # closed with our bytes unread
        return b""
    finally:
        writer.close()


async def test_a_probe_request_is_answered_once_and_the_connection_closed(probes: int) -> None:
    got = await exchange(probes, b"GET /healthz?x=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /again HTTP/1.1\r\n\r\n")
    assert got == (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 15\r\n"
                   b"X-Seen: yes\r\nConnection: close\r\n\r\nGET /healthz 0\n")
    head = await exchange(probes, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: 16\r\n" in head
    assert head.endswith(b"\r\n\r\n")                                 # a HEAD answer has no body


async def test_a_method_not_allowed_and_a_bad_request_line_are_405(probes: int) -> None:
    for request in (b"POST /healthz HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"nonsense\r\n\r\n", b"\r\n\r\n"):
        got = await exchange(probes, request)
        assert got.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and got.endswith(b"method not allowed\n")


async def test_an_oversized_or_unfinished_head_closes_the_connection_unanswered(probes: int) -> None:
    assert await exchange(probes, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n") == b""
    reader, writer = await asyncio.open_connection("127.0.0.1", probes)
    writer.write_eof()                                               # a head that never ends
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    writer.close()


async def test_a_webhook_connection_is_kept_alive_with_each_body_read(webhook: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", webhook)
    try:
        for body in (b"{}", b"0123456789abcdef"):
            writer.write(b"POST /in HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            assert head.startswith("HTTP/1.1 200 OK\r\n") and "Connection" not in head
            length = int(head.split("Content-Length: ")[1].split("\r\n")[0])
            assert await reader.readexactly(length) == f"POST /in {len(body)}\n".encode()
        await asyncio.sleep(0.8)                                      # idle past the listener's timeout
        assert await reader.read() == b""
    finally:
        writer.close()


async def test_a_webhook_answers_unknown_paths_404_before_a_wrong_method_405(webhook: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", webhook)
    try:
        writer.write(b"GET /other HTTP/1.1\r\n\r\nGET /in HTTP/1.1\r\n\r\n")
        first = await reader.readuntil(b'{"error":"not found"}')
        assert first.startswith(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n")
        second = await reader.readuntil(b"method not allowed\n")
        assert second.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    finally:
        writer.close()


async def test_a_webhook_refuses_an_oversized_body_413_and_closes(webhook: int) -> None:
    got = await exchange(webhook, b"POST /in HTTP/1.1\r\nContent-Length: 17\r\n\r\n" + b"a" * 17)
    assert got.startswith(b"HTTP/1.1 413 Payload Too Large\r\n") and got.endswith(b'{"error":"too large"}')
    assert await exchange(webhook, b"POST /in HTTP/1.1\r\nContent-Length: many\r\n\r\n") == b""
    assert await exchange(webhook, b"POST /in HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n") == b""


async def test_files_that_do_not_load_leave_the_previous_certificate_served(tmp_path: Path) -> None:
    first, second = (tls.issue(["127.0.0.1"], ca_name=n) for n in ("first", "second"))
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    served = tls.Reloading(lambda: ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert, key, what="test")
    server = await h.start(h.Listener(echo), "127.0.0.1", 0, context=served.context)
    port = int(server.sockets[0].getsockname()[1])

    async def verified_by(ca: bytes) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port,
                                                      ssl=ssl.create_default_context(cadata=ca.decode()))
        except ssl.SSLCertVerificationError:
            return False
        writer.close()
        return True

    try:
        cert.write_bytes(second.cert_pem)                             # half-way through a rotation
        assert served.changed() and not served.reload()
        assert await verified_by(first.ca_pem)                        # the old pair still served
        key.write_bytes(second.key_pem)
        assert served.reload() and not served.changed()
        assert await verified_by(second.ca_pem) and not await verified_by(first.ca_pem)
    finally:
        server.close()
        await server.wait_closed()
