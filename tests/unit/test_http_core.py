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


# ------------------------------------------------------------- issue 35 item 8: what any client can make it hold


async def test_connections_over_the_cap_are_closed_unanswered_and_bodies_share_one_budget() -> None:
    """Anyone who reaches the guard's port could hold many connections, each with a large half-sent body (50
    connections of 7 MiB heads reached 437 MiB before): the connections at once and the body bytes held over
    all of them are bounded; a request whose body would pass the budget is answered busy at once."""
    listener = h.Listener(echo, methods=frozenset({"POST"}), keep_alive=True, max_head=1024, max_body=100,
                          timeout=5, max_connections=2, max_buffered=150)
    server = await h.start(listener, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    held = []
    try:
        for _ in range(2):  # two half-sent bodies of 100: the first holds 100 of the 150
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /in HTTP/1.1\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
            await writer.drain()
            held.append((reader, writer))
        await asyncio.sleep(0.2)
        # the second found the budget spent: answered busy, closed
        assert (await asyncio.wait_for(held[1][0].read(), timeout=5)).startswith(b"HTTP/1.1 503 ")
        held[1][1].close()
        await asyncio.sleep(0.1)
        # a third connection while the first is open and a fourth: the cap of 2 closes the fourth unanswered
        third = await asyncio.open_connection("127.0.0.1", port)
        fourth = await asyncio.open_connection("127.0.0.1", port)
        try:  # closed unanswered: EOF, or a reset when our bytes arrive after the close
            fourth[1].write(b"POST /in HTTP/1.1\r\nContent-Length: 1\r\n\r\nx")
            await fourth[1].drain()
            answered = await asyncio.wait_for(fourth[0].read(), timeout=5)
        except ConnectionResetError:
            answered = b""
        assert answered == b""
        fourth[1].close()
        third[1].write(b"POST /in HTTP/1.1\r\nContent-Length: 40\r\n\r\n" + b"y" * 40)  # 100 + 40 fit in 150
        await third[1].drain()
        assert (await asyncio.wait_for(third[0].readuntil(b"\r\n\r\n"), timeout=5)).startswith(b"HTTP/1.1 200 ")
        third[1].close()
        # the first finishes its body: answered, and its bytes go back to the budget
        held[0][1].write(b"x" * 90)
        await held[0][1].drain()
        assert (await asyncio.wait_for(held[0][0].readuntil(b"\r\n\r\n"), timeout=5)).startswith(b"HTTP/1.1 200 ")
    finally:
        for _, writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def test_a_review_nested_too_deep_is_a_bad_request_not_an_unhandled_error() -> None:
    from dispatch.controller import _guard as g

    with pytest.raises(ValueError, match="nests too deep"):
        g._parse_review(b"[" * 200_000)
    assert g._parse_review(b"[1]") == {}
    assert g._parse_review(b'{"kind": "AdmissionReview"}') == {"kind": "AdmissionReview"}
    assert g.MAX_HEAD <= 16 * 1024 < g.MAX_BODY
