"""Ledger calls made from the event loop without blocking it.

`call(ledger, fn, *args)` runs ``fn(*args)`` — a method of `ledger` — in the default thread pool when the
ledger does network I/O (``ledger.blocking_io``, true for `PostgresLedger`, seen through the caching and
instrumenting wrappers), and inline otherwise (SQLite: a local file read of a few tens of microseconds is
cheaper than the hop to a thread and back). While a PostgreSQL round trip is in flight the loop serves
other requests. A ledger that is unreachable, or whose pool has no connection free within its timeout
(psycopg ``OperationalError``, of which ``psycopg_pool.PoolTimeout`` is one), raises
`sidecar.errors.LedgerUnavailable` (503): the request is denied, nothing is served.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, TypeVar

import psycopg

from sidecar.errors import LedgerUnavailable

T = TypeVar("T")


def blocking(ledger: Any) -> bool:
    """Whether calls to `ledger` wait on the network (and so go to a thread)."""
    return bool(getattr(ledger, "blocking_io", False))


async def call(ledger: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, in a worker thread when `ledger` is `blocking`; psycopg connection errors and
    pool timeouts become `LedgerUnavailable`."""
    try:
        if blocking(ledger):
            return await asyncio.to_thread(fn, *args)
        return fn(*args)
    except psycopg.OperationalError as exc:
        raise LedgerUnavailable(f"ledger unavailable: {type(exc).__name__}") from exc
