"""Ledger calls made from the event loop without blocking it.

`call(ledger, fn, *args)` runs ``fn(*args)`` — a method of `ledger` — in a worker thread when the
ledger does network I/O (``ledger.blocking_io``, true for `PostgresLedger`, seen through the caching and
instrumenting wrappers), and inline otherwise (SQLite: a local file read of a few tens of microseconds is
cheaper than the hop to a thread and back). While a PostgreSQL round trip is in flight the loop serves
other requests. A ledger that is unreachable, or whose pool has no connection free within its timeout
(psycopg ``OperationalError``, of which ``psycopg_pool.PoolTimeout`` is one), raises
`sidecar.errors.LedgerUnavailable` (503): the request is denied, nothing is served.

The hot-path reads — `authenticate` and `read_rows` (a read's ledger rows, their owners and, when asked, a
re-check of the caller's key: one SQL statement on PostgreSQL) — are awaited on the event loop when the
ledger has an asynchronous pool (``ledger.async_io``: `PostgresLedger` with the ``ledger_async`` setting
on), with no thread hop. Otherwise they go through `call`.

The worker threads are this module's own (`_Workers`), not the event loop's default executor: what
``asyncio.to_thread`` did — the call in a copy of the caller's `contextvars` context, at most
``min(32, cpu_count + 4)`` threads (``ThreadPoolExecutor``'s default), a call whose awaiting task was
cancelled before a thread took it never runs, the call's result or exception (the same object) handed back
to the awaiting task — with one queue put, one thread wake-up and one ``call_soon_threadsafe`` per call instead of
``run_in_executor``'s concurrent future, work item, condition variable and future chaining (callgrind, one
trivial call awaited on uvloop: ~128k instructions per round trip through ``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from typing import Any, Awaitable, Callable, TypeVar

import psycopg

from sidecar.errors import LedgerUnavailable
from sidecar.governance import Principal, Row
from sidecar.ledger.sql import Reader, VisibleRows

T = TypeVar("T")


def blocking(ledger: Any) -> bool:
    """Whether calls to `ledger` wait on the network (and so go to a thread)."""
    return bool(getattr(ledger, "blocking_io", False))


def asynchronous(ledger: Any) -> bool:
    """Whether `ledger`'s hot-path reads are coroutines on an asynchronous pool (`authenticate`, `read_rows`)."""
    return bool(getattr(ledger, "async_io", False))


def _set_result(fut: "asyncio.Future[Any]", value: Any) -> None:
    if not fut.cancelled():
        fut.set_result(value)


def _set_exception(fut: "asyncio.Future[Any]", exc: BaseException) -> None:
    if not fut.cancelled():
        fut.set_exception(exc)


class _Workers:
    """Daemon threads that run `call`'s functions, started on demand up to `max_workers` (a new one only when
    none is idle, as ``ThreadPoolExecutor`` does). `submit` returns an asyncio future of `loop` that gets the
    function's result or exception; a call whose future was cancelled before a thread took it is skipped."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def submit(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> "asyncio.Future[Any]":
        fut = loop.create_future()
        self._queue.put((loop, fut, contextvars.copy_context(), fn, args, kwargs))
        if not self._idle.acquire(False):
            self._spawn()
        return fut

    def _spawn(self) -> None:
        with self._lock:
            if len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._work, name=f"memwarden-ledger-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        get = self._queue.get
        while True:
            loop, fut, ctx, fn, args, kwargs = get()
            if not fut.cancelled():
                done: Callable[[Any, Any], None]
                try:
                    value = ctx.run(fn, *args, **kwargs)
                    done = _set_result
                except BaseException as exc:  # handed to the awaiting task, as a concurrent future would
                    value, done = exc, _set_exception
                try:
                    loop.call_soon_threadsafe(done, fut, value)
                except RuntimeError:  # the loop closed meanwhile: nobody awaits the answer
                    pass
                del done, value
            del loop, fut, ctx, fn, args, kwargs  # nothing of the call is kept while idle
            self._idle.release()


_WORKERS = _Workers(min(32, (os.cpu_count() or 1) + 4))


def _unavailable(exc: psycopg.OperationalError) -> LedgerUnavailable:
    return LedgerUnavailable(f"ledger unavailable: {type(exc).__name__}")


async def call(ledger: Any, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` — a ledger method, or synchronous code that reads or writes the ledger (and
    may decide with Cedar) — in a worker thread when `ledger` is `blocking`, inline otherwise; psycopg
    connection errors and pool timeouts become `LedgerUnavailable`."""
    try:
        if blocking(ledger):
            return await _WORKERS.submit(asyncio.get_running_loop(), fn, args, kwargs)
        return fn(*args, **kwargs)
    except psycopg.OperationalError as exc:
        raise _unavailable(exc) from exc


async def _awaited(coro: Awaitable[T]) -> T:
    try:
        return await coro
    except psycopg.OperationalError as exc:
        raise _unavailable(exc) from exc


async def authenticate(ledger: Any, key: str) -> Principal | None:
    """The principal of API key `key` (None: unknown, revoked or malformed), read now. Raises
    `LedgerUnavailable` when the ledger cannot answer."""
    if asynchronous(ledger):
        return await _awaited(ledger.authenticate_async(key))
    return await call(ledger, ledger.authenticate, key)


async def read_rows(ledger: Any, backend: str, collection_id: str, row_ids: list[str], key_id: str | None = None,
                    has_read_rows: bool | None = None) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
    """(ledger rows of `row_ids` by id, their owners' Cedar entities by agent uid, whether API key `key_id`
    is valid now — True when None), read now: one statement on an asynchronous ledger, else one
    worker-thread trip (`call`; on PostgreSQL the same one statement). Raises `LedgerUnavailable` when the
    ledger cannot answer. `has_read_rows`: whether `ledger` has ``read_rows`` (a caller that knew it once per
    ledger object saves the look-up, which on SQLite raises AttributeError through both wrappers); None:
    look it up."""
    if asynchronous(ledger):
        return await _awaited(ledger.read_rows_async(backend, collection_id, row_ids, key_id))

    if has_read_rows if has_read_rows is not None else hasattr(ledger, "read_rows"):  # PostgreSQL: the same one statement, in a worker thread
        return await call(ledger, ledger.read_rows, backend, collection_id, row_ids, key_id)

    def fetch() -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
        rows = ledger.get_rows(backend, collection_id, row_ids)
        owners = ledger.agent_entities({r.owner for r in rows.values()}) if rows else {}
        key_ok = key_id is None or ledger.key_valid(key_id)
        return rows, owners, key_ok

    return await call(ledger, fetch)


async def visible_rows(ledger: Any, backend: str, collection_id: str, tenant: str, reader: Reader | None, limit: int,
                       key_id: str | None = None) -> VisibleRows | None:
    """`PostgresLedger.visible_rows` (the admitted rows' ids, their rows, their owners, the key re-check: one
    statement), awaited on the asynchronous pool when the ledger has one, else in a worker thread (`call`).
    Raises `LedgerUnavailable` when the ledger cannot answer."""
    if asynchronous(ledger):
        return await _awaited(ledger.visible_rows_async(backend, collection_id, tenant, reader, limit, key_id))
    return await call(ledger, ledger.visible_rows, backend, collection_id, tenant, reader, limit, key_id)


async def aclose(ledger: Any) -> None:
    """Close `ledger`'s asynchronous pool, if it has one (from the loop that used it)."""
    if hasattr(ledger, "aclose"):
        await ledger.aclose()
