"""The slow-read bounds of `sidecar.server.guarded_protocol` (issue 34, finding 1), on real loopback sockets
against a small ASGI app, on the standard loop and on uvloop:

- pipelining: 200 requests in one send while the first one's answer waits: at most
  ``max_pipelined_requests`` of them are parsed and unanswered at any time, the connection stops reading,
  and all 200 are answered in order once the first may finish;
- the write deadline: a client that pipelines requests for large answers and never reads is aborted
  ``write_timeout_s`` after its output stopped draining, having got no more than two answers produced; a
  client that asks for one large answer with ``Connection: close`` and never reads is aborted the same way
  (a close waits for the output to drain);
- eviction: at ``max_connections``, the connection stalled longest on unsent output goes first, then the
  next stalled one, and only then the idle one that waited longest;
- bodies larger than a parsing step (content-length and chunked, with the default bound and with one request
  at a time) arrive whole, pipelined requests after them too.

No timing is asserted: each wait is for a state of the server, bounded generously so a busy machine passes.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import fields
from typing import Any, Callable

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from sidecar import server

LOOPS = ["asyncio", "uvloop"]
BIG = 8 * 1024 * 1024  # bytes: more than loopback's socket buffers take, so the rest stays in the transport


def run(kind: str, coro: Any) -> Any:
    if kind == "uvloop":
        import uvloop
        return uvloop.run(coro)
    return asyncio.run(coro)


def limits(**kw: Any) -> server.ConnectionLimits:
    """`ConnectionLimits` with the bounds this release knows (so the tests run, and fail, on one without them)."""
    known = {f.name for f in fields(server.ConnectionLimits)}
    return server.ConnectionLimits(**{k: v for k, v in kw.items() if k in known})


class Served:
    """The app, the server and what the test observes: paths the app started, requests parsed and answered."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.gate = asyncio.Event()
        self.parsed = 0
        self.answered = 0
        self.most_unanswered = 0
        self.state = ServerState()
        self.srv: asyncio.AbstractServer | None = None

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """``/hold`` waits for `gate`; ``/big/N`` answers N bytes; ``/echo`` the length and a checksum of the
        request body; anything else its path."""
        if scope["type"] != "http":
            return
        received = bytearray()
        while True:
            message = await receive()
            received += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        self.seen.append(path)
        if path == "/hold":
            await self.gate.wait()
        if path == "/echo":
            body = b"%d:%d" % (len(received), sum(received) % 65521)
        else:
            body = b"x" * int(path[5:]) if path.startswith("/big/") else path.encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def start(self, bounds: server.ConnectionLimits) -> int:
        observed = self

        class Counting(server.guarded_protocol(bounds)):  # type: ignore[misc, valid-type]
            def on_headers_complete(self) -> None:
                observed.parsed += 1
                observed.most_unanswered = max(observed.most_unanswered, observed.parsed - observed.answered)
                super().on_headers_complete()

            def on_response_complete(self) -> None:
                observed.answered += 1
                super().on_response_complete()

        loop = asyncio.get_running_loop()
        config = Config(self.app, http=Counting, log_level="critical", access_log=False, proxy_headers=False,
                        server_header=False, lifespan="off", interface="asgi3")
        config.load()
        self.state.default_headers = []
        self.srv = await loop.create_server(
            lambda: Counting(config=config, server_state=self.state, app_state={}, _loop=loop), "127.0.0.1", 0)
        return int(self.srv.sockets[0].getsockname()[1])

    def connection_of(self, local_port: int) -> Any:
        """The server's protocol of the client socket bound to `local_port`, or None once it is gone."""
        for proto in list(self.state.connections):
            if proto.transport.get_extra_info("peername")[1] == local_port:
                return proto
        return None

    async def stop(self) -> None:
        assert self.srv is not None
        self.srv.close()
        for proto in list(self.state.connections):
            proto.transport.abort()
        await self.srv.wait_closed()


