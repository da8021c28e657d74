"""The connection guards of `sidecar.server` as they were before the lazily re-armed deadline (kept as the
reference of `tests/unit/test_server_timers.py`: the same bytes on the wire, the same closes and 408s).
Not used by the sidecar."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """An `HttpToolsProtocol` subclass enforcing `limits` (see the module docstring), for
    ``uvicorn.run(app, http=guarded_protocol(limits))``."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _limits = limits

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._waiting_since = time.monotonic()
            self._in_flight = False

        # -- timers ------------------------------------------------------------------------------
        def _arm(self, seconds: float, handler: Any) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, handler)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _close_idle(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def _headers_too_slow(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.write(REQUEST_TIMEOUT)
                self.transport.close()

        def _evictable(self) -> bool:
            return not self._in_flight and not self.transport.is_closing()

        # -- connection --------------------------------------------------------------------------
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
            if len(self.connections) > self._limits.max_connections:
                waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol)
                           and c._evictable()]
                if waiting:
                    oldest = min(waiting, key=lambda c: c._waiting_since)
                    oldest._disarm()
                    oldest.transport.close()
                else:
                    transport.write(OVERLOADED)
                    transport.close()
                    return
            self._arm(self._limits.idle_timeout_s, self._close_idle)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        # -- parser callbacks --------------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._waiting_since = time.monotonic()
            self._arm(self._limits.header_timeout_s, self._headers_too_slow)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_flight = True
            self.scope.setdefault("extensions", {})["memwarden"] = {"target": bytes(self.url)}  # type: ignore[typeddict-item]
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._in_flight = False
            self._waiting_since = time.monotonic()
            if not self.transport.is_closing() and not self.pipeline:
                # uvicorn armed its own keep-alive timer; ours replaces it with the same bound
                self._unset_keepalive_if_required()
                self._arm(self._limits.idle_timeout_s, self._close_idle)

    return GuardedHttpToolsProtocol
