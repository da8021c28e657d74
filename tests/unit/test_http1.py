"""The forward stage's HTTP/1.1 transport (`sidecar.stages.http1`) against a real local socket server:
keep-alive reuse, chunked bodies, the response size cap, timeouts, connections the backend closed
(retried only for idempotent requests, never re-sent otherwise), and the error mapping of
`sidecar.stages.forward.Upstream` (502/504). Every transport-level test runs on the standard event loop and
on uvloop (the server's), against `sidecar.stages.http1.Http1Transport` and the pre-h19u transport kept in
`tests.unit.http1_reference` (the two must agree on every documented behaviour)."""

from __future__ import annotations

import asyncio
import gzip
import json
import select
import socket
import ssl
import threading
import tracemalloc
import zlib
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import UpstreamError, UpstreamTimeout
from sidecar.stages.forward import Upstream
from sidecar.stages.http1 import Http1Transport, ResponseTooLarge
from tests.unit import http1_reference

CLOSE = b"<close>"  # an answer ending with this is followed by closing the connection (the marker is not sent)
Action = Callable[[int, int, bytes], Awaitable[Any]]


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


class Backend:
    """A scripted HTTP/1.1 server on 127.0.0.1. `action(connection number, request number on it, raw
    request)` returns the bytes to answer (or a list of byte pieces, float pauses in seconds and
    `asyncio.Event`s to wait for), or None to close the connection without answering. With `ssl` (a server
    context) it speaks TLS, and its `url` is ``https://`` with `host`."""

    def __init__(self, action: Action, ssl: Any = None, host: str = "127.0.0.1") -> None:
        self.action = action
        self.connections = 0
        self.requests: list[bytes] = []
        self.ssl = ssl
        self.host = host

    async def __aenter__(self) -> "Backend":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        scheme = "https" if self.ssl else "http"
        self.url = f"{scheme}://{self.host}:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.connections
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                raw = head + (await reader.readexactly(length) if length else b"")
                self.requests.append(raw)
                answer = await self.action(conn, n, raw)
                n += 1
                if answer is None:
                    break
                pieces = answer if isinstance(answer, list) else [answer]
                for piece in pieces:  # a list: bytes to send, and floats (seconds to wait) or events between them
                    if isinstance(piece, float):
                        await asyncio.sleep(piece)
                        continue
                    if isinstance(piece, asyncio.Event):
                        await piece.wait()
                        continue
                    writer.write(piece.removesuffix(CLOSE))
                    await writer.drain()
                if pieces[-1] == CLOSE or (isinstance(pieces[-1], bytes) and pieces[-1].endswith(CLOSE)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


LOOP = {"kind": "asyncio"}


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def loop_kind(request: pytest.FixtureRequest) -> str:
    LOOP["kind"] = request.param
    return request.param


@pytest.fixture(params=["new", "reference"])
def Transport(request: pytest.FixtureRequest) -> Any:
    """The transport class under test: today's, or the pre-h19u reference."""
    return Http1Transport if request.param == "new" else http1_reference.Http1Transport


def run(coro: Awaitable[Any]) -> Any:
    if LOOP["kind"] == "uvloop":
        import uvloop
        return uvloop.run(coro)  # type: ignore[arg-type]
    return asyncio.run(coro)  # type: ignore[arg-type]


async def always_ok(conn: int, n: int, raw: bytes) -> bytes:
    return ok()


def test_round_trip_and_keep_alive_reuse(Transport: Any) -> None:
    async def main() -> None:
        async with Backend(always_ok) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                for _ in range(3):
                    r = await client.post("/api/x", content=b'{"q":1}', headers={"content-type": "application/json"})
                    assert r.status_code == 200 and r.json() == {"ok": True}
            assert backend.connections == 1
            first = backend.requests[0]
            assert first.startswith(b"POST /api/x HTTP/1.1\r\n") and first.endswith(b'\r\n\r\n{"q":1}')
            assert b"content-length: 7" in first.lower()
    run(main())


def test_chunked_response_is_decoded(Transport: Any) -> None:
    async def chunked(conn: int, n: int, raw: bytes) -> bytes:
        return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                b"4\r\n[1,2\r\n3\r\n,3]\r\n0\r\n\r\n")

    async def main() -> None:
        async with Backend(chunked) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                assert (await client.get("/")).json() == [1, 2, 3]
                assert (await client.get("/")).json() == [1, 2, 3]
            assert backend.connections == 1
    run(main())


def test_connection_close_and_expiry_are_not_reused(Transport: Any) -> None:
    async def closing(conn: int, n: int, raw: bytes) -> bytes:
        return ok(extra=b"connection: close\r\n")

    async def main() -> None:
        async with Backend(closing) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                await client.get("/")
                await client.get("/")
            assert backend.connections == 2
        async with Backend(always_ok) as backend:
            async with httpx.AsyncClient(transport=Transport(keepalive_expiry=0), base_url=backend.url) as client:
                await client.get("/")
                await client.get("/")
            assert backend.connections == 2
    run(main())


def test_response_size_cap(Transport: Any) -> None:
    async def big(conn: int, n: int, raw: bytes) -> bytes:
        return ok(b'"' + b"x" * 5000 + b'"')

    async def main() -> None:
        async with Backend(big) as backend:
            async with httpx.AsyncClient(transport=Transport(max_response_bytes=4096), base_url=backend.url) as client:
                with pytest.raises(ResponseTooLarge):
                    await client.get("/")
            async with httpx.AsyncClient(transport=Transport(max_response_bytes=5002), base_url=backend.url) as client:
                assert len((await client.get("/")).json()) == 5000
            up = Upstream(backend.url, timeout_s=5, max_connections=2, max_response_bytes=4096)
            with pytest.raises(UpstreamError) as err:
                await up.call("GET", ["x"])
            assert err.value.status == 502 and "too large" in err.value.message
            await up.close()
    run(main())


def test_timeouts_map_to_504_and_connect_errors_to_502(Transport: Any) -> None:
    async def hang(conn: int, n: int, raw: bytes) -> bytes:
        await asyncio.sleep(30)
        return ok()

    async def main() -> None:
        async with Backend(hang) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url, timeout=0.2) as client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.get("/")
            up = Upstream(backend.url, timeout_s=0.2, max_connections=1)
            with pytest.raises(UpstreamTimeout) as err:
                await up.call("POST", ["q"], json_body={"a": 1})
            assert err.value.status == 504
            await up.close()
            # One connection, busy with a hanging request: the next waits for the pool and times out.
            async with httpx.AsyncClient(transport=Transport(max_connections=1), base_url=backend.url,
                                         timeout=httpx.Timeout(5, pool=0.2)) as client:
                first = asyncio.ensure_future(client.get("/"))
                await asyncio.sleep(0.05)
                with pytest.raises(httpx.PoolTimeout):
                    await client.get("/")
                first.cancel()
        async with Backend(always_ok) as backend:
            url = backend.url
        up = Upstream(url, timeout_s=2, max_connections=1)  # the server is gone: connection refused
        with pytest.raises(UpstreamError) as err2:
            await up.call("GET", ["x"])
        assert err2.value.status == 502 and err2.value.message == "backend unreachable"
        await up.close()
    run(main())


