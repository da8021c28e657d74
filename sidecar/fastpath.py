"""The one module where the serving code depends on a library's private internals for speed (issue 35).

Everything here is switched off by ``MEMWARDEN_FASTPATH=off`` (`sidecar.config.Settings.fastpath`), which takes
the library's public path instead; docs/performance.md ("Private internals: what is kept and why") gives each
item's measured gain. Kept:

- `write_answer`: the pipeline entry (`sidecar.app.PipelineMiddleware`) writes its answer on uvicorn's
  httptools `RequestResponseCycle` in one go — the bytes and state changes of its two ASGI ``send`` calls,
  without the ASGI messages and uvicorn's header checks per answer. It reads and sets the cycle's fields
  (``response_started``, ``keep_alive``, ``flow.write_paused``, ``default_headers``, …) and uses uvicorn's
  module-level ``STATUS_LINE``/``HEADER_RE``/``HEADER_VALUE_RE``: none of it is uvicorn's public API, so it is
  used only on the uvicorn releases its wire test (``tests/unit/test_entry_direct_write.py``, the bytes of the
  two sends) passed on, `TESTED_UVICORN` (0.54, 0.55; on 0.50.2 and 0.52.4 it does not: those releases add
  ``connection: close`` themselves when the request asked for it); on any other release the public path is taken whatever the setting
  (`AVAILABLE`). The public path: the two ASGI ``send`` calls.

Not here, because no public path exists: `sidecar.server`'s connection bounds subclass uvicorn's
``HttpToolsProtocol`` (uvicorn has no public hook for them; docs/performance.md says why and what it relies on).
"""

from __future__ import annotations

from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

from sidecar.server import COALESCE_MAX, CoalescingTransport


# uvicorn releases (version prefixes) on which `write_answer`'s wire test passed; on others it is not used.
TESTED_UVICORN = ("0.54.", "0.55.")
AVAILABLE = uvicorn.__version__.startswith(TESTED_UVICORN)


def cycle_of(send: Any) -> RequestResponseCycle | None:
    """The uvicorn httptools `RequestResponseCycle` whose bound ``send`` `send` is, or None (another server,
    another protocol, a wrapper, or a uvicorn release not in `TESTED_UVICORN`)."""
    if not AVAILABLE:
        return None
    cycle = getattr(send, "__self__", None)
    return cycle if type(cycle) is RequestResponseCycle else None


class AnswerWriter:
    """Writes a pipeline answer on a `RequestResponseCycle` (`write`); keeps the bytes of uvicorn's default
    headers, rendered again when uvicorn renews their list (its date, once a second)."""

    __slots__ = ("_defaults_of", "_defaults")

    def __init__(self) -> None:
        self._defaults_of: list[tuple[bytes, bytes]] | None = None  # the default-header list last rendered
        self._defaults: bytes | None = None  # its bytes (None: not plain, answers go through `send`)

    def write(self, cycle: RequestResponseCycle, status: int, payload: bytes, request_id: bytes) -> bool:
        """Write the answer on `cycle` as its two ``send`` calls (``http.response.start`` with the headers
        ``content-type: application/json``, ``content-length``, ``x-request-id`` and ``connection: close`` for a
        408; ``http.response.body`` with `payload`) would, byte for byte and with the same state changes
        (started, complete, keep-alive, close, the next pipelined request), in one transport write. False
        (nothing done) when the cycle is not in the plain state that makes this exact — the response already
        started, the client gone, writing paused, an access log, a default header that is not plain, a
        request id or status uvicorn would refuse: then the caller sends as before."""
        if cycle.response_started or cycle.disconnected or cycle.flow.write_paused or cycle.access_log:
            return False
        defaults = cycle.default_headers
        if defaults is not self._defaults_of:
            self._defaults_of, self._defaults = defaults, _plain_headers(defaults)
        line = STATUS_LINE.get(status)
        if self._defaults is None or line is None or HEADER_VALUE_RE.search(request_id) is not None:
            return False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = False
        if status == 408:  # the rest of the body may still be on its way: do not read it as a next request
            cycle.keep_alive = False
            close = b"connection: close\r\n"
        else:
            close = b"" if cycle.keep_alive else b"connection: close\r\n"
        head = b"".join((line, self._defaults, b"content-type: application/json\r\ncontent-length: ",
                         str(len(payload)).encode(), b"\r\nx-request-id: ", request_id, b"\r\n", close, b"\r\n"))
        transport = cycle.transport
        write = transport.write_now if isinstance(transport, CoalescingTransport) else transport.write
        if cycle.scope["method"] == "HEAD":
            write(head)
        elif len(payload) > COALESCE_MAX:  # a large body is not copied into the head: two writes, in order
            write(head)
            write(payload)
        else:
            write(head + payload)
        cycle.expected_content_length = 0
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()
        return True


def _plain_headers(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The bytes uvicorn writes for `headers` (its default headers: the date, a configured server header),
    or None unless each is one it writes unchanged and without effect on the response's framing."""
    out = []
    for name, value in headers:
        if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value) or \
                name.lower() in (b"content-length", b"transfer-encoding", b"connection"):
            return None
        out += [name.lower(), b": ", value, b"\r\n"]
    return b"".join(out)
