"""A minimal pooled HTTP/1.1 transport for httpx (`httpx.AsyncBaseTransport`), for the one backend origin.

The forward stage keeps httpx's client API (`httpx.AsyncClient`: URL building, headers, `Timeout`,
`Response`) and replaces its default transport (httpcore + h11), whose per-request cost dominated the
sidecar's own work on small requests. Responses are parsed with httptools (the llhttp parser uvicorn
uses), fed straight from each connection's `asyncio.Protocol.data_received` (no StreamReader; one
future per exchange; one read-deadline timer per connection, set again only when it fires early or a
shorter deadline comes). What it does, and the httpx exceptions it raises (mapped to 502/504 by `sidecar.stages.forward`):

- **Pool**: at most `max_connections` connections to the origin (waiting longer than the ``pool``
  timeout for one raises `httpx.PoolTimeout`); idle connections are reused last-in first-out and
  closed after `keepalive_expiry` seconds idle, or at once when the backend closed them (EOF seen) or
  answered ``Connection: close`` / HTTP/1.0 without keep-alive.
- **Bytes nobody asked for**: a connection is never reused once bytes came that are not part of an
  answer to a request on it — after the complete answer in the same read (a second answer, part of one,
  junk: the answer itself is returned), or while it sat idle (`data_received` marks it), or still unread
  on its socket when a request would take it (one non-waiting ``poll(2)`` per reuse, `_Connection._unread`):
  such bytes are never taken as the next request's answer. What no client can tell apart remains: bytes
  the backend sends after that check, while the next request is on its way, are that request's answer as
  far as HTTP/1.1 can say (no request ids), as with any HTTP/1.1 client.
- **Informational answers** (1xx but 101: ``100 Continue``, ``103 Early Hints``) are skipped and the final
  answer read (at most `MAX_INFORMATIONAL`, else `httpx.RemoteProtocolError`); ``101`` is refused as an upgrade.
- **Timeouts** (the request's ``timeout`` extension, as httpx sets it): ``connect`` for opening a
  connection, its TLS handshake included (`httpx.ConnectTimeout`), ``write`` for sending the request
  (`httpx.WriteTimeout`), ``read`` for each read of the response (`httpx.ReadTimeout`). Connection failures
  raise `httpx.ConnectError` (`TLSVerificationFailed` when the backend's certificate does not verify),
  `httpx.WriteError` or `httpx.ReadError`; a response that is not HTTP/1.1 `httpx.RemoteProtocolError`.
- **Size cap**: a response body over `max_response_bytes` raises `ResponseTooLarge` (the connection
  is closed; nothing of the body is returned), as do headers over `MAX_HEADER_BYTES`. The body is returned
  as received; `decode_body` decodes a ``Content-Encoding`` (gzip, deflate) to at most the same cap, never
  further (the forward stage calls it).
- **TLS** for ``https://`` origins: `ssl_context` (`client_tls_context`: a CA bundle, a client certificate),
  else ``ssl.create_default_context()``; certificates and the host name are verified.
- **Connections the backend closed**: a reused keep-alive connection that fails before any byte of
  the response arrives (the backend closed it while it sat in the pool) is retried once on a new
  connection — only for an idempotent request: methods GET, HEAD, OPTIONS, TRACE, PUT, DELETE
  (RFC 9110 §9.2.2) or a request whose ``memwarden.idempotent`` extension is True (the caller vouches
  that it changes nothing, e.g. Chroma's read-only ``get``/``query`` POSTs). A non-idempotent request is
  never re-sent: it fails with `httpx.RemoteProtocolError` (502), as it may have reached the backend.
- No proxies, no HTTP/2, no upgrades, no ``Expect: 100-continue`` sent: the backend is one origin.
  Request bodies are sent with ``Content-Length``.
"""

from __future__ import annotations

import asyncio
import os
import select
import ssl
import time
import zlib
from collections import deque
from typing import Any
import httpx
import httptools

IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
MAX_HEADER_BYTES = 1024 * 1024  # header names and values of one answer (informational answers included), bytes
MAX_INFORMATIONAL = 16  # informational (1xx) answers before the final one, at most


