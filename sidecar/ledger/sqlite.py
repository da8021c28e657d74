"""SQLite ledger (the embedded default): WAL journal, ``synchronous=FULL``, schema migrated by code.

One connection guarded by a lock; every public method is one transaction. The governance is
`sidecar.ledger.sql.SQLLedger`'s; this module holds what only SQLite does: the connection and its
transactions (``BEGIN IMMEDIATE``: one writer at a time), version 3 of the schema, the cache token
(``PRAGMA data_version``) and the read path of `get_rows`. Source: SQLite 3 "Write-Ahead Logging" and
"PRAGMA synchronous" documentation.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import orjson

from sidecar.governance import Principal, Row
from sidecar.ledger.base import LAST_USED_RESOLUTION_US, now_us, parse_key
from sidecar.ledger.dialect import SQLITE, chunks
from sidecar.ledger.schema import migrations
from sidecar.ledger.sql import (EMPTY_LIST, EMPTY_OBJECT, N_ROW_COLUMNS, READ_ROW_COLUMNS, ROW_COLUMNS, SQLLedger, check_key,
                                row_from_read, row_to_db, use_is_stale)

# Version 3: operator keys (kind 'operator', no tenant). SQLite cannot drop a NOT NULL constraint, so
# api_keys is rebuilt with the kind/tenant checks.
MIGRATION_3_OPERATOR_SQLITE = """
    CREATE TABLE api_keys_v3 (
        key_id TEXT PRIMARY KEY, salt TEXT NOT NULL, hash TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('agent', 'admin', 'operator')),
        tenant TEXT, fleet TEXT, agent TEXT, trust INTEGER NOT NULL,
        created_at INTEGER NOT NULL, revoked_at INTEGER,
        CHECK ((kind = 'operator') = (tenant IS NULL))
    );
    INSERT INTO api_keys_v3 (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at, revoked_at)
        SELECT key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at, revoked_at FROM api_keys;
    DROP TABLE api_keys;
    ALTER TABLE api_keys_v3 RENAME TO api_keys;
