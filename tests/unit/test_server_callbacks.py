"""The guarded protocol's per-request callbacks (`sidecar.server.guarded_protocol`: uvicorn's own callbacks
through ``super()``, its ``data_received`` feeding the parser in bounded steps) against stock uvicorn: the same
raw byte sequences (well-formed, pipelined, split anywhere, and malformed: bad request lines, CL+TE, bad
chunking, bad content-length, control bytes, absolute-form and ``*`` targets, an oversize header block), fed
to stock uvicorn's ``HttpToolsProtocol`` and to the guarded protocol: the same bytes written, the same
close, the same ASGI scopes (the guarded ones add only the raw target under ``extensions``), the same
request bodies, on the standard loop and on uvloop. With the smallest pipelining bound (one request
outstanding at a time: every byte parsed in 16-byte steps, the next request held until the answer before
it), the same scopes, bodies and close; the same bytes, but that a malformed request pipelined after good
ones is refused after their answers (stock uvicorn parses all of them at once, closes, and the good ones'
answers are lost).

In memory (a recording transport), so every interleaving is deterministic.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from sidecar import server
from tests.unit.test_server_timers import conversation

LOOPS = ["asyncio", "uvloop"]


def run(kind: str, coro: Any) -> Any:
    if kind == "uvloop":
        import uvloop
        return uvloop.run(coro)
    return asyncio.run(coro)


def _stock(url: bytes) -> tuple[bytes, bytes]:
    parsed = httptools.parse_url(url)
    return parsed.path, parsed.query or b""


# -- the same conversation through stock uvicorn, the guarded protocol, and the guarded protocol before the fold --
class Recorder(asyncio.Transport):
    """A connection's transport: records writes and the close."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.paused = False
        self.upgraded = ""

    def write(self, data: Any) -> None:
        if not self.closed:
            self.out += data

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # every write is taken at once

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def set_protocol(self, protocol: Any) -> None:  # a WebSocket upgrade: uvicorn's WebSocket protocol takes over
        self.upgraded = type(protocol).__name__

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)


def _app(seen: list[Any]) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message["body"])
            if not message["more_body"]:
                break
        seen.append((dict(scope), b"".join(chunks)))
        payload = b"%d:%s" % (len(seen), b"".join(chunks))
        if scope["path"].startswith("/chunked"):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": payload, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 404 if "missing" in scope["path"] else 200,
                    "headers": [(b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
    return app


def _protocol_class(kind: str) -> Any:
    if kind == "stock":
        return HttpToolsProtocol
    if kind == "guarded":
        return server.guarded_protocol(server.ConnectionLimits(idle_timeout_s=60, header_timeout_s=60, max_head_bytes=1 << 30, max_connections=64))
    base = server.guarded_protocol(server.ConnectionLimits(idle_timeout_s=60, header_timeout_s=60, max_head_bytes=1 << 30, max_connections=64,
                                                           max_pipelined_requests=1))

    class OneAtATime(base):  # type: ignore[misc, valid-type]
        """Counts requests parsed (a cycle made) and answered; `most`: the most parsed and unanswered at once."""
        most = parsed = answered = 0

        def on_headers_complete(self) -> None:
            before = self.cycle
            super().on_headers_complete()
            if self.cycle is not before:
                self.parsed += 1
                type(self).most = max(type(self).most, self.parsed - self.answered)

        def on_response_complete(self) -> None:
            self.answered += 1
            super().on_response_complete()

    return OneAtATime


async def _converse(kind: str, parts: list[bytes]) -> tuple[bytes, bool | str, list[Any]]:
    loop = asyncio.get_running_loop()
    seen: list[Any] = []
    config = Config(_app(seen), http=_protocol_class(kind), log_level="critical", access_log=False,
                    proxy_headers=False, server_header=False, lifespan="off")
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"Thu, 03 Dec 2026 08:00:00 GMT")]
    proto = config.http_protocol_class(config=config, server_state=state, app_state={}, _loop=loop)  # type: ignore[call-arg]
    transport = Recorder()
    proto.connection_made(transport)

    async def settle() -> None:
        for _ in range(30):
            await asyncio.sleep(0)

    for part in parts:
        if transport.closed:
            break
        while transport.paused and state.tasks:  # a pipelined request waits for the one before it
            await settle()
        proto.data_received(part)
        await settle()
    await settle()
    closed = transport.closed or transport.upgraded  # by the server (uvicorn closes at connection_lost too)
    proto.connection_lost(None)
    await settle()
    if kind == "one-at-a-time":
        assert type(proto).most <= 1  # the bound: one request parsed and unanswered at a time
    scopes = []
    for scope, body in seen:
        extensions = scope.pop("extensions", None)
        if kind != "stock":
            raw = extensions["memwarden"]["target"]
            assert type(raw) is bytes
            scope["target"] = raw
        scopes.append((scope, body))
    return bytes(transport.out), closed, scopes