class ResponseTooLarge(httpx.TransportError):
    """The backend's response body is over the transport's `max_response_bytes`."""


class TLSVerificationFailed(httpx.ConnectError):
    """The backend's TLS certificate did not verify: not issued by a trusted CA (``BACKEND_CA_BUNDLE``, else the
    system's trust store), expired, or not naming the backend URL's host. `reason` is OpenSSL's text (it may
    name the host)."""

    def __init__(self, reason: str, *, request: httpx.Request | None = None) -> None:
        super().__init__(f"TLS verification of the backend failed: {reason}", request=request)
        self.reason = reason


class _StaleConnection(Exception):
    """A reused connection failed before any byte of the response: the backend had closed it."""


class _Parsed:
    """httptools callbacks collecting one response. One per connection with its parser (`_Connection.spare`),
    `reset` for each exchange while the parser stands at a message boundary: the two refer to each other (the
    parser holds the bound callbacks), so one made per exchange was a reference cycle per request, freed only
    by the cyclic garbage collector.

    Informational answers (1xx but 101, e.g. ``100 Continue``, ``103 Early Hints``) are not the answer: their
    headers are dropped and the final answer that follows is collected (at most `MAX_INFORMATIONAL` of them).
    Anything after the final answer (`complete`) is never part of it: a message that begins after it sets
    `extra` and its headers and body are ignored. Header bytes (names and values, informational answers'
    included) count against `MAX_HEADER_BYTES`, the body against `cap`."""

    __slots__ = ("parser", "headers", "body", "size", "cap", "headers_done", "complete", "too_large", "keep_alive",
                 "begun", "status", "informational", "extra", "header_bytes", "headers_too_large")

    def __init__(self, cap: int) -> None:
        self.parser: Any = None
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.size = 0
        self.cap = cap
        self.headers_done = False
        self.complete = False
        self.too_large = False
        self.begun = 0  # messages the parser began in this exchange (a second one: bytes after the answer)
        self.status = 0  # the status of the message being parsed
        self.informational = 0  # informational (1xx) answers before the final one
        self.extra = False  # a message began after the final answer: bytes nobody asked for
        self.header_bytes = 0
        self.headers_too_large = False

    def reset(self) -> None:
        """The state of a new `_Parsed` (new lists: the last exchange's headers went to its caller)."""
        self.keep_alive = self.headers_done = self.complete = self.too_large = False
        self.extra = self.headers_too_large = False
        self.headers = []
        self.body = []
        self.size = self.begun = self.status = self.informational = self.header_bytes = 0

    def on_message_begin(self) -> None:
        self.begun += 1
        if self.complete:
            self.extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADER_BYTES:
            self.headers_too_large = True
        else:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        status = self.status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational: not the answer; the final one follows
            self.informational += 1
            self.headers = []
            return
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.size += len(body)
        if self.size > self.cap:
            self.too_large = True
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.complete or self.status == 101:  # after the answer; or an upgrade, refused by the parser's error
            return
        if not self.headers_done:  # the end of an informational answer: the parser stands where the next begins
            self.begun = 0
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp resets it once the message is done


_STALE, _MID_RESPONSE, _UPGRADE, _TOO_LARGE, _READ_TIMEOUT = "stale", "mid", "upgrade", "too_large", "read_timeout"
_HEADERS_TOO_LARGE, _TOO_MANY_INFORMATIONAL = "headers_too_large", "informational"


