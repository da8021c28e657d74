"""`sidecar.server.CoalescingTransport`: uvicorn's two writes of a response (head, body) reach the
socket transport as one write, in order; a lone write is sent at the next loop turn; close sends what
is held first; abort drops it; a large body is not copied into the held head."""

from __future__ import annotations

import asyncio
from typing import Any

from sidecar.server import COALESCE_MAX, CoalescingTransport


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


def test_head_and_body_leave_in_one_write_in_order() -> None:
    async def main() -> None:
        raw = Recorder()
        t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert raw.writes == []
        t.write(b'{"a":1}')
        assert raw.writes == [b'HTTP/1.1 200 OK\r\n\r\n{"a":1}']
        t.write(b"lone")
        await asyncio.sleep(0)
        assert raw.writes[-1] == b"lone" and len(raw.writes) == 2
        await asyncio.sleep(0)  # the flush of the coalesced pair found nothing more to send
        assert len(raw.writes) == 2
        t.write(b"x")
        t.write(b"y" * (COALESCE_MAX + 1))
        assert raw.writes[2:] == [b"x", b"y" * (COALESCE_MAX + 1)]
        t.write(b"before close")
        t.close()
        assert raw.writes[-1] == b"before close" and raw.events == ["close"]
        assert t.get_extra_info("peername") == ("127.0.0.1", 1) and t.is_closing()

    asyncio.run(main())


def test_abort_drops_what_is_held() -> None:
    async def main() -> None:
        raw = Recorder()
        t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(b"held")
        t.abort()
        await asyncio.sleep(0)
        assert raw.writes == [] and raw.events == ["abort"]

    asyncio.run(main())
