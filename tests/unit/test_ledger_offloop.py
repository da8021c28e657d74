"""`sidecar.ledger.offloop`: PostgreSQL ledger calls leave the event loop, SQLite's stay inline, and a ledger
that cannot answer (psycopg OperationalError, pool timeout) denies with 503 ``ledger_unavailable``."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from sidecar.errors import LedgerUnavailable
from sidecar.ledger import SQLiteLedger, offloop
from sidecar.ledger.cache import CachingLedger


class _Net:
    blocking_io = True

    def where(self) -> int:
        return threading.get_ident()

    def fail(self, exc: Exception) -> None:
        raise exc


def test_blocking_ledger_runs_in_a_worker_thread_and_the_loop_keeps_running() -> None:
    ledger = _Net()

    async def main() -> tuple[int, int, int]:
        loop_thread = threading.get_ident()
        ticks = 0
        gate = threading.Event()

        def slow() -> int:
            gate.wait(5)
            return threading.get_ident()

        async def ticker() -> None:
            nonlocal ticks
            for _ in range(3):
                await asyncio.sleep(0)
                ticks += 1
            gate.set()

        worker, _ = await asyncio.gather(offloop.call(ledger, slow), ticker())
        return loop_thread, worker, ticks

    loop_thread, worker, ticks = asyncio.run(main())
    assert worker != loop_thread and ticks == 3  # the loop ran the ticker while the call was blocked


def test_the_flag_is_seen_through_the_cache_wrapper(tmp_path: Path) -> None:
    assert offloop.blocking(CachingLedger(_Net(), lambda: 1))
    sqlite = SQLiteLedger(str(tmp_path / "l.db"))
    try:
        assert not offloop.blocking(sqlite) and not offloop.blocking(CachingLedger(sqlite, lambda: 1))

        async def where() -> tuple[int, int]:
            return threading.get_ident(), await offloop.call(sqlite, threading.get_ident)
        loop_thread, ran = asyncio.run(where())
        assert ran == loop_thread  # SQLite: inline
    finally:
        sqlite.close()


@pytest.mark.parametrize("exc", [psycopg.OperationalError("connection refused"), PoolTimeout("couldn't get a connection")])
def test_connection_errors_and_pool_timeouts_deny_with_503(exc: Exception) -> None:
    with pytest.raises(LedgerUnavailable) as info:
        asyncio.run(offloop.call(_Net(), _Net().fail, exc))
    assert info.value.status == 503 and info.value.code == "ledger_unavailable"


def test_other_errors_are_not_relabelled() -> None:
    with pytest.raises(psycopg.errors.UndefinedTable):
        asyncio.run(offloop.call(_Net(), _Net().fail, psycopg.errors.UndefinedTable("no table")))