class _Connection(asyncio.Protocol):
    """One backend connection as an `asyncio.Protocol`: the response's bytes go from `data_received`
    straight into its httptools parser, and the exchange waits on one future (no StreamReader buffer,
    no task wake-up per read). The ``read`` timeout bounds each wait for data, as a read per wait did:
    the deadline of the exchange waiting is ``last data + read timeout``, kept as a value; one timer per
    connection (`timer`, set for `timer_at`) checks it when it fires and is set again for the rest when
    the deadline is later (data came, or a later exchange started), so an exchange neither sets nor
    cancels a timer unless none is running or the running one is set for after its deadline. A timer that
    fires with no exchange waiting ends (the next exchange sets one); `close` and `connection_lost`
    cancel it.

    `outcome` of an exchange: None (the answer is complete, or ended by EOF where that delimits it),
    one of the markers above, or ``(kind, exception)`` for a parse error or a failed connection."""

    __slots__ = ("loop", "transport", "idle_since", "used", "eof", "lost", "lost_exc", "dirty", "write_paused",
                 "drain_waiter", "parsed", "parser", "head_only", "reused", "received", "waiter", "outcome",
                 "last_data", "read_timeout", "timer", "timer_at", "spare", "poller")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: Any = None
        self.idle_since = time.monotonic()
        self.used = False
        self.eof = self.lost = self.dirty = self.write_paused = False
        self.lost_exc: BaseException | None = None
        self.drain_waiter: asyncio.Future[None] | None = None
        self.parsed: _Parsed | None = None
        self.parser: Any = None
        self.head_only = self.reused = False
        self.received = 0
        self.waiter: asyncio.Future[None] | None = None
        self.outcome: Any = None
        self.last_data = 0.0
        self.read_timeout: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        # The `_Parsed` (and its parser) of the last exchange when that parser stands where a new one starts:
        # it parsed exactly one message, to its end, with keep-alive, and the connection went back to the pool.
        self.spare: _Parsed | None = None
        self.poller: Any = None  # `select.poll` object watching the socket for input (`_unread`)

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            self.dirty = True  # bytes nothing asked for (after the answer, or while idle): never reused
            return
        self.received += len(data)
        self.last_data = self.loop.time()
        parsed = self.parsed
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if parsed.complete:  # type: ignore[union-attr]  # the answer is whole; what follows it is not ours
                self.dirty = True
                self._finish(None)
            else:
                self._finish(_UPGRADE)
            return
        except httptools.HttpParserError as exc:
            if parsed.complete:  # type: ignore[union-attr]  # junk after a whole answer: the answer stands
                self.dirty = True
                self._finish(None)
            else:
                self._finish(("parse", exc))
            return
        if parsed.extra:  # type: ignore[union-attr]  # another message began after the answer: never reused
            self.dirty = True
        if parsed.too_large:  # type: ignore[union-attr]
            self._finish(_TOO_LARGE)
        elif parsed.headers_too_large:  # type: ignore[union-attr]
            self._finish(_HEADERS_TOO_LARGE)
        elif parsed.informational > MAX_INFORMATIONAL:  # type: ignore[union-attr]
            self._finish(_TOO_MANY_INFORMATIONAL)
        elif parsed.complete or (self.head_only and parsed.headers_done):  # type: ignore[union-attr]
            self._finish(None)

    def eof_received(self) -> bool:
        self.eof = True
        self._ended()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self.lost = self.eof = True
        self.lost_exc = exc
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if exc is None:
                self._ended()
            elif self.reused and self.received == 0:
                self._finish(_STALE)
            else:
                self._finish(("read", exc))
        drain = self.drain_waiter
        if drain is not None and not drain.done():
            drain.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain = self.drain_waiter
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- the exchange ----------------------------------------------------------------------------
    def _ended(self) -> None:
        """The backend ended the connection (EOF) during an exchange."""
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        parsed = self.parsed
        if self.reused and self.received == 0:
            self._finish(_STALE)
        elif parsed is not None and parsed.headers_done and not _framed(parsed.headers):
            self._finish(None)  # body delimited by the end of the connection (RFC 9112 §6.3, rule 8)
        else:
            self._finish(_MID_RESPONSE)

    def _finish(self, outcome: Any) -> None:
        self.outcome = outcome
        self.waiter.set_result(None)  # type: ignore[union-attr]

    def _arm_read_deadline(self, read_timeout: float) -> None:
        """Start the read deadline of the exchange about to wait: ``now + read_timeout``, then moved on
        by every `data_received`. Sets a timer only when none runs or the running one is set for later."""
        loop = self.loop
        self.read_timeout = read_timeout
        due = (now := loop.time()) + read_timeout
        self.last_data = now
        timer = self.timer
        if timer is None or self.timer_at > due:
            if timer is not None:
                timer.cancel()
            self.timer = loop.call_at(due, self._read_deadline)
            self.timer_at = due

    def _read_deadline(self) -> None:
        self.timer = None
        waiter, read_timeout = self.waiter, self.read_timeout
        if waiter is None or waiter.done() or read_timeout is None:  # no exchange waiting with a read timeout
            return
        due = self.last_data + read_timeout
        if self.loop.time() >= due:
            self._finish(_READ_TIMEOUT)
        else:  # data came, or a later exchange started, since the timer was set: wait for the rest
            self.timer = self.loop.call_at(due, self._read_deadline)
            self.timer_at = due

    def _stop_timer(self) -> None:
        timer = self.timer
        if timer is not None:
            self.timer = None
            timer.cancel()

    async def drain(self) -> None:
        """Wait while the transport's buffer is over its high-water mark (`asyncio.StreamWriter.drain`):
        raises the connection's error (`ConnectionResetError` when it has none) once it is lost."""
        if self.transport.is_closing():
            await asyncio.sleep(0)  # let connection_lost run: a failed send closes the transport
        while True:
            if self.lost:
                raise self.lost_exc or ConnectionResetError("Connection lost")
            if not self.write_paused:
                return
            self.drain_waiter = self.loop.create_future()
            await self.drain_waiter

    # -- pool ------------------------------------------------------------------------------------
    def alive(self, now: float, expiry: float) -> bool:
        """Whether this idle connection may carry the next request: not expired, not ended, closing or
        `dirty`, and nothing waiting unread on its socket (`_unread`)."""
        return (now - self.idle_since < expiry and not self.eof and not self.dirty
                and not self.transport.is_closing() and not self._unread())

    def _unread(self) -> bool:
        """Whether the socket has something the event loop has not read yet (bytes, or the end of the
        connection): `data_received` marks bytes that arrive while the connection is idle, but bytes that
        reached the socket since the loop last polled it would otherwise be read as the next request's
        answer. One ``poll(2)`` without waiting. With TLS, any record (a session ticket too) counts.
        True when the socket cannot be polled (no file descriptor)."""
        poller = self.poller
        try:
            if poller is None:  # made once per connection, at its first reuse
                poller = self.poller = select.poll()
                poller.register(self.transport.get_extra_info("socket").fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (AttributeError, OSError, ValueError):
            return True

    def close(self) -> None:
        self._stop_timer()
        try:
            self.transport.close()
        except Exception:
            pass


class Http1Transport(httpx.AsyncBaseTransport):
    """Pooled HTTP/1.1 to one ``http://host:port`` or ``https://host:port`` origin. `max_connections` ≥ 1,
    `keepalive_expiry` seconds, `max_response_bytes` bytes; `ssl_context` for ``https://`` (`client_tls_context`;
    default ``ssl.create_default_context()``: the system's trust store, host names verified)."""

    def __init__(self, *, max_connections: int = 64, keepalive_expiry: float = 2.0,
                 max_response_bytes: int = 64 * 1024 * 1024, ssl_context: ssl.SSLContext | None = None) -> None:
        self._max = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: deque[_Connection] = deque()
        # The pool's slots (one per connection in use): `_free` counts the free ones; `_waiters` are the
        # requests waiting for one, first come first served, each a future resolved when a slot is handed
        # to it (`_release`). A request takes a free slot at once only when nobody waits.
        self._free = max_connections
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._expiry = keepalive_expiry
        self._cap = max_response_bytes
        self._ssl = ssl_context
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        scheme = request.url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"only http:// and https:// backends are supported, not {scheme}://",
                                            request=request)
        body = await request.aread()
        retryable = request.method.encode() in IDEMPOTENT_METHODS or request.extensions.get("memwarden.idempotent") is True
        tls = scheme == "https"
        status, headers, content = await self.send(
            request.method, self._head(request, len(body)), body, request.extensions.get("timeout", {}),
            retryable, request.url.host, request.url.port or (443 if tls else 80), request, tls=tls)
        if any(name.lower() == b"content-encoding" for name, _ in headers):
            # The body as received, still encoded: a stream, so that httpx does not decode it here in full;
            # `decode_body` decodes it under the cap (the forward stage); httpx's own reading decodes it unbounded.
            return httpx.Response(status, headers=headers, stream=httpx.ByteStream(content), request=request,
                                  extensions={"http_version": b"HTTP/1.1"})
        return httpx.Response(status, headers=headers, content=content, request=request,
                              extensions={"http_version": b"HTTP/1.1"})

    async def send(self, method: str, head: bytes, body: bytes, timeouts: dict[str, float | None], retryable: bool,
                   host: str, port: int, request: httpx.Request | None = None, *, tls: bool = False
                   ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One exchange without httpx's request and response objects (the forward stage's hot path):
        `head` is the request line and headers as sent (`_head`), `body` the content, `timeouts` httpx's
        timeout extension (seconds per phase), `retryable` whether a stale pooled connection may be
        retried (see the module docstring), `tls` whether a new connection is made with TLS (``https://``).
        Returns (status, raw response headers, body as received: still content-encoded, `decode_body`).
        Raises the httpx exceptions of `handle_async_request` (attributed to `request` when given)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections and the slots' futures belong to one event loop
            for conn in self._idle:
                conn.close()
            self._idle.clear()
            self._free, self._waiters = self._max, deque()
            self._loop = loop
        if self._free > 0 and not self._waiters:
            self._free -= 1
        else:  # every connection busy (or others waiting first): wait, at most the pool timeout
            await self._acquire(loop, timeouts.get("pool"), request)
        try:
            for attempt in (0, 1):
                conn = self._pooled() or await self._connection(request, host, port, timeouts.get("connect"), tls)
                try:
                    response, keep = await self._exchange(request, method, conn, head, body, timeouts)
                except _StaleConnection as exc:
                    conn.close()
                    if retryable and attempt == 0:
                        continue
                    raise httpx.RemoteProtocolError("the backend closed the connection before answering",
                                                    request=request) from exc
                except BaseException:
                    conn.close()
                    raise
                if keep and not self._closed:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:
                    conn.close()
                return response
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._release()

    async def _acquire(self, loop: asyncio.AbstractEventLoop, timeout: float | None,
                       request: httpx.Request | None) -> None:
        """Wait for a slot handed over by `_release`, at most `timeout` seconds (`httpx.PoolTimeout`).
        Cancelled or timed out after a slot was handed over, the slot is passed on."""
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():  # a slot was ours: the next waiter's, or free
                self._release()
            else:
                waiter.cancel()
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout("no backend connection free in time", request=request) from exc
            raise

    def _release(self) -> None:
        """Give a slot back: to the first request still waiting, else to the free ones."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    @staticmethod
    def _head(request: httpx.Request, length: int) -> bytes:
        return Http1Transport.head(request.method, request.url.raw_path, request.headers.raw, length)

    @staticmethod
    def head(method: str, target: bytes, raw_headers: list[tuple[bytes, bytes]], length: int) -> bytes:
        """The request line and headers sent for `method` `target` with `raw_headers` (httpx's
        ``Request.headers.raw``) and a body of `length` bytes: framing headers of the caller dropped,
        ``Content-Length`` set to `length` (added when absent, unless a bodiless GET/HEAD/DELETE/OPTIONS)."""
        lines = [method.encode(), b" ", target, b" HTTP/1.1\r\n"]
        has_length = False
        for name, value in raw_headers:
            lower = name.lower()
            if lower in (b"transfer-encoding", b"connection", b"keep-alive", b"expect", b"upgrade"):
                continue
            if lower == b"content-length":
                has_length = True
                value = str(length).encode()
            lines += [name, b": ", value, b"\r\n"]
        if not has_length and (length or method not in ("GET", "HEAD", "DELETE", "OPTIONS")):
            lines.append(b"Content-Length: %d\r\n" % length)
        lines.append(b"\r\n")
        return b"".join(lines)

    def _pooled(self) -> _Connection | None:
        """The most recently used idle connection still alive (closing the dead ones met first), or None."""
        idle = self._idle
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.alive(now, self._expiry):
                return conn
            conn.close()
        return None

    async def _connection(self, request: httpx.Request | None, host: str, port: int, timeout: float | None,
                          tls: bool = False) -> _Connection:
        """A pooled connection (`_pooled`), else a new one (with TLS when `tls`: the handshake, the certificate
        and host name verification within the ``connect`` timeout)."""
        conn = self._pooled()
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        context = None
        if tls:
            context = self._ssl
            if context is None:
                context = self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(timeout):
                if context is None:
                    _, conn = await loop.create_connection(lambda: _Connection(loop), host, port)
                else:
                    _, conn = await loop.create_connection(lambda: _Connection(loop), host, port, ssl=context,
                                                           server_hostname=host)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("backend connect timed out", request=request) from exc
        except ssl.SSLCertVerificationError as exc:
            raise TLSVerificationFailed(exc.verify_message or exc.reason or str(exc), request=request) from exc
        except ssl.SSLError as exc:
            raise httpx.ConnectError(f"TLS handshake with the backend failed: {exc.reason or exc}", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"backend connect failed: {exc.strerror or exc}", request=request) from exc
        return conn

    async def _exchange(self, request: httpx.Request | None, method: str, conn: _Connection, head: bytes, body: bytes,
                        timeouts: dict[str, float | None]) -> tuple[tuple[int, list[tuple[bytes, bytes]], bytes], bool]:
        reused, conn.used = conn.used, True
        parsed = conn.spare
        if parsed is None:
            parsed = _Parsed(self._cap)
            parsed.parser = httptools.HttpResponseParser(parsed)
        else:  # the last exchange's parser, at a message boundary: as a new one would start
            conn.spare = None
            parsed.reset()
        conn.parser = parsed.parser
        conn.parsed, conn.head_only, conn.reused, conn.received, conn.outcome = parsed, method == "HEAD", reused, 0, None
        waiter = conn.waiter = conn.loop.create_future()
        transport = conn.transport
        try:
            transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                transport.write(body)
            # Nothing to wait for unless the buffer is over its high-water mark, and nothing to raise
            # unless the transport is closing (a failed send closes it): only then drain, under the timeout.
            if conn.write_paused or transport.is_closing():
                async with asyncio.timeout(timeouts.get("write")):
                    await conn.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("backend write timed out", request=request) from exc
        except OSError as exc:
            if reused:
                raise _StaleConnection() from exc
            raise httpx.WriteError(f"backend write failed: {exc}", request=request) from exc
        if not waiter.done():
            read_timeout = conn.read_timeout = timeouts.get("read")
            if read_timeout is not None:
                conn._arm_read_deadline(read_timeout)
            await waiter  # a timer left running finds no exchange waiting, or this one's deadline
        conn.parsed = conn.parser = None
        outcome = conn.outcome
        if outcome is not None:
            if outcome == _STALE:
                raise _StaleConnection()
            if outcome == _READ_TIMEOUT:
                raise httpx.ReadTimeout("backend read timed out", request=request)
            if outcome == _TOO_LARGE:
                raise ResponseTooLarge(f"the backend's answer is over the response cap of {self._cap} bytes "
                                       "(MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES)", request=request)
            if outcome == _HEADERS_TOO_LARGE:
                raise ResponseTooLarge(f"the backend's answer headers are over {MAX_HEADER_BYTES} bytes", request=request)
            if outcome == _TOO_MANY_INFORMATIONAL:
                raise httpx.RemoteProtocolError(f"the backend sent over {MAX_INFORMATIONAL} informational (1xx) answers",
                                                request=request)
            if outcome == _UPGRADE:
                raise httpx.RemoteProtocolError("the backend asked for a protocol upgrade", request=request)
            if outcome == _MID_RESPONSE:
                raise httpx.RemoteProtocolError("the backend closed the connection mid-response", request=request)
            kind, exc = outcome
            if kind == "parse":
                raise httpx.RemoteProtocolError(f"the backend's answer is not HTTP/1.1: {exc}", request=request) from exc
            raise httpx.ReadError(f"backend read failed: {exc}", request=request) from exc
        headers = parsed.headers
        keep = parsed.complete and parsed.keep_alive and not conn.dirty and _framed(headers)
        answer = (parsed.status, headers, b"".join(parsed.body))  # the final answer's, not a later message's
        if keep and parsed.begun == 1:  # one message, parsed to its end: the parser is where a new one starts
            parsed.headers = parsed.body = None  # type: ignore[assignment]  # an idle connection holds no answer
            conn.spare = parsed
        return answer, keep


def _framed(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the body length is known from the headers (Content-Length or chunked)."""
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            return True
    return False



def client_tls_context(ca_bundle: str | os.PathLike[str] | None = None, client_cert: str | os.PathLike[str] | None = None,
                       client_key: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """The TLS context of connections to an ``https://`` backend: `ssl.create_default_context` (certificate and
    host name verification on, the standard library's protocol floor), trusting the CA certificates of the PEM
    file `ca_bundle` (else the system's trust store), presenting `client_cert` (PEM; its key in `client_key`, or in
    the same file) when given (mutual TLS). Raises `FileNotFoundError` for a missing file and `ssl.SSLError` for one
    that is not a certificate (or key) in PEM."""
    context = ssl.create_default_context(cafile=os.fspath(ca_bundle) if ca_bundle is not None else None)
    if client_cert is not None:
        context.load_cert_chain(os.fspath(client_cert), os.fspath(client_key) if client_key is not None else None)
    return context


class UnsupportedEncoding(httpx.DecodingError):
    """The backend's answer carries a ``Content-Encoding`` that is not decoded here (only gzip, deflate, identity)."""


def decode_body(headers: list[tuple[bytes, bytes]], body: bytes, cap: int) -> bytes:
    """`body` decoded by the answer's ``Content-Encoding`` headers `headers` (raw; in the order applied: decoded
    last first): ``gzip`` / ``x-gzip`` (every member of the stream), ``deflate`` (zlib-wrapped, or raw as some
    servers send it), ``identity``. Each step produces at most `cap` bytes: decompression stops there
    (``zlib`` ``max_length``), so a small answer that inflates beyond the cap never does so in memory.
    Returns `body` itself when there is no encoding or it is empty. Raises `ResponseTooLarge` when a decoded form is over `cap`
    bytes, `UnsupportedEncoding` for another encoding (``br``, ``zstd``, ...), and `httpx.DecodingError` for
    data that is not what it says (corrupt or truncated)."""
    if not body:  # nothing to decode (a 204, an answer to HEAD)
        return body
    codings: list[bytes] = []
    for name, value in headers:
        if name.lower() == b"content-encoding":
            codings += [c.strip().lower() for c in value.split(b",")]
    for coding in reversed(codings):
        if coding in (b"", b"identity"):
            continue
        if coding in (b"gzip", b"x-gzip"):
            body = _inflate(body, 16 + zlib.MAX_WBITS, cap, members=True)
        elif coding == b"deflate":
            try:
                body = _inflate(body, zlib.MAX_WBITS, cap)
            except httpx.DecodingError:
                body = _inflate(body, -zlib.MAX_WBITS, cap)
        else:
            raise UnsupportedEncoding(f"the backend's answer is encoded as {coding.decode('latin-1')!r}, which is not decoded "
                                      "(gzip, deflate and identity are)")
    return body


def _inflate(data: bytes, wbits: int, cap: int, members: bool = False) -> bytes:
    """zlib stream(s) `data` (`wbits` as `zlib.decompressobj`) inflated to at most `cap` bytes: `ResponseTooLarge`
    beyond, `httpx.DecodingError` for corrupt or truncated data. `members`: streams following one another (gzip)."""
    out: list[bytes] = []
    size = 0
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            chunk = inflater.decompress(data, cap - size + 1)
            size += len(chunk)
            if size > cap or inflater.unconsumed_tail:
                raise ResponseTooLarge(f"the backend's answer decoded is over the response cap of {cap} bytes "
                                       "(MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES)")
            out.append(chunk)
            if not inflater.eof:
                raise httpx.DecodingError("the backend's compressed answer is truncated")
        except zlib.error as exc:
            raise httpx.DecodingError(f"the backend's compressed answer is corrupt: {exc}") from exc
        data = inflater.unused_data
        if not members or not data:
            if data:
                raise httpx.DecodingError("the backend's compressed answer has bytes after its end")
            return b"".join(out)