MALFORMED = [
    b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
    b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
    b"GET /a\x01b HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nho st: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: x\r\nx: a\x00b\r\n\r\n",
    b"GET / HTTP/1.1\r\n host: x\r\n\r\n",
    b"GET http://h/abs?q=1 HTTP/1.1\r\nhost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /a%20b?c=%41#frag HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /missing HTTP/1.0\r\n\r\n",
    b"GET /x HTTP/1.0\r\nconnection: keep-alive\r\n\r\nGET /y HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /chunked HTTP/1.1\r\nhost: x\r\n\r\n",
    b"HEAD /x HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    b"GET /x HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70000 + b"\r\n\r\n",
    b"GET /\xc3\xa9 HTTP/1.1\r\nhost: x\r\n\r\n",
    b"\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n",
]
_MALFORMED = st.sampled_from(MALFORMED)


@st.composite
def byte_sequence(draw: Any) -> list[bytes]:
    """The writes of one connection: a conversation of `tests.unit.test_server_timers`, a malformed or
    unusual request after zero or more of its requests, or random bytes; split at random places."""
    base = draw(conversation())
    choice = draw(st.integers(0, 5))
    if choice == 5:
        target = draw(st.text(alphabet="abz09-._~!$&'()*+,;=:@/%?#[]|^`{}\"\x7f\u00e9", max_size=25))
        data = (b"GET " + draw(st.sampled_from([b"/", b"", b"//", b"http://h", b"*"])) + target.encode("utf-8")
                + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    elif choice in (1, 4):
        data = b"".join(base[:draw(st.integers(0, len(base)))]) + draw(_MALFORMED)
    elif choice == 2:
        data = draw(st.binary(min_size=1, max_size=80))
    elif choice == 3:
        data = b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n" + draw(st.binary(min_size=1, max_size=60))
    else:
        return base
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=3, unique=True)))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)]) if data[a:b]]


def _check(loop: str, parts: list[bytes]) -> None:
    async def main() -> tuple[Any, Any, Any]:
        return (await _converse("stock", parts), await _converse("guarded", parts),
                await _converse("one-at-a-time", parts))

    stock, guarded, one = run(loop, main())
    out, closed, scopes = guarded
    assert (out, closed) == stock[:2]
    # One request at a time: the same, but that a malformed request or an upgrade pipelined after good ones is
    # refused only once they are answered (stock uvicorn has parsed all of them, refused and closed the
    # connection: the good ones' answers are lost, and those queued behind the first never run).
    assert one[1] == closed
    refusal = re.search(rb"HTTP/1\.1 4(?!04)\d\d ", out)  # uvicorn's 400, the WebSocket layer's refusals
    refused = refusal.start() if refusal else -1
    if refused < 0:
        assert one[0] == out and one[2] == scopes
    else:
        assert one[0].startswith(out[:refused]) and one[0].endswith(out[refused:]), (one[0], out)
        assert one[2][:len(scopes)] == scopes
    assert len(scopes) == len(stock[2])
    for (scope, body), (stock_scope, stock_body) in zip(scopes, stock[2]):
        target = scope.pop("target")
        assert scope == stock_scope and body == stock_body
        path, query = _stock(target)
        assert (path, query) == (stock_scope["raw_path"], stock_scope["query_string"])


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("data", MALFORMED)
def test_each_unusual_request_as_stock_uvicorn(loop: str, data: bytes) -> None:
    _check(loop, [data])
    _check(loop, [data[:len(data) // 2], data[len(data) // 2:]])


@pytest.mark.parametrize("loop", LOOPS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(parts=byte_sequence())
def test_same_bytes_scopes_and_bodies_as_stock_uvicorn(loop: str, parts: list[bytes]) -> None:
    _check(loop, parts)
