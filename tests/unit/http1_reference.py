"""The forward transport as it was before h19u (`git show bcc9ca3:sidecar/stages/http1.py`): StreamReader /
StreamWriter, one ``asyncio.timeout`` per pool wait, drain and read. Kept unchanged as the reference
`tests/unit/test_http1.py` runs every documented behaviour against, next to `sidecar.stages.http1`."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any
import httpx
import httptools

IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
_READ_CHUNK = 256 * 1024


from sidecar.stages.http1 import ResponseTooLarge  # the one exception class both raise (the only change)


class _StaleConnection(Exception):
    """A reused connection failed before any byte of the response: the backend had closed it."""


class _Parsed:
    """httptools callbacks collecting one response."""

    __slots__ = ("parser", "headers", "body", "size", "cap", "headers_done", "complete", "too_large", "keep_alive")

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

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.cap:
            self.too_large = True
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # llhttp resets it once the message is done


class _Connection:
    __slots__ = ("reader", "writer", "idle_since", "used")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()
        self.used = False

    def alive(self, now: float, expiry: float) -> bool:
        return (now - self.idle_since < expiry and not self.reader.at_eof()
                and not self.writer.is_closing() and not self.reader._buffer)  # type: ignore[attr-defined]

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:
            pass


class Http1Transport(httpx.AsyncBaseTransport):
    """Pooled HTTP/1.1 to one ``http://host:port`` origin. `max_connections` ≥ 1, `keepalive_expiry`
    seconds, `max_response_bytes` bytes."""

    def __init__(self, *, max_connections: int = 64, keepalive_expiry: float = 2.0,
                 max_response_bytes: int = 64 * 1024 * 1024) -> None:
        self._max = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: deque[_Connection] = deque()
        self._slots = asyncio.Semaphore(max_connections)
        self._expiry = keepalive_expiry
        self._cap = max_response_bytes
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"only http:// backends are supported, not {request.url.scheme}://", request=request)
        body = await request.aread()
        retryable = request.method.encode() in IDEMPOTENT_METHODS or request.extensions.get("memwarden.idempotent") is True
        status, headers, content = await self.send(
            request.method, self._head(request, len(body)), body, request.extensions.get("timeout", {}),
            retryable, request.url.host, request.url.port or 80, request)
        return httpx.Response(status, headers=headers, content=content, request=request,
                              extensions={"http_version": b"HTTP/1.1"})

    async def send(self, method: str, head: bytes, body: bytes, timeouts: dict[str, float | None], retryable: bool,
                   host: str, port: int, request: httpx.Request | None = None
                   ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One exchange without httpx's request and response objects (the forward stage's hot path):
        `head` is the request line and headers as sent (`_head`), `body` the content, `timeouts` httpx's
        timeout extension (seconds per phase), `retryable` whether a stale pooled connection may be
        retried (see the module docstring). Returns (status, raw response headers, body). Raises the
        httpx exceptions of `handle_async_request` (attributed to `request` when given)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections and the semaphore belong to one event loop
            for conn in self._idle:
                conn.close()
            self._idle.clear()
            self._slots = asyncio.Semaphore(self._max)
            self._loop = loop
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no backend connection free in time", request=request) from exc
        try:
            for attempt in (0, 1):
                conn = await self._connection(request, host, port, timeouts.get("connect"))
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
            self._slots.release()

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

    async def _connection(self, request: httpx.Request | None, host: str, port: int, timeout: float | None) -> _Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.alive(now, self._expiry):
                return conn
            conn.close()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=_READ_CHUNK)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("backend connect timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"backend connect failed: {exc.strerror or exc}", request=request) from exc
        return _Connection(reader, writer)

    async def _exchange(self, request: httpx.Request | None, method: str, conn: _Connection, head: bytes, body: bytes,
                        timeouts: dict[str, float | None]) -> tuple[tuple[int, list[tuple[bytes, bytes]], bytes], bool]:
        reused, conn.used = conn.used, True
        try:
            conn.writer.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                conn.writer.write(body)
            async with asyncio.timeout(timeouts.get("write")):
                await conn.writer.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("backend write timed out", request=request) from exc
        except OSError as exc:
            if reused:
                raise _StaleConnection() from exc
            raise httpx.WriteError(f"backend write failed: {exc}", request=request) from exc
        parsed = _Parsed(self._cap)
        parser = parsed.parser = httptools.HttpResponseParser(parsed)
        received = 0
        read_timeout = timeouts.get("read")
        head_only = method == "HEAD"
        while not parsed.complete and not (head_only and parsed.headers_done):
            try:
                async with asyncio.timeout(read_timeout):
                    data = await conn.reader.read(_READ_CHUNK)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("backend read timed out", request=request) from exc
            except OSError as exc:
                if reused and received == 0:
                    raise _StaleConnection() from exc
                raise httpx.ReadError(f"backend read failed: {exc}", request=request) from exc
            if not data:
                if reused and received == 0:
                    raise _StaleConnection()
                if parsed.headers_done and not _framed(parsed.headers):
                    break  # body delimited by the end of the connection (RFC 9112 §6.3, rule 8)
                raise httpx.RemoteProtocolError("the backend closed the connection mid-response", request=request)
            received += len(data)
            try:
                parser.feed_data(data)
            except httptools.HttpParserUpgrade as exc:
                raise httpx.RemoteProtocolError("the backend asked for a protocol upgrade", request=request) from exc
            except httptools.HttpParserError as exc:
                raise httpx.RemoteProtocolError(f"the backend's answer is not HTTP/1.1: {exc}", request=request) from exc
            if parsed.too_large:
                raise ResponseTooLarge(f"backend answer over {self._cap} bytes", request=request)
        keep = parsed.complete and parsed.keep_alive and not conn.reader._buffer  # type: ignore[attr-defined]
        return (parser.get_status_code(), parsed.headers, b"".join(parsed.body)), keep and _framed(parsed.headers)


def _framed(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the body length is known from the headers (Content-Length or chunked)."""
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            return True
    return False