async def close_second_request(conn: int, n: int, raw: bytes) -> bytes | None:
    """The backend closes a kept-alive connection when the second request arrives on it (as a server
    whose keep-alive timeout ran out at that moment): nothing of an answer is sent."""
    return None if n == 1 else ok(b'{"conn":%d}' % conn)


@pytest.mark.parametrize("method,extensions", [("GET", None), ("DELETE", None), ("POST", {"memwarden.idempotent": True})])
def test_stale_connection_is_retried_for_idempotent_requests(method: str, extensions: Any, Transport: Any) -> None:
    async def main() -> None:
        async with Backend(close_second_request) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                assert (await client.request(method, "/", content=b"{}", extensions=extensions)).json() == {"conn": 0}
                assert (await client.request(method, "/", content=b"{}", extensions=extensions)).json() == {"conn": 1}
            assert backend.connections == 2 and len(backend.requests) == 3
    run(main())


def test_stale_connection_is_never_retried_for_a_non_idempotent_request(Transport: Any) -> None:
    async def main() -> None:
        async with Backend(close_second_request) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                await client.post("/add", content=b"{}")
                with pytest.raises(httpx.RemoteProtocolError):
                    await client.post("/add", content=b"{}")
                # the failed request was sent once, not again; the pool recovers with a new connection
                assert len(backend.requests) == 2
                assert (await client.post("/add", content=b"{}")).json() == {"conn": 1}
            up = Upstream(backend.url, timeout_s=2, max_connections=1)
            await up.call("POST", ["add"], json_body={})
            with pytest.raises(UpstreamError) as err:
                await up.call("POST", ["add"], json_body={})
            assert err.value.status == 502
            assert await up.call("POST", ["get"], json_body={}) == {"conn": 3}  # fresh connection
            # the second request on that connection finds it closed: a read-only POST is re-sent
            assert await up.call("POST", ["get"], json_body={}, idempotent=True) == {"conn": 4}
            await up.close()
    run(main())


def test_a_fresh_connection_closed_without_answer_is_not_retried(Transport: Any) -> None:
    async def close_always(conn: int, n: int, raw: bytes) -> bytes | None:
        return None

    async def main() -> None:
        async with Backend(close_always) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                with pytest.raises(httpx.RemoteProtocolError):
                    await client.get("/")
            assert len(backend.requests) == 1
    run(main())


def test_garbage_and_truncated_answers_are_errors() -> None:
    async def garbage(conn: int, n: int, raw: bytes) -> bytes | None:
        return b"SSH-2.0-OpenSSH\r\n\r\n"

    async def truncated(conn: int, n: int, raw: bytes) -> bytes | None:
        return b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"partial\"" + CLOSE

    async def main() -> None:
        for action in (garbage, truncated):
            async with Backend(action) as backend:
                up = Upstream(backend.url, timeout_s=2, max_connections=1)
                with pytest.raises(UpstreamError):
                    await up.call("GET", ["x"])
                await up.close()
    run(main())


def test_upstream_decodes_with_orjson_and_falls_back_for_python_json() -> None:
    async def nan(conn: int, n: int, raw: bytes) -> bytes:
        body = json.loads(raw.split(b"\r\n\r\n", 1)[1]) if raw.endswith(b"}") else None
        return ok(b'{"echo":%s,"x":NaN}' % json.dumps(body).encode())

    async def main() -> None:
        async with Backend(nan) as backend:
            up = Upstream(backend.url, timeout_s=2, max_connections=1)
            got = await up.call("POST", ["x"], json_body={"big": 2**70, "f": 0.5, "s": "é"})
            assert got["echo"] == {"big": 2**70, "f": 0.5, "s": "é"}
            assert got["x"] != got["x"]  # NaN, decoded by the standard library as before
            await up.close()
    run(main())


@pytest.mark.parametrize("base, token", [("", None), ("/prefix/v1", "secret")])
def test_upstream_hot_path_sends_the_bytes_httpx_request_would_send(base: str, token: str | None) -> None:
    """`Upstream.call` on `Http1Transport` skips httpx's Request/Response objects: the request bytes on
    the wire are those of the `httpx.Request` path, for every method, body presence, odd segment (unicode,
    reserved characters, empty), dot segment and query parameters (the last two keep going through httpx)."""
    import gzip

    async def echo(conn: int, n: int, raw: bytes) -> bytes:
        if b"/gz" in raw.split(b"\r\n", 1)[0]:
            body = gzip.compress(b'{"zipped":1}')
            return b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        return ok(b'{"n":%d}' % n)

    calls: list[tuple[str, list[str], dict[str, Any]]] = [
        ("POST", ["api", "v2", "tenants", "t", "collections", "c", "query"], {"json_body": {"q": [1.5, 2], "s": "é"}, "idempotent": True}),
        ("POST", ["add"], {"json_body": {"ids": ["a"]}}),
        ("POST", ["empty"], {}),
        ("GET", ["api", "v2", "heartbeat"], {}),
        ("DELETE", ["m", "ünï cødé", "a/b?c#d%e;f", ""], {}),
        ("PUT", ["x"], {"json_body": [1]}),
        ("GET", ["a", "..", "b", "."], {}),
        ("GET", ["memories"], {"params": {"user_id": "u 1", "x": "é&="}}),
        ("PATCH", ["p"], {}),
        ("GET", ["gz"], {}),
    ]

    async def main() -> None:
        async with Backend(echo) as backend:
            answers: list[list[Any]] = []
            sent: list[list[bytes]] = []
            for fast in (True, False):
                up = Upstream(backend.url + base, timeout_s=5, max_connections=1, auth_header="X-Chroma-Token" if token else None,
                              token=token)
                assert up._fast is not None
                if not fast:
                    up._fast = None  # every call through httpx.Request / handle_async_request
                start = len(backend.requests)
                answers.append([await up.call(m, segs, **kw) for m, segs, kw in calls])
                sent.append(backend.requests[start:])
                await up.close()
            assert sent[0] == sent[1] and len(sent[0]) == len(calls)
            assert [a for a in answers[0] if "zipped" not in a] == [a for a in answers[1] if "zipped" not in a]
            assert answers[0][-1] == answers[1][-1] == {"zipped": 1}
    run(main())


