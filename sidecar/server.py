"""The HTTP server under the sidecar: uvicorn's httptools protocol with the connection bounds uvicorn lacks.

uvicorn (0.2x–0.5x) bounds only the idle time *between* requests of a kept-alive connection
(``timeout_keep_alive``, armed after a response) and the number of connections+tasks answered 503
(``limit_concurrency``, which still accepts the connection and counts idle sockets against working
ones). It has no deadline for a connection that never sends a byte, for the request line and headers,
or for the body (uvicorn issue #157 lists ``--timeout-request-start``/``--timeout-request-complete`` as
not built; ``timeout_keep_alive`` is reset by every byte received), so slow or half-open clients hold
file descriptors for ever. `guarded_protocol`
returns a subclass of `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` adding, per
connection (all times in seconds, from `Settings`):

- ``idle_timeout_s``: a new connection, or a kept-alive one between requests, that sends nothing for
  this long is closed (no response: there is no request to answer);
- ``header_timeout_s``: from the first byte of a request, the request line and every header must have
  arrived within this time, else ``408`` and close (slowloris);
- ``max_connections``: when a new connection would exceed it, the connection that has waited longest
  *without a request in flight* (idle, or still sending headers) is closed to make room; if every
  connection has a request in flight the new one is answered ``503`` and closed. So clients that send
  a request promptly keep being served while slow ones hold sockets;
- the raw request target: uvicorn hands ASGI only the path of ``httptools.parse_url(target)``, so an
  absolute-form target (``GET http://host/api/...``, RFC 9112 §3.2.2) or a ``#fragment`` (never sent by
  a conforming client, RFC 9110 §7.1) would reach the application looking like a plain path. The raw
  target is passed in ``scope["extensions"]["memwarden"]["target"]`` and the canonicalize stage refuses
  anything but origin-form without a fragment (400).

The body deadline (``body_timeout_s``, 408) and the in-flight bound (``max_inflight_requests``, 503)
are kept by `sidecar.app.PipelineMiddleware`, where the ASGI ``receive`` and the request task are.

Per request, the subclass runs uvicorn 0.55's own parser callbacks (``data_received``,
``on_message_begin``, ``on_headers_complete``) as one method each with the guards folded in, instead of the
guard calling ``super()``: the same scope, cycle and task, the same refusals. One shortcut: a request target
made only of ``/`` and the characters of `_PLAIN_TARGET` (no ``?``, ``#``, spaces, controls or non-ASCII;
every Chroma and Mem0 path) is its own path with an empty query, which is what ``httptools.parse_url``
returns for it, so it is not parsed again. On any other uvicorn release the guards wrap uvicorn's callbacks
through ``super()`` as before (``tests/unit/test_server_callbacks.py`` compares both with uvicorn's own).
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

# The uvicorn release whose parser callbacks the guarded protocol folds its guards into (`guarded_protocol`).
_FOLDED_RELEASE = "0.55."

# A request target that is its own path for ``httptools.parse_url`` (no query, no fragment, no authority):
# ``/`` then RFC 3986 path characters (unreserved, sub-delims, ``:``, ``@``, ``/``, ``%``) only.
_PLAIN_TARGET = re.compile(rb"/[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*").fullmatch


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds of one listener. Seconds for the timeouts; counts for the connection bound."""

    idle_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    max_connections: int = 512