"""


MIGRATIONS: list[str] = migrations(SQLITE, operator_keys=MIGRATION_3_OPERATOR_SQLITE)

# `SQLiteLedger.get_rows` in one statement: the rows of a JSON array of ids (``json_each``, one index seek per id, no
# temporary table for an ``IN`` list), each row as a JSON array of the columns a `Row` holds besides backend and
# collection (`_JSON_ROW_COLUMNS`, `_row_from_json`), all of them as one JSON array (``json_group_array``, in the
# order of the ids): one value crosses into Python, not 25 per row (Python 3.11's sqlite3 releases and retakes
# the GIL around the type of every column it reads).
_JSON_ROW_COLUMNS = (
    "row_id, tenant, fleet, owner, scope, writer, created_at, status, readers, labels, request_id, subject, predicate, "
    "object, extra, source, single_valued, supersedes_collection, supersedes_id, superseded_by_collection, superseded_by, "
    "superseded_at, content_hmac"
)
_GET_ROWS_JSON_SQL = (
    f"SELECT json_group_array(json_array({_JSON_ROW_COLUMNS})) FROM json_each(?) AS ids CROSS JOIN rows "
    "WHERE rows.backend = ? AND rows.collection_id = ? AND rows.row_id = ids.value"
)


class _NotExact(Exception):
    """A row `_row_from_json` cannot carry exactly (a REAL where an integer belongs: JSON text keeps 15 digits)."""


def _row_from_json(backend: str, collection: str, v: list[Any]) -> Row:
    """The `Row` of one `_GET_ROWS_JSON_SQL` element (`_JSON_ROW_COLUMNS` in order; `backend` and `collection`
    are the statement's own, equal to the stored ones): the same `Row` as `row_from_read`. Raises `_NotExact`
    when a time column holds a REAL."""
    (row_id, tenant, fleet, owner, scope, writer, created_at, status, readers, labels, request_id, subject, predicate,
     obj, extra, source, single_valued, supersedes_collection, supersedes_id, superseded_by_collection, superseded_by,
     superseded_at, content_hmac) = v
    if type(created_at) is float or type(superseded_at) is float:
        raise _NotExact
    return Row(
        backend, collection, row_id, tenant, fleet, owner, scope, writer, created_at, status,
        () if readers == EMPTY_LIST else tuple(json.loads(readers)),
        () if labels == EMPTY_LIST else tuple(json.loads(labels)), request_id, subject, predicate, obj,
        {} if extra == EMPTY_OBJECT else json.loads(extra), source, (), bool(single_valued),
        None if supersedes_id is None else (str(supersedes_collection), str(supersedes_id)),
        None if superseded_by is None else (str(superseded_by_collection), str(superseded_by)),
        superseded_at, content_hmac,
    )



_GET_ROWS_SQL: dict[int, str] = {}  # `get_rows` statement text by number of ids (sqlite3 caches by text)


def _get_rows_sql(n: int) -> str:
    sql = _GET_ROWS_SQL.get(n)
    if sql is None:
        sql = _GET_ROWS_SQL.setdefault(n, f"SELECT {READ_ROW_COLUMNS} FROM rows WHERE backend = ? AND collection_id = ? "
                                          f"AND row_id IN ({','.join('?' * n)})")
    return sql



class SQLiteLedger(SQLLedger):
    """The `Ledger` protocol on one SQLite file. `path` may be ``":memory:"`` for unit tests."""

    dialect = SQLITE

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = str(path)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._writes = 0  # write transactions committed through this connection (`cache_version`)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._version_cursor = self._db.cursor()  # `cache_version`, run on every cached lookup: a plain tuple
        self._version_cursor.row_factory = None
        self._rows_cursor = self._db.cursor()  # `get_rows`: one JSON text per call
        self._rows_cursor.row_factory = None
        self.migrate()

    # -- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
                self._writes += 1

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db

    def _insert_rows(self, db: Any, rows: list[Row], t: int) -> list[str]:
        inserted: list[str] = []
        sql = f"INSERT INTO rows ({ROW_COLUMNS}) VALUES ({SQLITE.marks(N_ROW_COLUMNS)}) ON CONFLICT DO NOTHING"
        for row in rows:
            if db.execute(sql, row_to_db(row, t)).rowcount == 1:
                inserted.append(row.row_id)
        return inserted

    def _tuples(self, db: Any, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        cur = db.cursor()
        cur.row_factory = None
        return list(cur.execute(sql, args).fetchall())

    def migrate(self) -> int:
        """Apply pending migrations; returns the schema version now in force."""
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            current = db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            return self._apply_migrations(db, MIGRATIONS, current, applied_at=False)

    def cache_version(self) -> tuple[int, int]:
        """The invalidation token of `sidecar.ledger.cache.CachingLedger`: (``PRAGMA data_version``, the
        number of write transactions committed through this connection). ``data_version`` changes whenever
        another connection, of this process or any other, has committed to the file since this connection last
        read it (SQLite's "PRAGMA data_version"); this connection's own commits do not move it, so they are
        counted here. Equal tokens mean no commit in between; a commit that has returned before the call is
        seen. Raises ``sqlite3.ProgrammingError`` once the ledger is closed."""
        with self._lock:
            return int(self._version_cursor.execute("PRAGMA data_version").fetchone()[0]), self._writes

    def ping(self) -> bool:
        with self._lock:
            return bool(self._db.execute("SELECT 1").fetchone()[0] == 1)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- keys -----------------------------------------------------------------------------------------
    def authenticate(self, plaintext: str) -> Principal | None:
        """The principal of a valid (unrevoked, unexpired) key; None otherwise. Constant-time hash comparison.
        Records the key's use (`last_used_at`) when the stored time is a minute old or more."""
        parsed = parse_key(plaintext)
        if parsed is None:
            return None
        key_id, secret = parsed
        with self._lock:
            r = self._db.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        now = now_us()
        principal = check_key(r, secret, now)
        if principal is not None and use_is_stale(r, now):
            self._touch_key(key_id, now)
        return principal

    def _touch_key(self, key_id: str, now: int) -> None:
        """Set `last_used_at` of `key_id` to `now` unless another writer set it within the last minute. Its own short
        transaction, not counted in `cache_version`'s writes: it changes nothing a cache holds. A busy or read-only
        database skips it (the time is advisory; authentication never fails for it)."""
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.execute("UPDATE api_keys SET last_used_at = ? WHERE key_id = ? AND "
                                     "(last_used_at IS NULL OR last_used_at <= ?)",
                                     (now, key_id, now - LAST_USED_RESOLUTION_US))
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
        except sqlite3.OperationalError:
            pass

    # -- rows -------------------------------------------------------------------------------
    def get_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> dict[str, Row]:
        """Ledger rows for `row_ids` (any status, including pending and deleted), by row id, in the order of
        ascending id within each run of 500 distinct ids. Read now, one statement (`_GET_ROWS_JSON_SQL`); ids
        that are not exact ``str`` or hold NUL, and rows the JSON form cannot carry exactly (a BLOB, a REAL
        time, text that is not UTF-8), are read column by column instead (`_get_rows_by_columns`, whose errors —
        ``sqlite3`` errors, ``UnicodeEncodeError`` for an id with a lone surrogate — are raised)."""
        ids = list(dict.fromkeys(row_ids))
        if not ids:
            return {}
        if type(backend) is not str or type(collection_id) is not str:
            return self._get_rows_by_columns(backend, collection_id, ids)
        try:
            for i in ids:
                if type(i) is not str:
                    raise TypeError
            order = sorted(ids) if len(ids) <= 500 else [i for chunk in chunks(ids) for i in sorted(chunk)]
            param = orjson.dumps(order).decode()
        except TypeError:  # orjson.JSONEncodeError is one (a lone surrogate)
            return self._get_rows_by_columns(backend, collection_id, ids)
        if "\\u0000" in param:  # json_each reads a string up to its first NUL
            return self._get_rows_by_columns(backend, collection_id, ids)
        try:
            with self._lock:
                text = self._rows_cursor.execute(_GET_ROWS_JSON_SQL, (param, backend, collection_id)).fetchone()[0]
            out: dict[str, Row] = {}
            for v in orjson.loads(text):
                out[v[0]] = _row_from_json(backend, collection_id, v)
            return out
        except (sqlite3.OperationalError, sqlite3.DataError, orjson.JSONDecodeError, _NotExact):  # DataError: the
            # one JSON value is longer than SQLITE_LIMIT_LENGTH (a batch whose rows, one by one, still fit)
            return self._get_rows_by_columns(backend, collection_id, ids)

    def _get_rows_by_columns(self, backend: str, collection_id: str, ids: list[str]) -> dict[str, Row]:
        """`get_rows` of distinct `ids`, one ``IN`` statement per 500, each column read by sqlite3
        (`row_from_read`)."""
        out: dict[str, Row] = {}
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None  # plain tuples, read by position (`row_from_read`)
            for chunk in chunks(ids):
                for t in cur.execute(_get_rows_sql(len(chunk)), (backend, collection_id, *chunk)):
                    out[t[2]] = row_from_read(t)
        return out