async def until(condition: Callable[[], bool], limit_s: float = 20.0) -> bool:
    """Whether `condition` came true within `limit_s` (polled every 10 ms)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def non_reader(port: int, data: bytes) -> socket.socket:
    """A client socket with a small receive buffer that sends `data` and never reads; its local port is
    ``getsockname()[1]``."""
    loop = asyncio.get_running_loop()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    await loop.sock_connect(s, ("127.0.0.1", port))
    await loop.sock_sendall(s, data)
    return s


def get(path: str, close: bool = False) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: x\r\n{'connection: close' + chr(13) + chr(10) if close else ''}\r\n".encode()


@pytest.mark.parametrize("kind", LOOPS)
def test_pipelining_is_bounded_and_reading_stops(kind: str) -> None:
    async def main() -> None:
        served = Served()
        port = await served.start(limits())  # the default bound: 16
        cap = getattr(server.ConnectionLimits(), "max_pipelined_requests", 16)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(get("/hold") + b"".join(get(f"/n{i}") for i in range(199)))
            assert await until(lambda: served.seen == ["/hold"])
            local = writer.get_extra_info("sockname")[1]
            proto = served.connection_of(local)
            await until(lambda: not proto.transport.is_reading(), 2.0)  # (uvicorn alone keeps reading: checked below)
            assert served.parsed - served.answered <= cap, (served.parsed, served.answered)
            assert not proto.transport.is_reading()
            served.gate.set()
            received = b""
            while received.count(b"HTTP/1.1 200 OK\r\n") < 200:
                chunk = await asyncio.wait_for(reader.read(65536), 20)
                assert chunk, received[-200:]
                received += chunk
            assert served.seen == ["/hold"] + [f"/n{i}" for i in range(199)]
            assert received.endswith(b"\r\n\r\n/n198")
            assert served.most_unanswered <= cap
            assert proto.transport.is_reading()  # all answered: reading again
        finally:
            writer.close()
            await served.stop()

    run(kind, main())


@pytest.mark.parametrize("kind", LOOPS)
def test_a_client_that_does_not_read_is_aborted_after_the_write_deadline(kind: str) -> None:
    async def main() -> None:
        served = Served()
        port = await served.start(limits(idle_timeout_s=60, header_timeout_s=60, max_unsent_bytes=64 * 1024,
                                         write_timeout_s=0.5))
        s = await non_reader(port, b"".join(get(f"/big/{BIG}") for _ in range(20)))
        try:
            local = s.getsockname()[1]
            assert await until(lambda: served.seen != [])
            assert await until(lambda: served.connection_of(local) is None), "the non-reading client is still connected"
            # answers stop with the first that does not drain: the next one waits to be written
            assert 1 <= len(served.seen) <= 2, served.seen
        finally:
            s.close()
            await served.stop()

    run(kind, main())


@pytest.mark.parametrize("kind", LOOPS)
def test_a_closing_connection_whose_output_does_not_drain_is_aborted(kind: str) -> None:
    async def main() -> None:
        served = Served()
        port = await served.start(limits(idle_timeout_s=60, header_timeout_s=60, write_timeout_s=0.5))
        s = await non_reader(port, get(f"/big/{BIG}", close=True))
        try:
            local = s.getsockname()[1]
            assert await until(lambda: served.answered == 1)
            proto = served.connection_of(local)
            assert proto is None or proto.transport.is_closing()  # answered with connection: close
            assert await until(lambda: served.connection_of(local) is None), "the closing connection is still open"
        finally:
            s.close()
            await served.stop()

    run(kind, main())


@pytest.mark.parametrize("kind", LOOPS)
def test_eviction_takes_the_longest_stalled_connection_first(kind: str) -> None:
    async def main() -> None:
        served = Served()
        port = await served.start(limits(idle_timeout_s=60, header_timeout_s=60, max_connections=3,
                                         max_unsent_bytes=64 * 1024, write_timeout_s=60))
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)  # the oldest connection: idle
        stalled: list[socket.socket] = []
        others: list[asyncio.StreamWriter] = [idle_w]
        try:
            for _ in range(2):  # two connections whose answers are not read: B, then C
                s = await non_reader(port, get(f"/big/{BIG}"))
                stalled.append(s)
                local = s.getsockname()[1]
                assert await until(lambda: served.connection_of(local) is not None and
                                   served.connection_of(local).transport.get_write_buffer_size() > 64 * 1024)
                await asyncio.sleep(0.05)
            idle_port = idle_w.get_extra_info("sockname")[1]
            b_port, c_port = (s.getsockname()[1] for s in stalled)

            async def connect() -> None:
                others.append((await asyncio.open_connection("127.0.0.1", port))[1])

            await connect()  # over the bound: B, stalled longest, goes (not the idle connection, older)
            assert await until(lambda: served.connection_of(b_port) is None), "B is still connected"
            assert served.connection_of(idle_port) is not None and served.connection_of(c_port) is not None
            await connect()  # then C
            assert await until(lambda: served.connection_of(c_port) is None), "C is still connected"
            assert served.connection_of(idle_port) is not None
            await connect()  # no stalled connection left: the idle one that waited longest
            assert await asyncio.wait_for(idle_r.read(), 20) == b""
        finally:
            for s in stalled:
                s.close()
            for w in others:
                w.close()
            await served.stop()

    run(kind, main())


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("cap", [16, 1])
def test_bodies_longer_than_a_parsing_step_arrive_whole(kind: str, cap: int) -> None:
    """A chunked body counts nothing towards its request's known length: it is parsed in steps like headers
    (an earlier version subtracted its bytes from a length of 0 and never advanced: the loop hung)."""
    async def main() -> None:
        served = Served()
        port = await served.start(limits(max_pipelined_requests=cap))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            body = bytes(range(256)) * 4000  # 1,024,000 bytes
            chunked = b"".join(b"%x\r\n%s\r\n" % (n, body[:n]) for n in (1, 17, 300, 70000, 1000)) + b"0\r\n\r\n"
            expected = [len(body), sum(body) % 65521] + [n for n in (1, 17, 300, 70000, 1000)]
            writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body) + body
                         + b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + chunked
                         + get("/after"))
            received = b""
            while not received.endswith(b"/after"):
                chunk = await asyncio.wait_for(reader.read(65536), 20)
                assert chunk, received
                received += chunk
            answers = [part.split(b"\r\n\r\n", 1)[1] for part in received.split(b"HTTP/1.1 200 OK\r\n")[1:]]
            chunked_total = sum(expected[2:])
            chunked_sum = sum(sum(body[:n]) for n in expected[2:]) % 65521
            assert answers == [b"%d:%d" % (expected[0], expected[1]), b"%d:%d" % (chunked_total, chunked_sum), b"/after"]
        finally:
            writer.close()
            await served.stop()

    run(kind, main())


def test_settings_defaults_and_refusals(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from sidecar.config import ConfigError, load_settings

    monkeypatch.chdir(tmp_path)  # no .env
    for k in list(__import__("os").environ):
        if k.upper().startswith("MEMWARDEN_"):
            monkeypatch.delenv(k)
    settings = load_settings()
    assert (settings.max_pipelined_requests, settings.max_unsent_bytes, settings.write_timeout_s) == (16, 262144, 10.0)
    for name, bad in (("MAX_PIPELINED_REQUESTS", "0"), ("MAX_PIPELINED_REQUESTS", "1025"), ("MAX_UNSENT_BYTES", "1000"),
                      ("WRITE_TIMEOUT_S", "0"), ("WRITE_TIMEOUT_S", "soon")):
        monkeypatch.setenv(f"MEMWARDEN_{name}", bad)
        with pytest.raises(ConfigError, match=name.lower()):
            load_settings()
        monkeypatch.delenv(f"MEMWARDEN_{name}")
    with pytest.raises(ValueError, match="write_timeout_s"):
        server.ConnectionLimits(write_timeout_s=0)


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("shape", ["one-header", "many-headers", "long-target", "trickled"])
def test_a_head_over_max_head_bytes_is_431_and_closed(kind: str, shape: str) -> None:
    """A request line and headers over ``max_head_bytes`` are answered 431 and the connection closed, the app
    never called, while the client is still sending (the parser would otherwise buffer a header whatever its
    size until the header deadline); a head just under the bound, and requests pipelined before the long one,
    are answered."""
    bound = 8 * 1024

    async def main() -> None:
        served = Served()
        port = await served.start(limits(idle_timeout_s=60, header_timeout_s=60, max_head_bytes=bound))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            fits = f"GET /fits HTTP/1.1\r\nhost: x\r\nx-pad: {'a' * (bound - 200)}\r\n\r\n".encode()
            assert len(fits) < bound
            writer.write(get("/before") + fits)
            received = b""
            while received.count(b"HTTP/1.1 200 OK\r\n") < 2 or not received.endswith(b"/fits"):
                chunk = await asyncio.wait_for(reader.read(65536), 20)
                assert chunk, received
                received += chunk
            long_head = {"one-header": b"GET /long HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (4 * 1024 * 1024),
                         "many-headers": b"GET /long HTTP/1.1\r\nhost: x\r\n" + b"x-h: 0123456789\r\n" * 200_000,
                         "long-target": b"GET /" + b"a" * (4 * 1024 * 1024),
                         "trickled": b"GET /long HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (bound + 4096)}[shape]
            try:
                if shape == "trickled":  # in small sends, each parsed on its own
                    for i in range(0, len(long_head), 512):
                        writer.write(long_head[i:i + 512])
                        await writer.drain()
                        await asyncio.sleep(0)
                else:
                    writer.write(long_head)  # never finished: no CRLF CRLF
                    await writer.drain()
            except ConnectionError:
                pass  # the server closed while the rest was on its way (after its lingering time)
            while True:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), 20)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                received += chunk
            assert received.count(b"HTTP/1.1 200 OK\r\n") == 2, received[:300]
            assert b"HTTP/1.1 431 " in received and received.rstrip().endswith(b"size limit\"}"), received[-300:]
            assert served.seen == ["/before", "/fits"]  # the long request never reached the app
        finally:
            writer.close()
            await served.stop()

    run(kind, main())
