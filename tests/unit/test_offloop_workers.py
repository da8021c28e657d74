"""`sidecar.ledger.offloop.call` on its own worker threads (`offloop._Workers`) behaves as the
``asyncio.to_thread`` version it replaced (`tests/unit/offloop_reference.py`): the same results and
exceptions (psycopg connection errors as `LedgerUnavailable`), the call in a worker thread in a copy of the
caller's context, a call cancelled before a thread took it never runs, at most ``min(32, cpu + 4)`` threads
and that many calls blocked at once."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import LedgerUnavailable
from sidecar.ledger import offloop
from tests.unit import offloop_reference

VAR: contextvars.ContextVar[Any] = contextvars.ContextVar("offloop_test_var", default="unset")


class _Net:
    blocking_io = True


class _Local:
    blocking_io = False


def _step(kind: str, value: Any) -> Any:
    """One call's body: what it returns or raises, and where it ran."""
    seen = (VAR.get(), threading.get_ident())
    VAR.set(("inner", value))  # must not leak into the caller's context
    if kind == "return":
        return value, seen
    if kind == "value_error":
        raise ValueError(value)
    if kind == "operational":
        raise psycopg.OperationalError(f"down {value!r}")
    if kind == "undefined_table":
        raise psycopg.errors.UndefinedTable(f"no table {value!r}")
    if kind == "keyboard":  # BaseException subclasses travel too
        raise _Stop(value)
    raise AssertionError(kind)


class _Stop(BaseException):
    pass


def _outcome(result: Any, loop_thread: int) -> Any:
    if isinstance(result, BaseException):
        cause = result.__cause__
        return ("raise", type(result).__name__, str(result), type(cause).__name__ if cause else None)
    value, (var, thread) = result
    return ("return", value, var, "loop" if thread == loop_thread else "worker")


async def _run(call: Any, ledger: Any, steps: list[tuple[str, Any]], tag: Any) -> list[Any]:
    VAR.set(tag)
    loop_thread = threading.get_ident()

    async def one(kind: str, value: Any) -> Any:
        try:
            return await call(ledger, _step, kind, value)
        except BaseException as exc:  # noqa: BLE001  (compared, not handled)
            return exc
    results = await asyncio.gather(*(one(k, v) for k, v in steps))
    assert VAR.get() == tag  # nothing set in a call leaked out
    return [_outcome(r, loop_thread) for r in results]


_values = st.one_of(st.integers(), st.text(max_size=8), st.none(), st.tuples(st.integers(), st.booleans()))
_steps = st.lists(st.tuples(st.sampled_from(["return", "value_error", "operational", "undefined_table", "keyboard"]),
                            _values), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_steps, tag=_values, blocking=st.booleans())
def test_same_outcomes_as_asyncio_to_thread(steps: list[tuple[str, Any]], tag: Any, blocking: bool) -> None:
    ledger = _Net() if blocking else _Local()
    new = asyncio.run(_run(offloop.call, ledger, steps, tag))
    old = asyncio.run(_run(offloop_reference.call, ledger, steps, tag))
    assert new == old
    for (kind, _), got in zip(steps, new):
        if kind == "return":
            assert got[2] == tag and got[3] == ("worker" if blocking else "loop")
        if kind == "operational":
            assert got[1] == LedgerUnavailable.__name__ and got[3] == "OperationalError"


def test_the_same_exception_object_reaches_the_caller() -> None:
    exc = ValueError("this one")

    def fail() -> None:
        raise exc

    async def main() -> BaseException:
        try:
            await offloop.call(_Net(), fail)
        except ValueError as got:
            return got
        raise AssertionError("no exception")
    assert asyncio.run(main()) is exc


@pytest.mark.parametrize("call", [offloop.call, offloop_reference.call], ids=["workers", "to_thread"])
def test_a_call_cancelled_before_a_thread_took_it_never_runs(call: Any) -> None:
    n = min(32, (os.cpu_count() or 1) + 4)
    gate = threading.Event()
    started = threading.Semaphore(0)
    ran: list[int] = []

    def hold() -> None:
        started.release()
        gate.wait(10)

    def late() -> None:
        ran.append(1)

    async def main() -> None:
        holders = [asyncio.ensure_future(call(_Net(), hold)) for _ in range(n)]
        for _ in range(n):  # every thread busy
            while not started.acquire(False):
                await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(call(_Net(), late))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(*holders)
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await call(_Net(), lambda: None)  # the queue behind the cancelled call still flows
        for _ in range(n):
            await call(_Net(), lambda: None)
    asyncio.run(main())
    assert ran == []


def test_as_many_calls_blocked_at_once_as_threads_and_no_more_threads() -> None:
    n = offloop._WORKERS.max_workers
    assert n == min(32, (os.cpu_count() or 1) + 4)
    barrier = threading.Barrier(n, timeout=10)

    async def main() -> list[int]:
        return await asyncio.gather(*(offloop.call(_Net(), lambda: (barrier.wait(), threading.get_ident())[1])
                                      for _ in range(n)))
    threads = asyncio.run(main())
    assert len(set(threads)) == n  # all n waited together: n threads
    assert len(offloop._WORKERS._threads) <= n
    assert all(t.daemon for t in offloop._WORKERS._threads)


def test_a_result_for_a_closed_loop_is_dropped() -> None:
    gate = threading.Event()
    done = threading.Event()

    def slow() -> int:
        gate.wait(10)
        done.set()
        return 1

    async def main() -> None:
        task = asyncio.ensure_future(offloop.call(_Net(), slow))
        await asyncio.sleep(0.01)
        task.cancel()
    asyncio.run(main())  # the loop closes while `slow` still runs
    gate.set()
    assert done.wait(10)

    async def after() -> int:
        return await offloop.call(_Net(), lambda: 7)
    assert asyncio.run(after()) == 7  # the worker survived the closed loop
