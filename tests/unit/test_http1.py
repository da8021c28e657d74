"""The forward stage's HTTP/1.1 transport (`sidecar.stages.http1`) against a real local socket server:
keep-alive reuse, chunked bodies, the response size cap, timeouts, connections the backend closed
(retried only for idempotent requests, never re-sent otherwise), and the error mapping of
`sidecar.stages.forward.Upstream` (502/504)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

import httpx
import pytest

from sidecar.errors import UpstreamError, UpstreamTimeout
from sidecar.stages.forward import Upstream
from sidecar.stages.http1 import Http1Transport, ResponseTooLarge

CLOSE = b"<close>"  # an answer ending with this is followed by closing the connection
Action = Callable[[int, int, bytes], Awaitable[bytes | None]]


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


class Backend:
    """A scripted HTTP/1.1 server on 127.0.0.1. `action(connection number, request number on it, raw
    request)` returns the bytes to answer, or None to close the connection without answering."""

    def __init__(self, action: Action) -> None:
        self.action = action
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> "Backend":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
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
                writer.write(answer)
                await writer.drain()
                if answer.endswith(CLOSE):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def always_ok(conn: int, n: int, raw: bytes) -> bytes:
    return ok()


def test_round_trip_and_keep_alive_reuse() -> None:
    async def main() -> None:
        async with Backend(always_ok) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
                for _ in range(3):
                    r = await client.post("/api/x", content=b'{"q":1}', headers={"content-type": "application/json"})
                    assert r.status_code == 200 and r.json() == {"ok": True}
            assert backend.connections == 1
            first = backend.requests[0]
            assert first.startswith(b"POST /api/x HTTP/1.1\r\n") and first.endswith(b'\r\n\r\n{"q":1}')
            assert b"content-length: 7" in first.lower()
    run(main())


def test_chunked_response_is_decoded() -> None:
    async def chunked(conn: int, n: int, raw: bytes) -> bytes:
        return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                b"4\r\n[1,2\r\n3\r\n,3]\r\n0\r\n\r\n")

    async def main() -> None:
        async with Backend(chunked) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
                assert (await client.get("/")).json() == [1, 2, 3]
                assert (await client.get("/")).json() == [1, 2, 3]
            assert backend.connections == 1
    run(main())


def test_connection_close_and_expiry_are_not_reused() -> None:
    async def closing(conn: int, n: int, raw: bytes) -> bytes:
        return ok(extra=b"connection: close\r\n")

    async def main() -> None:
        async with Backend(closing) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
                await client.get("/")
                await client.get("/")
            assert backend.connections == 2
        async with Backend(always_ok) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(keepalive_expiry=0), base_url=backend.url) as client:
                await client.get("/")
                await client.get("/")
            assert backend.connections == 2
    run(main())


def test_response_size_cap() -> None:
    async def big(conn: int, n: int, raw: bytes) -> bytes:
        return ok(b'"' + b"x" * 5000 + b'"')

    async def main() -> None:
        async with Backend(big) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(max_response_bytes=4096), base_url=backend.url) as client:
                with pytest.raises(ResponseTooLarge):
                    await client.get("/")
            async with httpx.AsyncClient(transport=Http1Transport(max_response_bytes=5002), base_url=backend.url) as client:
                assert len((await client.get("/")).json()) == 5000
            up = Upstream(backend.url, timeout_s=5, max_connections=2, max_response_bytes=4096)
            with pytest.raises(UpstreamError) as err:
                await up.call("GET", ["x"])
            assert err.value.status == 502 and "too large" in err.value.message
            await up.close()
    run(main())


def test_timeouts_map_to_504_and_connect_errors_to_502() -> None:
    async def hang(conn: int, n: int, raw: bytes) -> bytes:
        await asyncio.sleep(30)
        return ok()

    async def main() -> None:
        async with Backend(hang) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url, timeout=0.2) as client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.get("/")
            up = Upstream(backend.url, timeout_s=0.2, max_connections=1)
            with pytest.raises(UpstreamTimeout) as err:
                await up.call("POST", ["q"], json_body={"a": 1})
            assert err.value.status == 504
            await up.close()
            # One connection, busy with a hanging request: the next waits for the pool and times out.
            async with httpx.AsyncClient(transport=Http1Transport(max_connections=1), base_url=backend.url,
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
def test_stale_connection_is_retried_for_idempotent_requests(method: str, extensions: Any) -> None:
    async def main() -> None:
        async with Backend(close_second_request) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
                assert (await client.request(method, "/", content=b"{}", extensions=extensions)).json() == {"conn": 0}
                assert (await client.request(method, "/", content=b"{}", extensions=extensions)).json() == {"conn": 1}
            assert backend.connections == 2 and len(backend.requests) == 3
    run(main())


def test_stale_connection_is_never_retried_for_a_non_idempotent_request() -> None:
    async def main() -> None:
        async with Backend(close_second_request) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
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


def test_a_fresh_connection_closed_without_answer_is_not_retried() -> None:
    async def close_always(conn: int, n: int, raw: bytes) -> bytes | None:
        return None

    async def main() -> None:
        async with Backend(close_always) as backend:
            async with httpx.AsyncClient(transport=Http1Transport(), base_url=backend.url) as client:
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