@pytest.mark.parametrize("segments", [
    ["a"], ["", ""], ["~-._AZaz09"], ["%2e", "%2E%2E"], ["..."], [".a", "a.", "..b"], ["é", "\u2028", "\x00"],
    [":x", "@", "[::1]", "?", "#", "/"], ["a" * 1000],
])
def test_hot_path_target_is_what_httpx_would_send(segments: list[str]) -> None:
    from urllib.parse import quote

    path = "/api/" + "/".join(quote(s, safe="") for s in segments)
    assert httpx.URL("http://127.0.0.1:8000" + path).raw_path == path.encode("ascii")


# -- every documented behaviour, on real sockets, for both transports ------------------------------------

async def _get(transport: Any, url: str, method: str = "GET", timeout: Any = 5.0, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(transport=transport, base_url=url, timeout=timeout) as client:
        return await client.request(method, "/", **kw)


@pytest.mark.parametrize("answer,reused", [
    (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}", False),  # HTTP/1.0 without keep-alive: closed after it
    (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n{}", True),
    (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}", False),
    (b"HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 2\r\n\r\n{}", False),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", True),
    (b"HTTP/1.1 204 No Content\r\n\r\n", False),  # no framing header: not reused (the transport's rule)
])
def test_http10_and_connection_close_decide_reuse(answer: bytes, reused: bool, Transport: Any) -> None:
    async def fixed(conn: int, n: int, raw: bytes) -> bytes:
        return answer

    async def main() -> None:
        async with Backend(fixed) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                for _ in range(3):
                    r = await client.get("/")
                    assert r.status_code in (200, 204) and r.content == (b"{}" if r.status_code == 200 else b"")
            assert backend.connections == (1 if reused else 3)
    run(main())


def test_eof_delimited_bodies(Transport: Any) -> None:
    """No Content-Length, not chunked: the body ends with the connection (RFC 9112 §6.3), even when it
    arrives in pieces; such a connection is never reused."""
    async def eof(conn: int, n: int, raw: bytes) -> list[Any]:
        return [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[1,", 0.05, b"2,", 0.05, b"3]", CLOSE]

    async def main() -> None:
        async with Backend(eof) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                assert (await client.get("/")).json() == [1, 2, 3]
                assert (await client.post("/", content=b"{}")).json() == [1, 2, 3]
            assert backend.connections == 2
            up = Upstream(backend.url, timeout_s=2, max_connections=1)
            assert await up.call("POST", ["q"], json_body={}) == [1, 2, 3]
            await up.close()
    run(main())


def test_head_does_not_wait_for_a_body(Transport: Any) -> None:
    async def head(conn: int, n: int, raw: bytes) -> bytes:
        assert raw.startswith(b"HEAD ")
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n"

    async def main() -> None:
        async with Backend(head) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url, timeout=1.0) as client:
                for _ in range(2):
                    r = await client.head("/")
                    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "500"
            assert backend.connections == 2  # the parser never saw the message end: the connection is closed
    run(main())


def test_upgrade_is_refused(Transport: Any) -> None:
    async def upgrade(conn: int, n: int, raw: bytes) -> bytes:
        return b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n\x81\x00"

    async def main() -> None:
        async with Backend(upgrade) as backend:
            with pytest.raises(httpx.RemoteProtocolError, match="upgrade"):
                await _get(Transport(), backend.url)
            up = Upstream(backend.url, timeout_s=2, max_connections=1)
            with pytest.raises(UpstreamError) as err:
                await up.call("GET", ["x"])
            assert err.value.status == 502
            await up.close()
    run(main())


def test_read_timeout_is_per_read_not_per_response(Transport: Any) -> None:
    """httpx's ``read`` timeout bounds each wait for data: an answer dribbling in with pauses shorter
    than it completes, however long the whole takes; a longer pause is `httpx.ReadTimeout` (504)."""
    async def dribble(conn: int, n: int, raw: bytes) -> list[Any]:
        # pauses 0.5 s clear of the 0.8 s read timeout either way (a loaded machine delays a wake-up)
        pause = 1.6 if b"/slow" in raw else 0.3
        return [b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", pause, b"[1,", pause, b"2,", pause, b"3", 0.1, b"]"]

    async def main() -> None:
        async with Backend(dribble) as backend:
            timeout = httpx.Timeout(5, read=0.8)
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url, timeout=timeout) as client:
                assert (await client.get("/")).json() == [1, 2, 3]  # ~1.0 s in all, no pause over 0.8 s
                with pytest.raises(httpx.ReadTimeout):
                    await client.get("/slow")
                assert (await client.get("/")).json() == [1, 2, 3]  # the timed-out connection was dropped
            assert backend.connections == 2
            up = Upstream(backend.url, timeout_s=0.8, max_connections=1)
            with pytest.raises(UpstreamTimeout):
                await up.call("GET", ["slow"])
            await up.close()
    run(main())


def test_write_timeout_and_write_error(Transport: Any) -> None:
    """A backend that reads nothing: a request body larger than the socket buffers cannot be sent —
    `httpx.WriteTimeout` (504) after the ``write`` timeout."""
    async def main() -> None:
        deaf_writers: list[asyncio.StreamWriter] = []

        async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            deaf_writers.append(writer)
            await asyncio.sleep(10)

        server = await asyncio.start_server(deaf, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            big = b"x" * (64 * 1024 * 1024)
            with pytest.raises(httpx.WriteTimeout):
                await _get(Transport(), url, "POST", timeout=httpx.Timeout(5, write=0.3), content=big)
            up = Upstream(url, timeout_s=0.3, max_connections=1)
            with pytest.raises(UpstreamTimeout):
                await up.call("POST", ["add"], json_body={"x": "y" * (64 * 1024 * 1024)})
            await up.close()
        finally:
            server.close()
            for writer in deaf_writers:  # the client's closed sockets still hold unsent bytes: reset them
                writer.transport.abort()
            await asyncio.sleep(0.05)
    run(main())


def test_pool_waits_for_a_free_connection(Transport: Any) -> None:
    """With every connection busy a request waits for one (within the ``pool`` timeout) and reuses it."""
    async def slow(conn: int, n: int, raw: bytes) -> list[Any]:
        return [0.05, ok(b'{"n":%d}' % n)]

    async def main() -> None:
        async with Backend(slow) as backend:
            async with httpx.AsyncClient(transport=Transport(max_connections=1), base_url=backend.url,
                                         timeout=httpx.Timeout(5, pool=2)) as client:
                answers = await asyncio.gather(*(client.get("/") for _ in range(4)))
            assert sorted(r.json()["n"] for r in answers) == [0, 1, 2, 3]
            assert backend.connections == 1
    run(main())


def test_a_pooled_connection_the_backend_closed_is_not_used(Transport: Any) -> None:
    """The backend closes a connection after answering, without saying so: the EOF is seen while it
    sits in the pool, so even a non-idempotent request goes on a new connection and succeeds."""
    async def answer_then_close(conn: int, n: int, raw: bytes) -> bytes:
        return ok(b'{"conn":%d}' % conn) + CLOSE

    async def main() -> None:
        async with Backend(answer_then_close) as backend:
            async with httpx.AsyncClient(transport=Transport(), base_url=backend.url) as client:
                for i in range(3):
                    assert (await client.post("/add", content=b"{}")).json() == {"conn": i}
                    await asyncio.sleep(0.05)
            assert backend.connections == 3 and len(backend.requests) == 3
    run(main())


_FIRST = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


@pytest.mark.parametrize("after", [
    b"HTTP/1.1 201 Created\r\ncontent-length: 13\r\nx-second: 1\r\n\r\n{\"late\":true}",  # a second, unrequested answer
    b"HTTP/1.1 200 OK\r\ncontent-le",  # the start of one
    b"garbage",
])
@pytest.mark.parametrize("apart", [False, True], ids=["same-read", "apart"])
def test_bytes_after_the_answer_are_never_part_of_an_answer(after: bytes, apart: bool) -> None:
    """Bytes after a complete answer that nothing asked for (the transport never pipelines), in the same read
    as the answer or arriving after it: the answer is returned as it was framed (status, headers, body: none of
    the bytes after it), and the connection is never used again, so the next request gets its own answer on a
    new one."""
    async def extra(conn: int, n: int, raw: bytes) -> list[Any]:
        return [_FIRST, 0.05, after] if apart else [_FIRST + after]

    async def main() -> None:
        async with Backend(extra) as backend:
            transport = Http1Transport()
            async with httpx.AsyncClient(transport=transport, base_url=backend.url) as client:
                for _ in range(2):
                    r = await client.get("/")
                    assert (r.status_code, r.headers.raw, r.content) == (
                        200, [(b"content-type", b"application/json"), (b"content-length", b"11")], b'{"ok":true}')
                    if apart:  # wait for the late bytes to reach the transport, then the next request
                        async with asyncio.timeout(10):
                            while not _noticed(transport):
                                await asyncio.sleep(0.005)
            assert backend.connections == 2 and len(backend.requests) == 2
    run(main())


def _noticed(transport: Any) -> bool:
    """Whether the idle connection of `transport` has seen bytes after its answer (today's transport: `dirty`;
    the reference: bytes in its StreamReader's buffer), or no connection is idle (it was closed)."""
    if not transport._idle:
        return True
    conn = transport._idle[-1]
    return bool(getattr(conn, "dirty", False) or getattr(getattr(conn, "reader", None), "_buffer", b""))


def test_chunked_body_over_the_cap_and_malformed_chunks(Transport: Any) -> None:
    async def chunks(conn: int, n: int, raw: bytes) -> list[Any]:
        if b"/bad" in raw:
            return [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n"]
        piece = b"400\r\n" + b"a" * 1024 + b"\r\n"
        return [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"] + [piece] * 8 + [b"0\r\n\r\n"]

    async def main() -> None:
        async with Backend(chunks) as backend:
            async with httpx.AsyncClient(transport=Transport(max_response_bytes=4096), base_url=backend.url) as client:
                with pytest.raises(ResponseTooLarge):
                    await client.get("/")
                with pytest.raises(httpx.RemoteProtocolError):
                    await client.get("/bad")
            async with httpx.AsyncClient(transport=Transport(max_response_bytes=8192), base_url=backend.url) as client:
                assert (await client.get("/")).content == b"a" * 8192
                assert (await client.get("/")).content == b"a" * 8192
            assert backend.connections == 3
    run(main())


def _reference_instrument_upstream(upstream: Any, metrics: Any) -> None:
    """`sidecar.metrics.instrument_upstream` before h19u (``labels()`` per call), the reference below."""
    import time
    from functools import wraps

    call = upstream.call

    @wraps(call)
    async def timed(method: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        outcome = "error"
        try:
            result = await call(method, *args, **kwargs)
            outcome = "ok"
            return result
        finally:
            metrics.backend.labels(method, outcome).observe(time.perf_counter() - t0)

    upstream.call = timed


def test_upstream_timing_wrapper_counts_as_the_reference() -> None:
    """The backend-call histogram (bound label children, one observe) holds the series and counts the
    per-call ``labels()`` wrapper recorded (bucket placement depends on timing), for answers, errors and cancellations, and the
    wrapper returns and raises what the call did."""
    from sidecar.metrics import Metrics, instrument_upstream

    class Calls:
        async def call(self, method: str, segments: list[str], **kw: Any) -> Any:
            if segments[0] == "fail":
                raise UpstreamError("backend unreachable")
            if segments[0] == "cancel":
                raise asyncio.CancelledError()
            if segments[0] == "boom":
                raise RuntimeError("x")
            return {"m": method, "kw": kw}

    script = [("GET", ["a"]), ("POST", ["fail"]), ("POST", ["a"]), ("DELETE", ["cancel"]), ("GET", ["a"]),
              ("PUT", ["boom"]), ("POST", ["fail"]), ("GET", ["a"])]

    def samples(metrics: Metrics) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                      for fam in metrics.registry.collect() if fam.name == "memwarden_backend_request_duration_seconds"
                      for s in fam.samples if s.name.endswith("_count") or s.labels.get("le") == "+Inf")

    async def drive(wrap: Any) -> tuple[list[Any], Metrics]:
        metrics, up = Metrics(), Calls()
        wrap(up, metrics)
        seen: list[Any] = []
        for method, segs in script:
            try:
                seen.append(await up.call(method, segs, json_body={"k": 1}))
            except (UpstreamError, RuntimeError, asyncio.CancelledError) as exc:
                seen.append(type(exc).__name__)
        return seen, metrics

    new_seen, new_metrics = asyncio.run(drive(instrument_upstream))
    ref_seen, ref_metrics = asyncio.run(drive(_reference_instrument_upstream))
    assert new_seen == ref_seen and new_seen[0] == {"m": "GET", "kw": {"json_body": {"k": 1}}}
    assert samples(new_metrics) == samples(ref_metrics)
    counts = {dict(labels)["method"] + "/" + dict(labels)["outcome"]: v for name, labels, v in samples(new_metrics)
              if name.endswith("_count")}
    assert counts == {"GET/ok": 3, "POST/error": 2, "POST/ok": 1, "DELETE/error": 1, "PUT/error": 1}


def test_a_connection_with_bytes_nobody_asked_for_is_not_reused(Transport: Any) -> None:
    """Bytes arriving after a complete answer, while the connection sits in the pool: the connection is
    dropped, the next request goes on a new one and gets its own answer. The backend sends the late bytes only
    once the client has its answer, and the next request waits until the transport has seen them (no timed
    race: under load, pauses alone could let them arrive with the answer or after the next request)."""
    async def main() -> None:
        go = [asyncio.Event() for _ in range(3)]

        async def late_junk(conn: int, n: int, raw: bytes) -> list[Any]:
            return [ok(b'{"conn":%d}' % conn), go[conn], b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]

        async with Backend(late_junk) as backend:
            transport = Transport()
            async with httpx.AsyncClient(transport=transport, base_url=backend.url) as client:
                for i in range(3):
                    assert (await client.get("/")).json() == {"conn": i}
                    go[i].set()
                    async with asyncio.timeout(10):
                        while not _noticed(transport):
                            await asyncio.sleep(0.005)
            assert backend.connections == 3
    run(main())


def test_read_deadline_across_exchanges_on_one_connection(Transport: Any) -> None:
    """The read deadline belongs to the exchange waiting, whatever timer an earlier exchange on the same
    pooled connection left running: a shorter read timeout after a longer one still ends a stalled answer,
    a timer that fired while the connection sat idle does not end the next exchange early, and an answer
    dribbling in with pauses under the read timeout completes on a reused connection."""
    async def script(conn: int, n: int, raw: bytes) -> Any:
        if b"/hang" in raw:
            return [5.0, ok()]
        if b"/dribble" in raw:
            return [b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", 0.1, b"[1,", 0.1, b"2,", 0.1, b"3]"]
        return ok()

    async def main() -> None:
        async with Backend(script) as backend:
            async with httpx.AsyncClient(transport=Transport(max_connections=1), base_url=backend.url) as client:
                assert (await client.get("/", timeout=httpx.Timeout(30))).json() == {"ok": True}
                with pytest.raises(httpx.ReadTimeout):  # 0.3 s, not the 30 s of the exchange before
                    await asyncio.wait_for(client.get("/hang", timeout=httpx.Timeout(30, read=0.3)), 4.0)
                assert (await client.get("/", timeout=httpx.Timeout(30, read=0.6))).json() == {"ok": True}
                await asyncio.sleep(0.7)  # the connection's timer fires with nothing waiting
                assert (await client.get("/dribble", timeout=httpx.Timeout(30, read=0.6))).json() == [1, 2, 3]
                assert (await client.get("/dribble", timeout=httpx.Timeout(30, read=0.6))).json() == [1, 2, 3]
                with pytest.raises(httpx.ReadTimeout):
                    await asyncio.wait_for(client.get("/hang", timeout=httpx.Timeout(30, read=0.3)), 4.0)
                assert (await client.get("/", timeout=httpx.Timeout(30, read=None))).json() == {"ok": True}
            assert backend.connections == 3  # the two timed-out connections were dropped, the others reused
    run(main())


def test_closing_a_connection_stops_its_read_timer() -> None:
    async def main() -> None:
        async with Backend(always_ok) as backend:
            transport = Http1Transport(max_connections=1)
            async with httpx.AsyncClient(transport=transport, base_url=backend.url, timeout=30) as client:
                await client.get("/")
                (conn,) = transport._idle
                assert conn.timer is not None  # left running for the next exchange
            assert conn.timer is None
    run(main())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.sampled_from([None, 0.0, 0.01, 0.03, 0.06]), st.sampled_from([5.0, 0.02])),
                     min_size=1, max_size=7))
def test_pool_slots_are_never_lost_nor_exceeded(plan: list[tuple[float | None, float]], Transport: Any) -> None:
    """Requests on a pool of two connections, some cancelled at some point (waiting for a slot, or during
    the exchange), some with a pool timeout shorter than the backend's answer: never more than two
    exchanges at once, every request answered, cancelled or refused with `httpx.PoolTimeout`, and
    afterwards both slots free (two requests at once both get one)."""
    async def slow(conn: int, n: int, raw: bytes) -> list[Any]:
        return [0.04, ok()]

    async def main() -> None:
        async with Backend(slow) as backend:
            transport = Transport(max_connections=2)
            exchanges, most = [0], [0]
            inner = transport._exchange

            async def counted(*args: Any) -> Any:
                exchanges[0] += 1
                most[0] = max(most[0], exchanges[0])
                try:
                    return await inner(*args)
                finally:
                    exchanges[0] -= 1
            transport._exchange = counted
            async with httpx.AsyncClient(transport=transport, base_url=backend.url) as client:
                tasks = [asyncio.ensure_future(client.get("/", timeout=httpx.Timeout(5, pool=pool))) for _, pool in plan]
                for (cancel_after, _), task in zip(plan, tasks):
                    if cancel_after is not None:
                        asyncio.get_running_loop().call_later(cancel_after, task.cancel)
                for task in tasks:
                    try:
                        assert (await task).json() == {"ok": True}
                    except (asyncio.CancelledError, httpx.PoolTimeout):
                        pass
                again = await asyncio.gather(*(client.get("/", timeout=httpx.Timeout(5, pool=2)) for _ in range(2)))
                assert [r.json() for r in again] == [{"ok": True}] * 2
                if Transport is Http1Transport:
                    assert transport._free == 2 and not transport._waiters
            assert most[0] <= 2
    run(main())


def test_a_slot_handed_to_a_request_cancelled_before_it_resumes_is_passed_on() -> None:
    """`Http1Transport._release` hands the slot to the first waiter; cancelled in the same loop turn (before
    it runs), that waiter gives the slot back; a waiter cancelled before being handed one leaves the queue."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport = Http1Transport(max_connections=1)
        transport._loop, transport._free = loop, 0  # the one slot is in use
        first = asyncio.ensure_future(transport._acquire(loop, None, None))
        second = asyncio.ensure_future(transport._acquire(loop, None, None))
        await asyncio.sleep(0)
        assert len(transport._waiters) == 2
        second.cancel()  # waiting, no slot yet: leaves the queue
        await asyncio.sleep(0)
        assert len(transport._waiters) == 1
        transport._release()  # the slot goes to `first` ...
        first.cancel()  # ... cancelled before it resumes: the slot is free again
        with pytest.raises(asyncio.CancelledError):
            await first
        assert transport._free == 1 and not transport._waiters
        third = asyncio.ensure_future(transport._acquire(loop, 0.05, None))
        with pytest.raises(httpx.PoolTimeout):  # nobody releases: the pool timeout
            await third
        assert transport._free == 1 and not transport._waiters
    run(main())


class _FreshParserTransport(Http1Transport):
    """`Http1Transport` as it was before the parser was kept per connection (h24s): a new `_Parsed` and
    httptools parser for every exchange (the kept one is dropped before each)."""

    async def _exchange(self, request: Any, method: str, conn: Any, *args: Any) -> Any:
        conn.spare = None
        return await super()._exchange(request, method, conn, *args)


_SECOND = b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\nx-second: 1\r\n\r\n[12]"
# (name, answer bytes or None to close without answering, whether it may be cut into pieces): answers to GET/POST
_ANSWERS: list[tuple[str, bytes | None, bool]] = [
    ("ok", ok(), True),
    ("ok-big", ok(b'{"v":"' + b"x" * 3000 + b'"}'), True),
    ("chunked", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\nt: 1\r\n\r\n", True),
    ("204", b"HTTP/1.1 204 No Content\r\nx-a: 1\r\n\r\n", True),
    ("close", b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}" + CLOSE, True),
    ("http10", b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}" + CLOSE, True),
    ("http10-keep", b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n{}", True),
    ("eof-body", b"HTTP/1.1 200 OK\r\n\r\n[1,2]" + CLOSE, True),
    ("404", b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nnot found", True),
    ("extra-whole", ok() + _SECOND, False),  # a second, unrequested answer in the same segment
    ("extra-part", ok() + b"HTTP/1.1 200 OK\r\ncontent-le", False),  # and the start of one
    ("extra-junk", ok() + b"junk", False),
    ("continue", b"HTTP/1.1 100 Continue\r\n\r\n" + ok(), True),
    ("early-hints", b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n" + ok(), True),
    ("garbage", b"NOT HTTP AT ALL\r\n\r\n", False),
    ("truncated", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}" + CLOSE, False),
    ("none", None, False),
]
# Answers the reference took wrongly (issue 34): bytes after the answer (merged into it, or the connection reused),
# informational answers (their headers merged into the final answer's, or one arriving alone taken as the answer).
_CHANGED_SINCE_REFERENCE = {answer for name, answer, _ in _ANSWERS if name.startswith("extra-") or name in ("continue", "early-hints")}
# answers to HEAD: headers only, whatever their Content-Length says
_HEAD_ANSWERS: list[tuple[str, bytes | None, bool]] = [
    ("head", b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n", True),
    ("head-0", b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", True),
    ("head-204", b"HTTP/1.1 204 No Content\r\n\r\n", True),
    ("head-close", b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 5\r\n\r\n" + CLOSE, True),
    ("none", None, False),
]


@st.composite
def _exchanges(draw: Any) -> list[tuple[str, bytes | None, list[int]]]:
    """A sequence of (method, answer, cut points): each answer cut into pieces at the cut points (when it may be)."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        method = draw(st.sampled_from(["GET", "POST", "HEAD"]))
        _, answer, cuttable = draw(st.sampled_from(_HEAD_ANSWERS if method == "HEAD" else _ANSWERS))
        cuts: list[int] = []
        if cuttable and answer is not None:
            size = len(answer.removesuffix(CLOSE))
            cuts = sorted(set(draw(st.lists(st.integers(1, max(1, size - 1)), max_size=2))))
        out.append((method, answer, cuts))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(plan=_exchanges())
def test_kept_parser_answers_as_a_fresh_parser_per_exchange(plan: list[tuple[str, bytes | None, list[int]]]) -> None:
    """The parser kept per connection (reset for each exchange when it stands at a message boundary) gives
    every request the answer — status, raw headers, body — or the error a new parser per exchange gives,
    on the same connections (the backend counts them and the requests, retries included), for every
    sequence of answers: framed by length or chunks, empty, HTTP/1.0, closing, delimited by the end of the
    connection, followed by bytes nobody asked for (a whole answer, part of one, junk), informational,
    garbage, truncated, none; HEAD answers with a length and no body; each answer cut into pieces that
    arrive apart. Against the transport before the change and, for plans without the answers it took wrongly
    (`_CHANGED_SINCE_REFERENCE`, tested on their own), the pre-h19u reference."""
    async def outcomes(transport_cls: Any) -> list[Any]:
        answers = [a for _, a, _ in plan]
        cuts = [c for _, _, c in plan]
        served = [0]

        async def scripted(conn: int, n: int, raw: bytes) -> Any:
            i = served[0]
            served[0] += 1
            if i >= len(answers) or answers[i] is None:
                return None
            answer = answers[i]
            closing = answer.endswith(CLOSE)  # type: ignore[union-attr]
            data = answer.removesuffix(CLOSE)  # type: ignore[union-attr]
            pieces: list[Any] = []
            last = 0
            for cut in cuts[i]:
                pieces += [data[last:cut], 0.005]
                last = cut
            pieces.append(data[last:] + (CLOSE if closing else b""))
            return pieces

        seen: list[Any] = []
        async with Backend(scripted) as backend:
            async with httpx.AsyncClient(transport=transport_cls(), base_url=backend.url, timeout=5.0) as client:
                for method, _, _ in plan:
                    try:
                        r = await client.request(method, "/x", content=b'{"a":1}' if method == "POST" else None)
                        seen.append((r.status_code, r.headers.raw, r.content))
                    except httpx.HTTPError as exc:
                        seen.append(type(exc).__name__)
            seen.append((backend.connections, len(backend.requests)))
        return seen

    new = run(outcomes(Http1Transport))
    assert new == run(outcomes(_FreshParserTransport))
    if not any(answer in _CHANGED_SINCE_REFERENCE for _, answer, _ in plan):
        assert new == run(outcomes(http1_reference.Http1Transport))


def test_an_idle_connection_holds_no_answer() -> None:
    """The parser kept by a pooled connection holds nothing of the last answer (its body could be large), and
    the next exchange on it starts from empty headers and body."""
    async def big(conn: int, n: int, raw: bytes) -> bytes:
        return ok(b'"' + b"y" * 100_000 + b'"') if n == 0 else ok()

    async def main() -> None:
        async with Backend(big) as backend:
            transport = Http1Transport()
            async with httpx.AsyncClient(transport=transport, base_url=backend.url) as client:
                assert len((await client.get("/")).content) == 100_002
                spare = transport._idle[0].spare
                assert spare is not None and spare.body is None and spare.headers is None
                assert (await client.get("/")).json() == {"ok": True}
                assert transport._idle[0].spare is spare and spare.body is None
            assert backend.connections == 1
    run(main())


# -- issue 34: late bytes on the socket, informational answers, decoded size, TLS ------------------------------


class ThreadedBackend:
    """A blocking HTTP/1.1 server (GET only) in threads of its own, not on the event loop: bytes it sends reach
    the client's socket while the client's loop does not run. Answers ``{"conn": c, "n": n}``; on its first
    connection, after the first answer, it waits for `late` and then sends an answer nobody asked for."""

    LATE = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n{"late":true}'

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.late = threading.Event()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.late.set()
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock, self.connections - 1), daemon=True).start()

    def _serve(self, sock: socket.socket, conn: int) -> None:
        buffered, n = b"", 0
        with sock:
            try:
                while True:
                    while b"\r\n\r\n" not in buffered:
                        data = sock.recv(65536)
                        if not data:
                            return
                        buffered += data
                    _, _, buffered = buffered.partition(b"\r\n\r\n")
                    sock.sendall(ok(b'{"conn":%d,"n":%d}' % (conn, n)))
                    if conn == 0 and n == 0:
                        self.late.wait(10)
                        sock.sendall(self.LATE)
                    n += 1
            except OSError:  # the client closed the connection
                return


@pytest.mark.parametrize("path", ["hot", "httpx-request"])
def test_late_bytes_still_on_the_socket_are_never_the_next_answer(path: str) -> None:
    """The backend sends an answer nobody asked for after a complete one, and it is on the pooled connection's
    socket, not yet read by the event loop, when the next request takes a connection: that connection is
    closed (one ``poll`` on reuse) and the request gets its own answer on a new one, never the late bytes."""
    async def main() -> None:
        backend = ThreadedBackend()
        up = Upstream(backend.url, timeout_s=10, max_connections=1)
        params = {"q": "1"} if path == "httpx-request" else None
        try:
            assert await up.call("GET", ["a"], params=params) == {"conn": 0, "n": 0}
            (conn,) = up._transport._idle  # type: ignore[attr-defined]
            backend.late.set()
            # Block the loop (no await) until the late answer is readable on that socket: the loop has not read it.
            poller = select.poll()
            poller.register(conn.transport.get_extra_info("socket").fileno(), select.POLLIN)
            assert poller.poll(10_000) and not conn.dirty
            assert await up.call("GET", ["a"], params=params) == {"conn": 1, "n": 0}
            assert backend.connections == 2
        finally:
            await up.close()
            backend.close()
    run(main())


@pytest.mark.parametrize("interim", [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nx-progress: 1\r\n\r\n",
], ids=["100", "103", "100-102"])
def test_informational_answers_are_not_the_answer(interim: bytes) -> None:
    """A 1xx answer (but 101) is not final, whether or not it arrives apart from the final answer: skipped, its
    headers dropped, the final answer returned; the connection is reused after it."""
    final = ok(b'{"final":true}')

    async def answer(conn: int, n: int, raw: bytes) -> list[Any]:
        return [interim, 0.05, final] if n % 2 == 0 else [interim + final]

    async def main() -> None:
        async with Backend(answer) as backend:
            up = Upstream(backend.url, timeout_s=10, max_connections=1)
            assert await up.call("POST", ["add"], json_body={"a": 1}) == {"final": True}
            assert await up.call("POST", ["add"], json_body={"a": 1}) == {"final": True}
            await up.close()
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
                for _ in range(2):
                    r = await client.post("/add", content=b"{}")
                    assert (r.status_code, r.headers.raw, r.content) == (
                        200, [(b"content-type", b"application/json"), (b"content-length", b"14")], b'{"final":true}')
            assert backend.connections == 2 and len(backend.requests) == 4
    run(main())


def test_endless_informational_answers_are_refused() -> None:
    from sidecar.stages.http1 import MAX_INFORMATIONAL

    async def answer(conn: int, n: int, raw: bytes) -> bytes:
        return b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INFORMATIONAL + 1) + ok()

    async def main() -> None:
        async with Backend(answer) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
                with pytest.raises(httpx.RemoteProtocolError, match="informational"):
                    await client.get("/")
    run(main())


