"""`sidecar.server.guarded_protocol` with one lazily re-armed deadline per connection, against the guards as
they were (`tests/unit/server_reference.py`, a timer armed and cancelled per state change), on real sockets,
on the standard loop and on uvloop:

- the same bytes on the wire for any sequence of requests (methods, paths, bodies, chunked bodies,
  ``Expect: 100-continue``, keep-alive or close, pipelined or one at a time, malformed requests answered
  400 by uvicorn), the connection closed by the same side (``Connection: close`` or the idle deadline);
- the idle deadline closes a silent connection (no bytes) and does not close a kept-alive connection
  whose requests keep coming for longer than one idle period (the timer set at connect finds the
  deadline moved and waits for the rest);
- the header deadline answers 408 and closes, bytes arriving meanwhile do not extend it, and a header
  deadline shorter than the idle one takes effect before the idle timer set earlier would fire;
- the connection bound evicts the connection waiting longest without a request in flight.
- a pipelined request uvicorn starts when the one before it completes is in flight: the idle deadline does
  not close its connection and the connection bound does not evict it (new protocol only: the old one did both).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.server import ServerState

from sidecar import server as new_server
from tests.unit import server_reference as old_server

LOOPS = ["asyncio", "uvloop"]


def run(kind: str, coro: Any) -> Any:
    if kind == "uvloop":
        import uvloop
        return uvloop.run(coro)
    return asyncio.run(coro)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A deterministic ASGI app: echoes what it got; ``/slow`` waits a little (pipelining), ``/two`` answers
    in two body messages, ``/chunked`` without a content-length, ``/status/N`` with status N."""
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path.startswith("/slow"):
        await asyncio.sleep(0.01)
    payload = json.dumps({"m": scope["method"], "p": path, "q": scope["query_string"].decode("latin-1"),
                          "h": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in scope["headers"]],
                          "b": b"".join(chunks).decode("latin-1"),
                          "t": scope.get("extensions", {}).get("memwarden", {}).get("target", b"").decode("latin-1")}).encode()
    status = int(path.split("/")[2]) if path.startswith("/status/") and path.split("/")[2].isdigit() else 200
    status = status if 200 <= status < 600 and status not in (204, 304) else 200
    if path.startswith("/chunked"):
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload[:5], "more_body": True})
        await send({"type": "http.response.body", "body": payload[5:]})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if path.startswith("/two"):
        await send({"type": "http.response.body", "body": payload[:3], "more_body": True})
        await send({"type": "http.response.body", "body": payload[3:]})
    else:
        await send({"type": "http.response.body", "body": payload})


