"""The HTTP server under the sidecar: uvicorn's httptools protocol with the connection bounds uvicorn lacks.

uvicorn (0.2x–0.5x) bounds only the idle time *between* requests of a kept-alive connection
(``timeout_keep_alive``, armed after a response) and the number of connections+tasks answered 503
(``limit_concurrency``, which still accepts the connection and counts idle sockets against working
ones). It has no deadline for a connection that never sends a byte, for the request line and headers,
or for the body (uvicorn issue #157 lists ``--timeout-request-start``/``--timeout-request-complete`` as
not built; ``timeout_keep_alive`` is reset by every byte received), so slow or half-open clients hold
file descriptors for ever. Nor does it bound pipelining: everything one read delivers (256 KiB) is parsed
at once, each request queued with its scope and cycle, and reading resumes as soon as a request reads its
body, so a client that pipelines thousands of requests and never reads the answers makes the process hold
every queued request and every unsent answer (issue 34: 45 such sockets took the sidecar from 128 MiB to
1.4 GiB and starved every other client). `guarded_protocol` returns a subclass of
`uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` adding, per connection (all times in seconds,
sizes in bytes, from `Settings`):

- ``idle_timeout_s``: a new connection, or a kept-alive one between requests, that sends nothing for
  this long is closed (no response: there is no request to answer);
- ``header_timeout_s``: from the first byte of a request, the request line and every header must have
  arrived within this time, else ``408`` and close (slowloris);
- ``max_head_bytes``: a request's line and headers (its head, up to the CRLF CRLF) longer than this are
  answered ``431`` and the connection closed, before the rest arrives (the parser buffers a header until it is
  complete, so without a bound one header could take any amount of memory within the header deadline; Envoy's
  default is 60 KiB, Node's 16 KiB);
- ``max_pipelined_requests``: at most this many requests of one connection are outstanding (begun and not
  yet answered: running, queued behind the one running, or still arriving). Received bytes are handed to
  the parser in steps that cannot begin more requests than the room left (a request is at least
  `MIN_REQUEST_BYTES` long; the rest of a request's head, up to its CRLF CRLF, and a body of known length
  are one step each); at the bound the request being parsed is parsed to its end, the rest is held,
  unparsed, reading stops (``transport.pause_reading``), and both resume as answers complete. So a
  connection costs at most this many parsed requests waiting for (or getting) their answers, the head of
  one more, and one read (256 KiB) of held bytes, whatever it sends;
- ``max_unsent_bytes``: the transport's write-buffer high-water mark (``set_write_buffer_limits``). Above
  it uvicorn's ``send`` waits for the client to read (``pause_writing``), and the connection stops reading
  and parsing: no new request is started for a client that does not take its answers. The bytes queued on a
  connection are then at most this plus the answer being written (an answer is written whole, and
  bounded by ``BACKEND_MAX_RESPONSE_BYTES``) plus the kernel's socket buffer;
- ``write_timeout_s``: a connection whose output stays above ``max_unsent_bytes`` (writing paused) for this
  long, or that is closing with output still unsent for this long, is aborted (``transport.abort``: its
  buffer dropped, the socket reset). The deadline runs from the moment writing paused, so a close while
  it runs does not extend it;
- ``max_connections``: when a new connection would exceed it, a connection is closed to make room:
  first the one stalled longest (its write deadline running: writing paused, or closing with output
  unsent), aborted; else the one that has waited longest *without a request in flight* (idle, or still
  sending headers), closed; if every connection has a request in flight and none is stalled the new one
  is answered ``503`` and closed. So clients that send a request promptly and read their answers keep
  being served while slow ones hold sockets;
- the raw request target: uvicorn hands ASGI only the path of ``httptools.parse_url(target)``, so an
  absolute-form target (``GET http://host/api/...``, RFC 9112 §3.2.2) or a ``#fragment`` (never sent by
  a conforming client, RFC 9110 §7.1) would reach the application looking like a plain path. The raw
  target is passed in ``scope["extensions"]["memwarden"]["target"]`` and the canonicalize stage refuses
  anything but origin-form without a fragment (400).

The body deadline (``body_timeout_s``, 408) and the in-flight bound (``max_inflight_requests``, 503)
are kept by `sidecar.app.PipelineMiddleware`, where the ASGI ``receive`` and the request task are.

The subclass calls uvicorn's own parser callbacks through ``super()`` (the scope, the cycle, the task, the
pipelined queue and the refusals are uvicorn's); it replaces ``data_received`` (uvicorn's, feeding the parser
in bounded steps) and replaces uvicorn's keep-alive timer by its idle deadline. It relies on the attributes
uvicorn's protocol keeps (``parser``, ``pipeline``, ``flow``, ``headers``, ``url``, ``scope``) and on
``transport.pause_reading``/``set_write_buffer_limits``/``get_write_buffer_size``/``abort`` (asyncio's public
transport API, also uvloop's). ``tests/unit/test_server_callbacks.py`` compares it with stock uvicorn byte for byte.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, fields
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The shortest request llhttp parses, in bytes: a three-letter method, a one-character target, ``HTTP/1.1``
# and the two CRLFs (``GET / HTTP/1.1\r\n\r\n`` is 18; it refuses a bare LF and a missing version, and an
# HTTP/1.0 request ends its connection). One less, for a margin: `k` bytes begin at most ``ceil(k / 16)``
# requests, so a step of ``room * MIN_REQUEST_BYTES`` bytes cannot begin more than ``room``.
MIN_REQUEST_BYTES = 16


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Bounds of one listener (the module docstring says what each does). Seconds for the timeouts, bytes for
    `max_unsent_bytes`, counts for the others. Raises ValueError for a bound that is not positive."""

    idle_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    max_head_bytes: int = 64 * 1024
    max_connections: int = 512
    max_pipelined_requests: int = 16
    max_unsent_bytes: int = 256 * 1024
    write_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for bound in fields(self):
            if not getattr(self, bound.name) > 0:
                raise ValueError(f"ConnectionLimits.{bound.name} must be positive, not {getattr(self, bound.name)!r}")