CAP = 1024 * 1024


def _gzip_bomb(decoded_mib: int) -> bytes:
    """A gzip stream of the JSON string ``"aaa…"`` of `decoded_mib` MiB, compressed without holding it."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"a" * CAP
    parts = [packer.compress(b'"')] + [packer.compress(block) for _ in range(decoded_mib)]
    return b"".join(parts + [packer.compress(b'"'), packer.flush()])


@pytest.mark.parametrize("path", ["hot", "httpx-request", "other-transport"])
def test_a_compressed_answer_is_decoded_only_up_to_the_cap(path: str) -> None:
    """A gzip answer of 32 KiB that inflates to 32 MiB, under a 1 MiB response cap: refused (502 naming the cap)
    without being inflated beyond the cap — the memory allocated meanwhile stays a few MiB; an answer within the
    cap is decoded. On every path: the hot path, `httpx.Request`s through `Http1Transport`, another transport
    whose response streams the body."""
    bomb = _gzip_bomb(32)
    small = gzip.compress(b'{"a":[1,2,3]}')
    assert len(bomb) < CAP

    async def answer(conn: int, n: int, raw: bytes) -> bytes:
        body = bomb if b"/bomb" in raw else small
        return b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    def streamed(request: httpx.Request) -> httpx.Response:
        body = bomb if "/bomb" in request.url.path else small
        return httpx.Response(200, headers={"content-encoding": "gzip"}, stream=httpx.ByteStream(body))

    async def main() -> None:
        async with Backend(answer) as backend:
            params = {"q": "1"} if path == "httpx-request" else None
            transport = httpx.MockTransport(streamed) if path == "other-transport" else None
            up = Upstream(backend.url, timeout_s=10, max_connections=1, max_response_bytes=CAP, transport=transport)
            assert await up.call("GET", ["small"], params=params) == {"a": [1, 2, 3]}
            tracemalloc.start()
            try:
                with pytest.raises(UpstreamError, match="MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES") as err:
                    await up.call("GET", ["bomb"], params=params)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert str(CAP) in err.value.message
            assert peak < 8 * CAP, peak  # inflated to the cap at most, not to 32 MiB
            assert await up.call("GET", ["small"], params=params) == {"a": [1, 2, 3]}
            await up.close()
    run(main())


def test_decode_body_encodings_and_the_cap_boundary() -> None:
    from sidecar.stages.http1 import UnsupportedEncoding, decode_body

    data = b'{"k":"' + b"v" * 1000 + b'"}'
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    raw_deflate = raw.compress(data) + raw.flush()
    enc = [(b"Content-Encoding", b"gzip")]
    assert decode_body(enc, gzip.compress(data), len(data)) == data  # exactly the cap
    with pytest.raises(ResponseTooLarge):
        decode_body(enc, gzip.compress(data), len(data) - 1)
    assert decode_body([(b"content-encoding", b"deflate")], zlib.compress(data), 10_000) == data
    assert decode_body([(b"content-encoding", b"deflate")], raw_deflate, 10_000) == data  # raw, as some servers send
    assert decode_body([(b"content-encoding", b"x-gzip")], gzip.compress(data) + gzip.compress(b"!"), 10_000) == data + b"!"
    chained = gzip.compress(zlib.compress(data))  # deflate applied first, then gzip
    assert decode_body([(b"content-encoding", b"deflate"), (b"content-encoding", b"gzip")], chained, 10_000) == data
    assert decode_body([(b"content-encoding", b"deflate, gzip")], chained, 10_000) == data
    assert decode_body([(b"content-encoding", b"identity")], data, 10_000) == data
    assert decode_body(enc, b"", 10) == b""
    with pytest.raises(httpx.DecodingError, match="truncated"):
        decode_body(enc, gzip.compress(data)[:-20], 10_000)
    with pytest.raises(httpx.DecodingError, match="corrupt"):
        decode_body(enc, b"not gzip at all", 10_000)
    with pytest.raises(UnsupportedEncoding, match="'br'"):
        decode_body([(b"content-encoding", b"br")], data, 10_000)


@pytest.mark.parametrize("coding", ["br", "truncated"])
def test_an_answer_that_cannot_be_decoded_is_a_502(coding: str) -> None:
    body = b"\x0b\x02\x80{}\x03" if coding == "br" else gzip.compress(b'{"a":1}')[:-4]

    async def answer(conn: int, n: int, raw: bytes) -> bytes:
        name = b"br" if coding == "br" else b"gzip"
        return b"HTTP/1.1 200 OK\r\ncontent-encoding: %s\r\ncontent-length: %d\r\n\r\n%s" % (name, len(body), body)

    async def main() -> None:
        async with Backend(answer) as backend:
            up = Upstream(backend.url, timeout_s=10, max_connections=1)
            with pytest.raises(UpstreamError, match="not decodable"):
                await up.call("GET", ["x"])
            await up.close()
    run(main())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.tls_certs import make_certs

    return make_certs(tmp_path_factory.mktemp("tls"))


def test_https_backend_round_trip_and_reuse(certs: Any) -> None:
    """An ``https://`` backend (a real TLS server, certificate issued by a CA given as the bundle): answers on
    the hot path, through `httpx.Request`s and through httpx's client, one connection reused throughout."""
    from sidecar.stages.http1 import client_tls_context

    async def main() -> None:
        async with Backend(always_ok, ssl=certs.server_context(), host="localhost") as backend:
            context = client_tls_context(certs.ca)
            up = Upstream(backend.url, timeout_s=10, max_connections=1, ssl_context=context)
            assert await up.call("GET", ["a"]) == {"ok": True}
            assert await up.call("POST", ["b"], json_body={"x": 1}) == {"ok": True}
            assert await up.call("GET", ["a"], params={"q": "1"}) == {"ok": True}
            await up.close()
            assert backend.connections == 1
            async with httpx.AsyncClient(transport=Http1Transport(ssl_context=context), base_url=backend.url) as client:
                assert (await client.get("/")).json() == {"ok": True}
                assert (await client.get("/")).json() == {"ok": True}
            assert backend.connections == 2
            assert backend.requests[0].startswith(b"GET /a HTTP/1.1\r\n")
    run(main())