async def serve(module: Any, limits: Any, asgi: Any = app) -> tuple[asyncio.AbstractServer, int]:
    loop = asyncio.get_running_loop()
    config = Config(asgi, http=module.guarded_protocol(limits), log_level="critical", access_log=False,
                    proxy_headers=False, server_header=False, lifespan="off")
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"Thu, 03 Dec 2026 08:00:00 GMT")] + config.encoded_headers
    proto = config.http_protocol_class
    srv = await loop.create_server(lambda: proto(config=config, server_state=state, app_state={}, _loop=loop),  # type: ignore[misc]
                                   "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def exchange(port: int, parts: list[bytes], gap_s: float = 0.0, limit_s: float = 10.0,
                   until_answer: bool = False) -> tuple[bytes, bool]:
    """Send `parts` (each in one write, `gap_s` apart; with `until_answer`, none once a byte came back) and read
    until the server closes the connection: (every byte received, closed by the server within `limit_s`; a
    reset counts as closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()

    async def read_all() -> None:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            received.extend(chunk)

    reading = asyncio.ensure_future(read_all())
    try:
        for part in parts:
            if reading.done() or writer.transport.is_closing() or (until_answer and received):
                break  # the server closed the connection: the rest is not sent
            writer.write(part)
            if gap_s:
                await asyncio.sleep(gap_s)
        await asyncio.wait_for(reading, limit_s)
        closed = True
    except ConnectionResetError:
        closed = True
    except (asyncio.TimeoutError, ConnectionError):
        closed = False
    except RuntimeError:  # uvloop: a write on a transport the server's close already ended
        await asyncio.wait_for(reading, limit_s)
        closed = True
    finally:
        reading.cancel()
        writer.close()
    return bytes(received), closed


# -- the same bytes on the wire --------------------------------------------------------------------------------
_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~%", min_size=0, max_size=12)
_path = st.one_of(
    st.builds(lambda p: "/" + p, _token),
    st.sampled_from(["/slow", "/two", "/chunked", "/status/404", "/status/503", "/status/201", "/a/b?x=1&y=2",
                     "/api/v2/x%2Fy", "http://h/abs", "/frag#x", "*"]),
)
_body = st.binary(max_size=40)


@st.composite
def request(draw: Any) -> tuple[bool, bytes]:
    """(whether the server closes the connection after answering it, the request's bytes)"""
    kind = draw(st.sampled_from(["plain", "plain", "plain", "chunked", "expect", "malformed", "http10"]))
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"]))
    path = draw(_path)
    body = draw(_body)
    close = draw(st.booleans())
    extra = b"connection: close\r\n" if close else b""
    extra += draw(st.sampled_from([b"", b"x-api-key: k\r\n", b"X-Odd:  spaced  \r\n", b"content-type: application/json\r\n"]))
    if kind == "malformed":
        return True, draw(st.sampled_from([b"GET / HTTP/9.9\r\n\r\n", b"BROKEN\r\n\r\n", b"GET /\x00 HTTP/1.1\r\n\r\n",
                                     b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n",
                                     b"GET / HTTP/1.1\r\nbad header\r\n\r\n"]))
    version = b"HTTP/1.0" if kind == "http10" else b"HTTP/1.1"
    closes = kind == "http10" or b"connection: close" in extra
    head = f"{method} {path} ".encode() + version + b"\r\nhost: x\r\n" + extra
    if kind == "chunked":
        return closes, head + b"transfer-encoding: chunked\r\n\r\n" + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    if kind == "expect":
        head += b"expect: 100-continue\r\n"
    return closes, head + b"content-length: %d\r\n\r\n" % len(body) + body


@st.composite
def conversation(draw: Any) -> list[bytes]:
    """The writes of one connection: requests, some pipelined (several in one write), some split in two."""
    drawn = draw(st.lists(request(), min_size=1, max_size=5))
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
        joined = b"".join(requests[i:i + n])
        i += n
        if draw(st.booleans()) and len(joined) > 2:
            cut = draw(st.integers(1, len(joined) - 1))
            parts += [joined[:cut], joined[cut:]]
        else:
            parts.append(joined)
    return parts


LIMITS = dict(idle_timeout_s=0.15, header_timeout_s=2.0, max_connections=64)


@pytest.mark.parametrize("kind", LOOPS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=conversation())
def test_same_bytes_on_the_wire(kind: str, parts: list[bytes]) -> None:
    async def main() -> tuple[tuple[bytes, bool], tuple[bytes, bool]]:
        old_srv, old_port = await serve(old_server, old_server.ConnectionLimits(**LIMITS))
        new_srv, new_port = await serve(new_server, new_server.ConnectionLimits(**LIMITS))
        try:
            return tuple(await asyncio.gather(exchange(old_port, parts, 0.02), exchange(new_port, parts, 0.02)))  # type: ignore[return-value]
        finally:
            old_srv.close()
            new_srv.close()

    old, new = run(kind, main())
    assert new == old
    assert old[1]  # every conversation ends: by a close, a 400 or the idle deadline


# -- deadlines ---------------------------------------------------------------------------------------------------
MODULES = [old_server, new_server]
GET = b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n"


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("module", MODULES, ids=["old", "new"])
def test_silent_connection_is_closed_without_bytes(kind: str, module: Any) -> None:
    async def main() -> tuple[bytes, bool]:
        srv, port = await serve(module, module.ConnectionLimits(idle_timeout_s=0.2, header_timeout_s=5.0))
        try:
            return await exchange(port, [], limit_s=5.0)
        finally:
            srv.close()

    assert run(kind, main()) == (b"", True)


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("module", MODULES, ids=["old", "new"])
def test_kept_alive_connection_is_not_closed_while_requests_come(kind: str, module: Any) -> None:
    """Requests 0.1 s apart for 1.2 s on an idle bound of 0.3 s: each is answered, none is refused; the
    connection is closed by the idle deadline only after the last one."""
    async def main() -> tuple[bytes, bool]:
        srv, port = await serve(module, module.ConnectionLimits(idle_timeout_s=0.3, header_timeout_s=5.0))
        try:
            return await exchange(port, [GET] * 12, gap_s=0.1, limit_s=5.0)
        finally:
            srv.close()

    received, closed = run(kind, main())
    assert closed and received.count(b"HTTP/1.1 200 OK\r\n") == 12 and b"408" not in received


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("module", MODULES, ids=["old", "new"])
def test_slow_headers_get_408_and_bytes_do_not_extend_the_deadline(kind: str, module: Any) -> None:
    async def main() -> tuple[bytes, bool]:
        srv, port = await serve(module, module.ConnectionLimits(idle_timeout_s=5.0, header_timeout_s=0.3))
        try:
            # one header line every 0.05 s for 1.5 s: far past the header deadline, never idle
            return await exchange(port, [b"GET /x HTTP/1.1\r\n"] + [b"x-h: v\r\n"] * 30, gap_s=0.05, limit_s=5.0,
                                  until_answer=True)
        finally:
            srv.close()

    assert run(kind, main()) == (module.REQUEST_TIMEOUT, True)


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("module", MODULES, ids=["old", "new"])
def test_header_deadline_shorter_than_idle_takes_effect_first(kind: str, module: Any) -> None:
    """After one answered request the idle deadline (3 s) is set; the next request's header deadline
    (0.3 s) is earlier and answers 408 long before the idle timer would have fired."""
    async def main() -> tuple[tuple[bytes, bool], float]:
        srv, port = await serve(module, module.ConnectionLimits(idle_timeout_s=3.0, header_timeout_s=0.3))
        try:
            started = time.monotonic()
            out = await exchange(port, [GET, b"GET /y HTTP/1.1\r\n"], gap_s=0.1, limit_s=10.0)
            return out, time.monotonic() - started
        finally:
            srv.close()

    (received, closed), elapsed = run(kind, main())
    assert closed and received.count(b"HTTP/1.1 200 OK\r\n") == 1 and received.endswith(module.REQUEST_TIMEOUT)
    assert elapsed < 2.0  # the 408 came from the header deadline, not after the idle one


@pytest.mark.parametrize("kind", LOOPS)
@pytest.mark.parametrize("module", MODULES, ids=["old", "new"])
def test_connection_bound_evicts_the_longest_waiting(kind: str, module: Any) -> None:
    async def main() -> list[bytes]:
        srv, port = await serve(module, module.ConnectionLimits(idle_timeout_s=5.0, header_timeout_s=5.0,
                                                               max_connections=2))
        try:
            conns = []
            for _ in range(2):
                conns.append(await asyncio.open_connection("127.0.0.1", port))
                await asyncio.sleep(0.05)
            # the second one answers a request, so the first has waited longest without one in flight
            conns[1][1].write(GET)
            await conns[1][0].readuntil(b"\r\n\r\n")
            third = await asyncio.open_connection("127.0.0.1", port)
            first = await asyncio.wait_for(conns[0][0].read(), 5.0)  # closed by the server
            third[1].write(GET)
            answer = await asyncio.wait_for(third[0].readuntil(b"\r\n\r\n"), 5.0)
            for _, w in conns + [third]:
                w.close()
            return [first, answer.split(b"\r\n")[0]]
        finally:
            srv.close()

    assert run(kind, main()) == [b"", b"HTTP/1.1 200 OK"]


async def _waiting_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers after ``/wait/<ms>`` milliseconds (0 for any other path)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    parts = scope["path"].split("/")
    if len(parts) == 3 and parts[1] == "wait":
        await asyncio.sleep(int(parts[2]) / 1000)
    body = scope["path"].encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("kind", LOOPS)
def test_pipelined_request_in_flight_is_not_closed_by_the_idle_deadline(kind: str) -> None:
    """Two requests in one write; the second (started by uvicorn when the first completes) runs for 0.8 s on an
    idle bound of 0.2 s: it is in flight, so the idle deadline must not close the connection under it (before,
    the idle timer was armed when the first response completed and closed the connection mid-request)."""
    async def main() -> tuple[bytes, bool]:
        srv, port = await serve(new_server, new_server.ConnectionLimits(idle_timeout_s=0.2, header_timeout_s=5.0),
                                asgi=_waiting_app)
        try:
            two = b"GET /first HTTP/1.1\r\nhost: x\r\n\r\nGET /wait/800 HTTP/1.1\r\nhost: x\r\n\r\n"
            return await exchange(port, [two], limit_s=5.0)
        finally:
            srv.close()

    received, closed = run(kind, main())
    assert closed and received.count(b"HTTP/1.1 200 OK\r\n") == 2 and received.endswith(b"/wait/800")


@pytest.mark.parametrize("kind", LOOPS)
def test_pipelined_request_in_flight_is_not_evicted(kind: str) -> None:
    """A connection whose pipelined second request is running is not evicted by the connection bound: the
    connection waiting without a request (idle) is closed instead, and the running request is answered."""
    async def main() -> tuple[bytes, bytes]:
        srv, port = await serve(new_server, new_server.ConnectionLimits(idle_timeout_s=5.0, header_timeout_s=5.0,
                                                                       max_connections=2), asgi=_waiting_app)
        writers: list[asyncio.StreamWriter] = []
        try:
            busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
            writers.append(busy_w)
            busy_w.write(b"GET /first HTTP/1.1\r\nhost: x\r\n\r\nGET /wait/800 HTTP/1.1\r\nhost: x\r\n\r\n")
            await busy_r.readuntil(b"/first")  # the first answered: the second is in flight now
            idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
            writers.append(idle_w)
            await asyncio.sleep(0.05)
            writers.append((await asyncio.open_connection("127.0.0.1", port))[1])  # over the bound: one must go
            idle_bytes = await asyncio.wait_for(idle_r.read(), 3.0)  # the idle one is closed
            try:
                busy_rest = await asyncio.wait_for(busy_r.readuntil(b"/wait/800"), 3.0)
            except asyncio.IncompleteReadError as e:  # the busy one was closed under its request
                busy_rest = e.partial
            return idle_bytes, busy_rest
        finally:
            for w in writers:
                w.transport.abort()
            srv.close()
            await srv.wait_closed()

    idle_bytes, busy_rest = run(kind, main())
    assert idle_bytes == b"" and busy_rest.startswith(b"HTTP/1.1 200 OK\r\n")
