"""The pipeline entry's answers (its two ASGI ``send`` calls: since issue 35 there is no direct write on
uvicorn's cycle any more) against the entry as it was (`tests/unit/app_entry_reference.py`), both behind
`sidecar.server.guarded_protocol` on real sockets, on the standard loop and on uvloop, the same bytes on the
wire and the same decision records for any conversation (methods incl. HEAD, keep-alive or close,
HTTP/1.0, pipelined requests, ``Expect: 100-continue``, malformed requests, 408 answers that close, 500 for
an unencodable body, bodies over the coalescing bound, a request id uvicorn refuses, a record that raises,
the in-flight bound) and server configurations (``server`` header, extra default headers, one of them
``connection: close``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.server import ServerState

from sidecar import app as new_app
from sidecar.exchange import Exchange
from sidecar.server import ConnectionLimits, guarded_protocol
from tests.unit import app_entry_reference as old_app
from tests.unit.test_server_timers import LOOPS, exchange, run


class StubPipeline:
    """A deterministic pipeline: request ids count up; the path picks the answer."""

    def __init__(self) -> None:
        self.n = 0
        self.records: list[tuple[int, str]] = []

    async def run(self, scope: dict[str, Any], receive: Any) -> tuple[int, Any, Exchange]:
        self.n += 1
        path = scope["path"]
        ex = Exchange(method=scope["method"], raw_path=scope.get("raw_path", b"").decode("latin-1"))
        ex.request_id = "ab\ncd" if path.startswith("/badid") else f"{self.n:032x}"
        size = 0
        if not path.startswith("/noread"):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break
                size += len(message.get("body", b""))
                if not message.get("more_body"):
                    break
        if path.startswith("/slow"):
            await asyncio.sleep(0.01)
        if path.startswith("/s/") and path[3:].isdigit() and 200 <= int(path[3:]) < 600 and int(path[3:]) not in (204, 304):
            return int(path[3:]), {"error": "x", "message": path}, ex
        if path.startswith("/nan"):
            return 200, {"x": float("nan")}, ex
        if path.startswith("/big"):
            return 200, {"x": "y" * 300_000}, ex
        return 200, {"m": scope["method"], "p": path, "n": size}, ex

    def record(self, ex: Exchange, status: int) -> None:
        self.records.append((status, ex.request_id))
        if ex.raw_path.startswith("/raise"):
            raise RuntimeError("record failed")


async def serve(module: Any, max_inflight: int | None, server_header: bool,
                extra: list[tuple[str, str]]) -> tuple[asyncio.AbstractServer, int, StubPipeline]:
    loop = asyncio.get_running_loop()
    pipeline = StubPipeline()
    application = module.MemwardenApp(docs_url=None, redoc_url=None, openapi_url=None)
    application.pipeline_entry = module.PipelineMiddleware(None, pipeline, max_inflight=max_inflight)  # type: ignore[arg-type]
    config = Config(application, http=guarded_protocol(ConnectionLimits(idle_timeout_s=0.15)), log_level="critical",
                    access_log=False, proxy_headers=False, server_header=server_header, headers=extra, lifespan="off")
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"Thu, 03 Dec 2026 08:00:00 GMT")] + config.encoded_headers
    proto = config.http_protocol_class
    srv = await loop.create_server(lambda: proto(config=config, server_state=state, app_state={}, _loop=loop),  # type: ignore[misc]
                                   "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1], pipeline


_path = st.one_of(
    st.builds(lambda p: "/" + p, st.text(alphabet="abcdefghij0123456789-._~%", max_size=10)),
    st.sampled_from(["/slow", "/s/408", "/s/401", "/s/503", "/s/201", "/s/599", "/nan", "/big", "/badid", "/raise",
                     "/noread", "/api/v2/tenants/t/databases/d/collections/c/get?limit=1", "http://h/abs", "/f#x"]),
)


@st.composite
def request(draw: Any) -> tuple[bool, bytes]:
    """(whether the server closes the connection after answering it, the request's bytes)"""
    kind = draw(st.sampled_from(["plain", "plain", "plain", "chunked", "expect", "malformed", "http10"]))
    method = draw(st.sampled_from(["GET", "POST", "HEAD", "DELETE", "PUT"]))
    path = draw(_path)
    body = draw(st.binary(max_size=30))
    extra = b"connection: close\r\n" if draw(st.booleans()) else b""
    extra += draw(st.sampled_from([b"", b"x-api-key: k\r\n", b"connection: keep-alive\r\n"]))
    if kind == "malformed":
        return True, draw(st.sampled_from([b"GET / HTTP/9.9\r\n\r\n", b"BROKEN\r\n\r\n", b"GET / HTTP/1.1\r\nbad header\r\n\r\n"]))
    version = b"HTTP/1.0" if kind == "http10" else b"HTTP/1.1"
    closes = kind == "http10" or b"connection: close" in extra or path.startswith(("/s/408", "/raise", "/badid"))
    head = f"{method} {path} ".encode() + version + b"\r\nhost: x\r\n" + extra
    if kind == "chunked":
        return closes, head + b"transfer-encoding: chunked\r\n\r\n" + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    if kind == "expect":
        head += b"expect: 100-continue\r\n"
    return closes, head + b"content-length: %d\r\n\r\n" % len(body) + body


@st.composite
def conversation(draw: Any, max_requests: int = 4) -> list[bytes]:
    drawn = draw(st.lists(request(), min_size=1, max_size=max_requests))
    # nothing after a request the server closes the connection on: bytes it would not read make its
    # close a reset, which may discard answers the client has not read yet (nondeterministic on any server)
    requests = []
    for closes, data in drawn:
        requests.append(data)
        if closes:
            break
    parts: list[bytes] = []
    i = 0
    while i < len(requests):
        n = draw(st.integers(1, 3))
        parts.append(b"".join(requests[i:i + n]))
        i += n
    return parts


@pytest.mark.parametrize("kind", LOOPS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_inflight=st.sampled_from([None, None, 0]), server_header=st.booleans(),
       extra=st.sampled_from([[], [("x-extra", "1")], [("connection", "close")]]))
def test_same_bytes_on_the_wire(kind: str, data: Any, max_inflight: int | None, server_header: bool,
                                extra: list[tuple[str, str]]) -> None:
    # when every answer closes the connection (503, or a default ``connection: close``), one request
    parts = data.draw(conversation(1 if max_inflight == 0 or extra == [("connection", "close")] else 4))

    async def main() -> list[Any]:
        old_srv, old_port, old_pipe = await serve(old_app, max_inflight, server_header, extra)
        new_srv, new_port, new_pipe = await serve(new_app, max_inflight, server_header, extra)
        try:
            old, new = await asyncio.gather(exchange(old_port, parts, 0.02), exchange(new_port, parts, 0.02))
            return [old, new, old_pipe.records, new_pipe.records]
        finally:
            old_srv.close()
            new_srv.close()

    old, new, old_records, new_records = run(kind, main())
    assert new == old
    assert new_records == old_records
    assert old[1]


@pytest.mark.parametrize("kind", LOOPS)
def test_a_kept_alive_connection_carries_the_next_request(kind: str) -> None:
    async def main() -> tuple[bytes, bool]:
        srv, port, _ = await serve(new_app, None, False, [])
        try:
            return await exchange(port, [b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n", b"HEAD /b HTTP/1.1\r\nhost: x\r\n\r\n"], 0.02)
        finally:
            srv.close()

    received, closed = run(kind, main())
    assert closed and received.count(b"HTTP/1.1 200 OK\r\n") == 2
