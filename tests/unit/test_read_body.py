"""`Pipeline._read_body` (each ``receive()`` awaited under ``asyncio.timeout``; issue 35 removed the
hand-driven variant that skipped the context for a receive that did not suspend). Against the reference code (kept below) on scripted ASGI receive callables — messages ready at once,
suspensions shorter and longer than the deadline, bare ``yield``s, a deadline already past, a
disconnect, a body over the cap, a receive that raises — on the standard loop and on uvloop: the same
bodies, the same errors (408 / 413 / disconnect) and the same number of receive calls."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sidecar.errors import MemwardenError, PayloadTooLarge, RequestTimeout
from sidecar.pipeline import Pipeline


async def reference_read_body(self: Pipeline, receive: Any, deadline: float) -> bytes:
    """`Pipeline._read_body` before h19u."""
    chunks: list[bytes] = []
    size = 0
    while True:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            async with asyncio.timeout(remaining):
                message = await receive()
        except TimeoutError as exc:
            raise RequestTimeout(f"request body not received within {self.body_timeout_s:g} s "
                                 "(MEMWARDEN_BODY_TIMEOUT_S)") from exc
        if message["type"] == "http.disconnect":
            raise MemwardenError("client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > self.max_body_bytes:
            raise PayloadTooLarge(f"body over {self.max_body_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def script_receive(steps: list[Any], calls: list[int]) -> Any:
    """A receive callable playing `steps`: a message dict (returned at once), ``("sleep", s, message)``
    (awaits asyncio.sleep(s) first), ``("yield", n, message)`` (n bare yields to the loop first),
    ``("event", message)`` (waits on an asyncio.Event set soon after), or an exception to raise."""
    it = iter(steps)

    async def receive() -> Any:
        calls.append(1)
        step = next(it)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, dict):
            return step
        if step[0] == "sleep":
            await asyncio.sleep(step[1])
            return step[2]
        if step[0] == "yield":
            for _ in range(step[1]):
                await asyncio.sleep(0)
            return step[2]
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, event.set)
        await event.wait()
        return step[1]

    return receive


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


SCRIPTS: dict[str, tuple[list[Any], float]] = {
    "one message": ([body(b'{"a":1}')], 5.0),
    "empty body": ([{"type": "http.request"}], 5.0),
    "chunks ready": ([body(b"[1,", True), body(b"2,", True), body(b"3]")], 5.0),
    "chunks with waits": ([body(b"[1,", True), ("sleep", 0.02, body(b"2,", True)), ("yield", 3, body(b"3]"))], 5.0),
    "event": ([("event", body(b"[1,", True)), body(b"2]")], 5.0),
    "too slow": ([body(b"[1,", True), ("sleep", 2.0, body(b"2]"))], 0.2),
    "too slow first": ([("sleep", 2.0, body(b"{}"))], 0.2),
    "deadline past": ([body(b"{}")], -1.0),
    "disconnect": ([body(b"[1,", True), {"type": "http.disconnect"}], 5.0),
    "disconnect after wait": ([("sleep", 0.01, {"type": "http.disconnect"})], 5.0),
    "too large": ([body(b"x" * 60, True), body(b"y" * 60)], 5.0),
    "too large after wait": ([body(b"x" * 60, True), ("sleep", 0.01, body(b"y" * 60))], 5.0),
    "receive raises": ([body(b"[", True), RuntimeError("boom")], 5.0),
    "receive raises TimeoutError": ([TimeoutError()], 5.0),
    "receive cancelled": ([asyncio.CancelledError()], 5.0),
}


async def outcome(read: Any, steps: list[Any], budget: float) -> tuple[Any, int]:
    pipeline = Pipeline.__new__(Pipeline)
    pipeline.max_body_bytes, pipeline.body_timeout_s = 100, budget
    calls: list[int] = []
    try:
        got: Any = await read(pipeline, script_receive(steps, calls), time.monotonic() + budget)
    except (MemwardenError, RuntimeError, TimeoutError, asyncio.CancelledError) as exc:
        got = (type(exc).__name__, getattr(exc, "status", None), str(exc))
    return got, len(calls)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_read_body_as_the_reference(name: str, loop: str) -> None:
    import uvloop

    steps, budget = SCRIPTS[name]
    runner = uvloop.run if loop == "uvloop" else asyncio.run
    new = runner(outcome(Pipeline._read_body, steps, budget))
    ref = runner(outcome(reference_read_body, steps, budget))
    assert new == ref
    if name.startswith("too slow") or name == "deadline past":
        assert new[0][:2] == ("RequestTimeout", 408)


def test_a_suspended_receive_is_cancelled_at_the_deadline_and_cleans_up() -> None:
    """The rest of a receive that suspended runs under the timeout: at the deadline it is cancelled (its
    ``finally`` runs) and the request is 408, well before the receive would have finished."""
    cleaned: list[str] = []

    async def receive() -> Any:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("finally")
        return body(b"{}")

    async def main() -> Any:
        pipeline = Pipeline.__new__(Pipeline)
        pipeline.max_body_bytes, pipeline.body_timeout_s = 100, 0.1
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            await pipeline._read_body(receive, started + 0.1)
        return time.monotonic() - started

    assert asyncio.run(main()) < 10 and cleaned == ["finally"]
