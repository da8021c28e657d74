"""`sidecar.ledger.offloop.call` before its own worker threads (commit 1b82edf): ``asyncio.to_thread`` on
the event loop's default executor. The oracle of `tests/unit/test_offloop_workers.py`."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, TypeVar

import psycopg

from sidecar.ledger.offloop import _unavailable, blocking

T = TypeVar("T")


async def call(ledger: Any, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        if blocking(ledger):
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)
    except psycopg.OperationalError as exc:
        raise _unavailable(exc) from exc
