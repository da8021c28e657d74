"""`PostgresLedger.authenticate_async` and `read_rows_async` as they were before h24p (commit f3eb51e): the
connection through ``pool.connection()`` (inside it ``async with conn``), a new cursor per call. The oracle of
`tests/unit/test_ledger_pg_hot.py`."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import psycopg
from psycopg.rows import tuple_row

from sidecar.governance import Principal, Row
from sidecar.ledger.base import now_us, parse_key
from sidecar.ledger.postgres import _READ_ROWS, _READ_ROWS_BINARY_IDS, PostgresLedger
from sidecar.ledger.sql import check_key


def _read_rows_query(ids: list[Any]) -> str:
    """The statement of `read_rows` before h24p (no one-id statement)."""
    for i in ids:
        if type(i) is not str or "\x00" in i:
            return _READ_ROWS
    return _READ_ROWS_BINARY_IDS


@asynccontextmanager
async def _aconn(self: PostgresLedger) -> AsyncIterator[psycopg.AsyncConnection[dict[str, Any]]]:
    if self._apool is None or self._apool_loop is not asyncio.get_running_loop():  # noqa: SLF001
        await self.open_async()
    assert self._apool is not None  # noqa: SLF001
    async with self._apool.connection() as conn:  # noqa: SLF001
        yield conn


async def authenticate_async(self: PostgresLedger, plaintext: str) -> Principal | None:
    parsed = parse_key(plaintext)
    if parsed is None:
        return None
    key_id, secret = parsed
    async with _aconn(self) as db:
        cur = await db.execute("SELECT * FROM api_keys WHERE key_id = %s", (key_id,))
        r = await cur.fetchone()
    return check_key(r, secret, now_us())


async def read_rows_async(self: PostgresLedger, backend: str, collection_id: str, row_ids: list[str],
                          key_id: str | None = None) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
    ids = list(dict.fromkeys(row_ids))
    async with _aconn(self) as db:
        cur = db.cursor(row_factory=tuple_row, binary=True)
        await cur.execute(_read_rows_query(ids), {"key": key_id, "backend": backend, "collection": collection_id,
                                                  "ids": ids})
        result = await cur.fetchall()
    return self._read_rows_result(result, key_id)  # noqa: SLF001


# `sidecar.ledger.postgres._Listener` before h24p: a new ``poll`` object on the descriptor at every `version`.
import threading  # noqa: E402

from sidecar.ledger.postgres import _readable  # noqa: E402


class _Listener(threading.Thread):
    """A daemon thread holding one connection that LISTENs on the ledger's invalidation channel; counts
    notifications (and reconnections) into `version`, which is None while the connection is down."""

    def __init__(self, url: str, channel: str, timeout_s: float) -> None:
        super().__init__(name=f"memwarden-ledger-listen-{channel}", daemon=True)
        self._url, self._channel, self._timeout_s = url, channel, timeout_s
        self._count = 0
        self._fd: int | None = None
        self._stopped = threading.Event()

    def version(self) -> int | None:
        fd = self._fd
        if fd is None:
            return None
        try:
            if _readable(fd):  # a notification (or EOF) not yet read: no cache now
                return None
        except (OSError, ValueError):
            return None
        return self._count

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=max(1, int(self._timeout_s))) as conn:
                    conn.execute(f'LISTEN "{self._channel}"')  # type: ignore[arg-type]
                    self._count += 1  # whatever happened while we were not listening
                    self._fd = conn.fileno()
                    while not self._stopped.is_set():
                        for _ in conn.notifies(timeout=1.0):
                            self._count += 1
                        conn.execute("SELECT 1")  # a dead connection raises here
            except Exception:
                pass
            finally:
                self._fd = None
            self._stopped.wait(1.0)


def read_rows(self: PostgresLedger, backend: str, collection_id: str, row_ids: list[str], key_id: str | None = None
              ) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
    """`PostgresLedger.read_rows` before h24p: ``self._conn()`` (``pool.connection()``), a new cursor per call."""
    ids = list(dict.fromkeys(row_ids))
    with self._conn() as db:  # noqa: SLF001
        result = db.cursor(row_factory=tuple_row, binary=True).execute(
            _read_rows_query(ids), {"key": key_id, "backend": backend, "collection": collection_id,
                                    "ids": ids}).fetchall()
    return self._read_rows_result(result, key_id)  # noqa: SLF001


def authenticate(self: PostgresLedger, plaintext: str) -> Principal | None:
    """`PostgresLedger.authenticate` before h24p."""
    parsed = parse_key(plaintext)
    if parsed is None:
        return None
    key_id, secret = parsed
    with self._conn() as db:  # noqa: SLF001
        r = db.execute("SELECT * FROM api_keys WHERE key_id = %s", (key_id,)).fetchone()
    return check_key(r, secret, now_us())