@pytest.mark.parametrize("case", ["unknown-ca", "system-trust", "host-name"])
def test_an_https_backend_whose_certificate_does_not_verify_is_a_502_naming_tls(certs: Any, case: str) -> None:
    """A certificate from a CA not in the bundle, the system trust store (no bundle) for a private CA, a
    certificate naming another host: nothing is sent, the answer is a 502 saying TLS verification failed."""
    from sidecar.stages.http1 import client_tls_context

    cert, key = {"unknown-ca": (certs.stranger_cert, certs.stranger_key), "system-trust": (None, None),
                 "host-name": (certs.other_name_cert, certs.other_name_key)}[case]
    context = None if case == "system-trust" else client_tls_context(certs.ca)

    async def main() -> None:
        async with Backend(always_ok, ssl=certs.server_context(cert, key), host="localhost") as backend:
            up = Upstream(backend.url, timeout_s=10, max_connections=1, ssl_context=context)
            for params in (None, {"q": "1"}):
                with pytest.raises(UpstreamError, match="TLS verification failed") as err:
                    await up.call("GET", ["a"], params=params)
                assert "MEMWARDEN_BACKEND_CA_BUNDLE" in err.value.message
            await up.close()
            assert backend.requests == []
    run(main())


def test_https_backend_with_mutual_tls(certs: Any) -> None:
    """A backend that requires a client certificate: answered with one (`client_tls_context`), a 502 without."""
    from sidecar.stages.http1 import client_tls_context

    async def main() -> None:
        async with Backend(always_ok, ssl=certs.server_context(require_client_cert=True), host="localhost") as backend:
            up = Upstream(backend.url, timeout_s=10, max_connections=1,
                          ssl_context=client_tls_context(certs.ca, certs.client_cert, certs.client_key))
            assert await up.call("GET", ["a"]) == {"ok": True}
            await up.close()
            up = Upstream(backend.url, timeout_s=10, max_connections=1, ssl_context=client_tls_context(certs.ca))
            with pytest.raises(UpstreamError):
                await up.call("GET", ["a"])
            await up.close()
            assert len(backend.requests) == 1
    run(main())


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.upper().startswith("MEMWARDEN_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env
    return monkeypatch


def test_backend_tls_settings_are_checked_at_start_up(certs: Any, clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A missing or unreadable CA bundle or client certificate, a key without its certificate, TLS files for an
    ``http://`` backend: refused when the settings are made, naming the variable; good files give the context
    the app's backend client uses (verification and host names on)."""
    from sidecar.config import ConfigError, backend_tls_context, load_settings

    env = clean_env
    env.setenv("MEMWARDEN_BACKEND_URL", "https://localhost:8443")
    env.setenv("MEMWARDEN_BACKEND_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"MEMWARDEN_BACKEND_CA_BUNDLE=.*missing\.pem: no such file"):
        load_settings()
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    env.setenv("MEMWARDEN_BACKEND_CA_BUNDLE", str(tmp_path / "junk.pem"))
    with pytest.raises(ConfigError, match="MEMWARDEN_BACKEND_CA_BUNDLE=.*not a PEM file of CA certificates"):
        load_settings()
    env.setenv("MEMWARDEN_BACKEND_CA_BUNDLE", str(certs.ca))
    env.setenv("MEMWARDEN_BACKEND_CLIENT_KEY", str(certs.client_key))
    with pytest.raises(ConfigError, match="MEMWARDEN_BACKEND_CLIENT_KEY needs MEMWARDEN_BACKEND_CLIENT_CERT"):
        load_settings()
    env.setenv("MEMWARDEN_BACKEND_CLIENT_CERT", str(certs.ca))  # a certificate, but not the key's
    with pytest.raises(ConfigError, match="MEMWARDEN_BACKEND_CLIENT_CERT=.*not a PEM certificate and its key"):
        load_settings()
    env.setenv("MEMWARDEN_BACKEND_CLIENT_CERT", str(certs.client_cert))
    settings = load_settings()
    context = backend_tls_context(settings)
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    env.setenv("MEMWARDEN_BACKEND_URL", "http://localhost:8000")
    with pytest.raises(ConfigError, match="is for an https:// backend"):
        load_settings()
    for name in ("MEMWARDEN_BACKEND_CA_BUNDLE", "MEMWARDEN_BACKEND_CLIENT_CERT", "MEMWARDEN_BACKEND_CLIENT_KEY"):
        env.delenv(name)
    assert backend_tls_context(load_settings()) is None
    env.setenv("MEMWARDEN_BACKEND_URL", "https://localhost:8443")
    context = backend_tls_context(load_settings())  # no bundle: the system's trust store
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