def _response(status: int, reason: str, message: str) -> bytes:
    body = ('{"error":"%s","message":"%s"}' % (reason, message)).encode("ascii")
    return (f"HTTP/1.1 {status} {reason.replace('_', ' ').title()}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode("ascii") + body


REQUEST_TIMEOUT = _response(408, "request_timeout", "request headers not received in time")
OVERLOADED = _response(503, "overloaded", "too many connections; retry")


_COALESCE_MAX = 256 * 1024  # bytes: a longer write is not joined to the held one


class CoalescingTransport:
    """The connection's transport as uvicorn's protocol sees it: a write is held until the next write or
    the end of the current event-loop turn, so a response's head and body (two ``write`` calls in
    uvicorn) leave in one ``send`` system call and one TCP segment instead of two. Order is kept; `close`
    sends what is held first; `abort` drops it as it drops the transport's buffer; a held write is sent
    when the loop next runs its ready callbacks. Everything else is the transport's own."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        elif len(data) > _COALESCE_MAX:  # a large body is not copied: two writes, in order
            self._held = None
            self._transport.write(held)
            self._transport.write(data)
        else:
            self._held = None
            self._transport.write(held + data)

    def write_now(self, data: bytes) -> None:
        """Write `data` after what is held, now (a whole response: nothing to wait for)."""
        held = self._held
        if held is None:
            self._transport.write(data)
        else:
            self.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    # Called per request by uvicorn's protocol and cycle: defined here rather than found by `__getattr__`.
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def target_parts(url: bytes) -> tuple[bytes, bytes]:
    """(path, query) of a request target as uvicorn takes them from ``httptools.parse_url(url)`` (``path``,
    ``query or b""``). Raises ``httptools.HttpParserInvalidURLError`` as `parse_url` does."""
    if _PLAIN_TARGET(url) is not None:
        return url, b""
    parsed = httptools.parse_url(url)
    return parsed.path, parsed.query or b""


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """An `HttpToolsProtocol` subclass enforcing `limits` (see the module docstring), for
    ``uvicorn.run(app, http=guarded_protocol(limits))``."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _limits = limits

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # One deadline per connection (idle, or headers), kept as a value: `_due` (loop time) and
            # `_on_due` (what to do then), or None when nothing is due. At most one timer handle runs,
            # `_timer`, set for `_timer_at` <= `_due`; when it fires before `_due` (the deadline moved
            # later since) it is set again for the rest, so a request moves the value, not a timer.
            self._due: float | None = None
            self._on_due: Any = None
            self._timer: asyncio.TimerHandle | None = None
            self._timer_at = 0.0
            self._waiting_since = time.monotonic()
            self._in_flight = False
            # The client certificate of a TLS connection, as ``SSLObject.getpeercert()`` gives it (verified by the
            # listener's client CA; empty when none was sent), None on a cleartext one: read once per connection
            # (the handshake is done when `connection_made` runs), handed to each request under
            # ``extensions["memwarden"]["peercert"]`` (`sidecar.tls`).
            self._peercert: dict[str, Any] | None = None

        # -- timers ------------------------------------------------------------------------------
        def _arm(self, seconds: float, handler: Any) -> None:
            loop = self.loop
            due = loop.time() + seconds
            self._due = due
            self._on_due = handler
            timer = self._timer
            if timer is None or self._timer_at > due:  # no timer, or one set for later than the new deadline
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_later(seconds, self._fire)
                self._timer_at = due

        def _disarm(self) -> None:
            self._due = None  # a running timer finds nothing due when it fires

        def _fire(self) -> None:
            self._timer = None
            due = self._due
            if due is None:
                return
            loop = self.loop
            rest = due - loop.time()
            if rest > 0:  # the deadline moved since the timer was set: wait for the rest (at least 1 ms,
                # uvloop's granularity, so a timer rounded short is not set again and again for nothing)
                rest = max(rest, 0.001)
                self._timer = loop.call_later(rest, self._fire)
                self._timer_at = due
                return
            self._due = None
            self._on_due()

        def _stop_timer(self) -> None:
            self._due = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _close_idle(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

        def _headers_too_slow(self) -> None:
            if not self.transport.is_closing():
                self.transport.write(REQUEST_TIMEOUT)
                self.transport.close()

        def _evictable(self) -> bool:
            return not self._in_flight and not self.transport.is_closing()

        # -- connection --------------------------------------------------------------------------
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._peercert = transport.get_extra_info("peercert")
            super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
            if len(self.connections) > self._limits.max_connections:
                waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol)
                           and c._evictable()]
                if waiting:
                    oldest = min(waiting, key=lambda c: c._waiting_since)
                    oldest._stop_timer()
                    oldest.transport.close()
                else:
                    transport.write(OVERLOADED)
                    transport.close()
                    return
            self._arm(self._limits.idle_timeout_s, self._close_idle)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            super().connection_lost(exc)

        # -- parser callbacks --------------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._waiting_since = time.monotonic()
            self._arm(self._limits.header_timeout_s, self._headers_too_slow)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_flight = True
            self.scope.setdefault("extensions", {})["memwarden"] = {  # type: ignore[typeddict-item]
                "target": bytes(self.url), "peercert": self._peercert}
            super().on_headers_complete()

        if uvicorn.__version__.startswith(_FOLDED_RELEASE):
            # uvicorn 0.55's callbacks with the guards above folded in (no ``super()`` chain), and
            # `target_parts` for ``httptools.parse_url``: the same scope, cycle, task and refusals.
            def data_received(self, data: bytes) -> None:
                # uvicorn's, without `_unset_keepalive_if_required`: its keep-alive timer is never armed here
                # (`on_response_complete` arms ours instead), so there is none to cancel.
                try:
                    self.parser.feed_data(data)
                except httptools.HttpParserError:
                    msg = "Invalid HTTP request received."
                    self.logger.warning(msg)
                    self.send_400_response(msg)
                    return
                except httptools.HttpParserUpgrade:
                    if self._should_upgrade():
                        self.handle_websocket_upgrade()
                    else:
                        self._unsupported_upgrade_warning()

            def on_message_begin(self) -> None:
                self.url = b""
                self.expect_100_continue = False
                self.headers = []
                self.scope = {  # type: ignore[typeddict-item]
                    "type": "http",
                    "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
                    "http_version": "1.1",
                    "server": self.server,
                    "client": self.client,
                    "scheme": self.scheme,  # type: ignore[typeddict-item]
                    "root_path": self.root_path,
                    "headers": self.headers,
                    "state": self.app_state.copy(),
                }
                self._waiting_since = time.monotonic()
                self._arm(self._limits.header_timeout_s, self._headers_too_slow)

            def on_headers_complete(self) -> None:
                self._due = None  # `_disarm`
                self._in_flight = True
                scope = self.scope
                url = self.url
                scope["extensions"] = {"memwarden": {"target": url, "peercert": self._peercert}}  # type: ignore[typeddict-unknown-key]
                parser = self.parser
                http_version = parser.get_http_version()
                scope["method"] = parser.get_method().decode("ascii")
                if http_version != "1.1":
                    scope["http_version"] = http_version
                if parser.should_upgrade() and self._should_upgrade():
                    return
                raw_path, query = target_parts(url)
                path = raw_path.decode("ascii")
                if "%" in path:
                    path = urllib.parse.unquote(path)
                root_path = self.root_path
                scope["path"] = root_path + path
                scope["raw_path"] = root_path.encode("ascii") + raw_path
                scope["query_string"] = query

                limit = self.limit_concurrency
                if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
                    app = service_unavailable
                    message = "Exceeded concurrency limit."
                    self.logger.warning(message)
                else:
                    app = self.app

                existing_cycle = self.cycle
                # uvicorn's keyword arguments, passed by position (no keyword dict per request): scope,
                # transport, flow, logger, access_logger, access_log, default_headers, message_event,
                # expect_100_continue, keep_alive, on_response
                self.cycle = cycle = RequestResponseCycle(
                    scope, self.transport, self.flow, self.logger, self.access_logger, self.access_log,
                    self.server_state.default_headers, asyncio.Event(), self.expect_100_continue,
                    http_version != "1.0" and parser.should_keep_alive(), self.on_response_complete,
                )
                if existing_cycle is None or existing_cycle.response_complete:
                    # `_start_asgi_task`
                    if self.config.reset_contextvars:
                        task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
                    else:
                        task = self.loop.create_task(cycle.run_asgi(app))
                    task.add_done_callback(self.tasks.discard)
                    self.tasks.add(task)
                else:
                    self.flow.pause_reading()
                    self.pipeline.appendleft((cycle, app))

        def on_response_complete(self) -> None:
            if self.pipeline:  # a pipelined request is waiting: uvicorn starts it, so one is in flight again:
                # no idle deadline and not evictable until its response completes (its headers disarmed the
                # header deadline when they arrived)
                super().on_response_complete()
                self._waiting_since = time.monotonic()
                return
            # uvicorn's own, without arming its keep-alive timer (ours, the same bound, replaces it)
            self.server_state.total_requests += 1
            self._in_flight = False
            self._waiting_since = time.monotonic()
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            self._arm(self._limits.idle_timeout_s, self._close_idle)

    return GuardedHttpToolsProtocol