def _response(status: int, reason: str, message: str) -> bytes:
    body = ('{"error":"%s","message":"%s"}' % (reason, message)).encode("ascii")
    return (f"HTTP/1.1 {status} {reason.replace('_', ' ').title()}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode("ascii") + body


REQUEST_TIMEOUT = _response(408, "request_timeout", "request headers not received in time")
OVERLOADED = _response(503, "overloaded", "too many connections; retry")
LINGER_S = 2.0  # seconds a connection answered 431 reads and drops input before it is closed
HEAD_TOO_LARGE = _response(431, "request_header_fields_too_large", "request line and headers exceed the size limit")


COALESCE_MAX = 256 * 1024  # bytes: a longer write is not joined to the held one


class CoalescingTransport:
    """The connection's transport as uvicorn's protocol sees it.

    - Writes: a write is held until the next write or the end of the current event-loop turn, so a response's
      head and body (two ``write`` calls in uvicorn) leave in one ``send`` system call and one TCP segment
      instead of two. Order is kept; `close` sends what is held first; `abort` drops it as it drops the
      transport's buffer; a held write is sent when the loop next runs its ready callbacks.
    - Reading: paused while uvicorn's flow control asks for it (`pause_reading`/`resume_reading`) *or* the
      guarded protocol holds it (`hold_reading`), so uvicorn resuming reading (its ``receive`` does, for
      every request) cannot undo a bound of the protocol.
    - The write deadline (`write_timeout_s`, None = none): `start_write_deadline` aborts the connection that
      many seconds later unless `stop_write_deadline` came first; `close` with output still unsent starts
      it (a close waits for the buffer to drain, which a client that does not read never lets happen).
      `stalled_since` is the loop time the running deadline started, or None.

    Everything else is the transport's own."""

    __slots__ = ("_transport", "_loop", "_held", "_flow_paused", "_guard_paused", "_paused", "_write_timeout",
                 "_write_timer", "stalled_since")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 write_timeout_s: float | None = None) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flow_paused = False  # uvicorn's flow control asked to pause reading
        self._guard_paused = False  # the guarded protocol holds reading
        self._paused = False  # reading is paused on the transport
        self._write_timeout = write_timeout_s
        self._write_timer: asyncio.TimerHandle | None = None
        self.stalled_since: float | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        elif len(data) > COALESCE_MAX:  # a large body is not copied: two writes, in order
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

    def write_eof(self) -> None:
        """Send what is held, then end the output (half-close: reading goes on)."""
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        transport = self._transport
        closing = transport.is_closing()
        transport.close()
        if not closing and self._write_timeout is not None and transport.get_write_buffer_size() > 0:
            self.start_write_deadline()

    def abort(self) -> None:
        self._held = None
        self.stop_write_deadline()
        self._transport.abort()

    # -- the write deadline -------------------------------------------------------------------------------
    def start_write_deadline(self) -> None:
        """Abort the connection `write_timeout_s` from now, unless a deadline already runs (it is kept: a
        deadline is never extended) or there is no `write_timeout_s`."""
        if self._write_timer is None and self._write_timeout is not None:
            self.stalled_since = self._loop.time()
            self._write_timer = self._loop.call_later(self._write_timeout, self._write_too_slow)

    def stop_write_deadline(self) -> None:
        timer = self._write_timer
        if timer is not None:
            timer.cancel()
            self._write_timer = None
            self.stalled_since = None

    def _write_too_slow(self) -> None:
        self._write_timer = None
        self._held = None
        self._transport.abort()

    # -- reading ------------------------------------------------------------------------------------------
    def _apply(self) -> None:
        paused = self._flow_paused or self._guard_paused
        if paused != self._paused:
            self._paused = paused
            if paused:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    def pause_reading(self) -> None:
        self._flow_paused = True
        self._apply()

    def resume_reading(self) -> None:
        self._flow_paused = False
        self._apply()

    def hold_reading(self, hold: bool) -> None:
        """Pause reading (`hold`) or stop holding it (reading resumes unless uvicorn's flow control pauses it)."""
        self._guard_paused = hold
        self._apply()

    # Called per request by uvicorn's protocol and cycle: defined here rather than found by `__getattr__`.
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """An `HttpToolsProtocol` subclass enforcing `limits` (see the module docstring), for
    ``uvicorn.run(app, http=guarded_protocol(limits))``."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _limits = limits
        transport: CoalescingTransport  # type: ignore[assignment]  # set by `connection_made`

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
            self._in_headers = False  # a request's first byte has been parsed and its headers have not all come
            self._head_bytes = 0  # bytes of the head being parsed (while `_in_headers`), bounded by max_head_bytes
            self._discarding = False  # a 431 was sent: input is dropped until the connection closes
            self._in_body = False  # a request's headers have been parsed and its body has not all come
            # The pipelining and output bounds.
            self._outstanding = 0  # requests begun (first byte parsed) whose response has not completed
            self._body_left = 0  # bytes of the current request's body (its content-length) not parsed yet
            self._input: bytes | None = None  # received bytes held back by the bounds: unparsed from `_input_at`
            self._input_at = 0
            self._feed_soon = False  # a step of `_feed_held` is scheduled
            self._headers_held = False  # a request's header deadline was lifted while its bytes were held
            self._write_paused = False  # over `max_unsent_bytes` of unsent output
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

        def _head_too_large(self) -> None:
            """The head being parsed is over `max_head_bytes`: 431, then a lingering close. Nothing more of the
            connection is parsed; what the client still sends is read and dropped (so closing with unread input
            does not reset the connection before the client reads the 431) until it stops or
            `LINGER_S` passed, then the connection is closed. Without a half-close (TLS) it is closed at once; with
            earlier requests of the connection still unanswered it is aborted (their answers would follow the 431).
            """
            self._discarding = True
            self._input = None
            transport = self.transport
            if transport.is_closing():
                return
            self.logger.warning("request head over %d bytes: 431", self._limits.max_head_bytes)
            if self._outstanding > 1:  # answers of earlier requests still to come: a 431 now would precede them
                self._disarm()
                transport.abort()
                return
            transport.write(HEAD_TOO_LARGE)
            try:
                half_close = transport.can_write_eof()
            except NotImplementedError:  # a transport that does not say (asyncio.Transport's default)
                half_close = False
            if not half_close:
                transport.close()
                return
            transport.write_eof()
            transport.hold_reading(False)
            self._arm(LINGER_S, transport.close)

        def _evictable(self) -> bool:
            """No request in flight (every request begun is answered, but one whose headers are arriving),
            and not closing already."""
            return self._outstanding == self._in_headers and not self.transport.is_closing()

        # -- connection --------------------------------------------------------------------------
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._peercert = transport.get_extra_info("peercert")
            limits = self._limits
            transport.set_write_buffer_limits(high=limits.max_unsent_bytes)
            super().connection_made(CoalescingTransport(transport, self.loop, limits.write_timeout_s))  # type: ignore[arg-type]
            if len(self.connections) > limits.max_connections:
                others = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol)]
                stalled = [c for c in others if c.transport.stalled_since is not None]
                if stalled:  # a client that does not read its answers: aborted (a close would wait for it)
                    victim = min(stalled, key=lambda c: c.transport.stalled_since or 0.0)
                    victim._stop_timer()
                    victim.transport.abort()
                else:
                    waiting = [c for c in others if c._evictable()]
                    if waiting:
                        oldest = min(waiting, key=lambda c: c._waiting_since)
                        oldest._stop_timer()
                        oldest.transport.close()
                    else:
                        transport.write(OVERLOADED)
                        transport.close()
                        return
            self._arm(limits.idle_timeout_s, self._close_idle)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            self._input = None
            super().connection_lost(exc)
            self.transport.stop_write_deadline()

        # -- reading, in bounded steps -----------------------------------------------------------------
        def data_received(self, data: bytes) -> None:
            if self._discarding:  # after a 431: read and dropped until the lingering close
                return
            if self._input is not None:  # bytes are held back: these queue behind them (reading is paused, but
                # a transport may still hand over what it had already read)
                self._input = self._input[self._input_at:] + data
                self._input_at = 0
                return
            self._feed(data, 0)

        def _feed(self, data: bytes, start: int) -> None:
            """Parse `data` in steps, each unable to begin more requests than `max_pipelined_requests` leaves
            room for; hold the rest back (and pause reading) once there is no room, or while writing is
            paused. uvicorn's ``data_received`` otherwise: the same 400 on a parser error, the same upgrade.
            `data` from `start` on is unparsed; the bytes before it, if any, were parsed."""
            cap = self._limits.max_pipelined_requests
            size = len(data)
            view: memoryview | None = None
            while start < size:
                room = cap - self._outstanding
                if room <= 0:
                    # At the bound, the request being parsed (if it is within the bound) is parsed to its end,
                    # or its body's end: one step of one more request's room, so at most one more request
                    # begins, and it cannot complete its headers within 16 bytes. So at most `cap` requests
                    # have been parsed and wait for (or are getting) their answers, plus one whose head waits.
                    room = 1 if room == 0 and (self._in_headers or self._in_body) else 0
                if room == 0 or self._write_paused:
                    self._hold(data, start)
                    return
                if self._in_headers and (start >= 3 or b"\n" not in data[:3]):
                    # The rest of a request's head is one step, to its end (CRLF CRLF: llhttp takes no bare
                    # LF), so a long head is not parsed in small pieces (httptools joins a header's pieces:
                    # quadratic). Searched from 3 bytes back, in bytes already parsed, unless they were in an
                    # earlier read (then a head ending across the two reads cannot be told: the step below).
                    end = data.find(b"\r\n\r\n", max(start - 3, 0))
                    stop = size if end < 0 else end + 4
                else:
                    stop = start + room * MIN_REQUEST_BYTES + max(self._body_left, 0)  # > start: every step parses
                if start == 0 and stop >= size:
                    chunk: bytes | memoryview = data
                else:
                    if view is None:
                        view = memoryview(data)
                    chunk = view[start:stop]
                start = stop
                if self._in_headers:
                    self._head_bytes += len(chunk)
                    if self._head_bytes > self._limits.max_head_bytes:
                        self._head_too_large()
                        return
                try:
                    self.parser.feed_data(chunk)
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
                    return

        def _hold(self, data: bytes, start: int) -> None:
            self._input = data
            self._input_at = start
            if self._due is not None and self._on_due == self._headers_too_slow:
                # The request being parsed waits for room, not for its client: its header deadline is lifted
                # and set afresh when its bytes are parsed again.
                self._disarm()
                self._headers_held = True
            self.transport.hold_reading(True)

        def _release(self) -> None:
            """Room was made (an answer completed, or the client took its output): parse the held bytes
            (at the loop's next turn, outside the answer's ``send``), or resume reading if none are held."""
            if self._input is not None:
                if not self._feed_soon:
                    self._feed_soon = True
                    self.loop.call_soon(self._feed_held)
            elif not self._write_paused:
                self.transport.hold_reading(False)

        def _feed_held(self) -> None:
            self._feed_soon = False
            held = self._input
            if held is None or self.parser is None or self.transport.is_closing():
                return
            self._input = None
            if self._headers_held:
                self._headers_held = False
                self._arm(self._limits.header_timeout_s, self._headers_too_slow)
            self._feed(held, self._input_at)
            if self._input is None and not self._write_paused and self.parser is not None:
                self.transport.hold_reading(False)

        # -- writing ---------------------------------------------------------------------------------
        def pause_writing(self) -> None:
            """Over `max_unsent_bytes` unsent: uvicorn's send waits (its flow control), reading and parsing
            stop, and the write deadline starts."""
            super().pause_writing()
            self._write_paused = True
            self.transport.start_write_deadline()
            self.transport.hold_reading(True)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._write_paused = False
            if not self.transport.is_closing():  # a close with output unsent keeps its deadline
                self.transport.stop_write_deadline()
            self._release()

        # -- parser callbacks --------------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._outstanding += 1
            self._in_headers = True
            self._head_bytes = 0
            self._waiting_since = time.monotonic()
            self._arm(self._limits.header_timeout_s, self._headers_too_slow)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_headers = False
            self._in_body = True
            self.scope.setdefault("extensions", {})["memwarden"] = {  # type: ignore[typeddict-item]
                "target": bytes(self.url), "peercert": self._peercert}
            super().on_headers_complete()
            for name, value in self.headers:  # llhttp has checked it: one, digits only
                if name == b"content-length":
                    self._body_left = int(value) if value.isdigit() else 0
                    break

        def on_body(self, body: bytes) -> None:
            if self._body_left > 0:  # a body of known length (a chunked one counts nothing)
                self._body_left -= len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._body_left = 0
            self._in_body = False
            super().on_message_complete()

        def on_response_complete(self) -> None:
            # uvicorn's: starts the next request queued behind this one, or arms its keep-alive timer, which
            # the idle deadline below replaces (the same bound, one timer per connection)
            super().on_response_complete()
            self._unset_keepalive_if_required()
            self._outstanding -= 1
            self._waiting_since = time.monotonic()
            if self.transport.is_closing():
                return
            if self._outstanding == 0:  # nothing begun is unanswered: idle until the next request's first byte
                self._arm(self._limits.idle_timeout_s, self._close_idle)
            self._release()

    return GuardedHttpToolsProtocol
