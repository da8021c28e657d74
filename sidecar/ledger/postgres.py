"""PostgreSQL ledger (scale-out): one database shared by every sidecar replica.

Same protocol, schema and semantics as `SQLiteLedger` (docs/design.md §5):

- every public method is one transaction on a pooled connection (psycopg 3 + psycopg_pool);
- every write commits before it returns, with ``synchronous_commit=on`` forced per connection,
  so a tombstone is durable before the backend delete is attempted;
- nothing is cached: keys, rows, collections and tombstones are read from the database on every
  call, so a revocation, deletion or supersession committed through one replica is seen by every
  other replica on its next request;
- `reserve_rows` is all-or-nothing under concurrency: ``INSERT … ON CONFLICT DO NOTHING
  RETURNING`` inside one transaction, rolled back when any id was taken (a concurrent insert of
  the same id blocks on the unique index until the other transaction ends).

Migrations are versioned (``schema_version``) and applied at open under a transaction-scoped
advisory lock, so replicas starting together migrate once. Driver errors are not caught here: they
propagate to the pipeline's outer guard, which denies (fail closed).
Sources: PostgreSQL 15 manual (INSERT … ON CONFLICT, pg_advisory_xact_lock, synchronous_commit),
psycopg 3.2 documentation (transactions, executemany ``returning``), psycopg_pool 3.2.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import select
import threading
from typing import Any, Iterator
from contextlib import contextmanager

import psycopg
import psycopg.sql
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from sidecar.errors import LedgerOpenError
from sidecar.governance import Principal, Row, agent_entity
from sidecar.ledger.base import LAST_USED_RESOLUTION_US, now_us, parse_key
from sidecar.ledger import pg_direct
from sidecar.ledger.dialect import POSTGRES
from sidecar.ledger.schema import migrations
from sidecar.ledger.sql import (N_ROW_COLUMNS, ROW_COLUMNS, Reader, SQLLedger, VisibleRows, check_key, names,
                                row_from_tuple, row_to_db, use_is_stale, visible_ids_query)

# Version 3: operator keys (kind 'operator', no tenant): PostgreSQL drops the NOT NULL constraint in place.
MIGRATION_3_OPERATOR_POSTGRES = """
    ALTER TABLE api_keys ALTER COLUMN tenant DROP NOT NULL;
    ALTER TABLE api_keys ADD CONSTRAINT api_keys_kind CHECK (kind IN ('agent', 'admin', 'operator'));
    ALTER TABLE api_keys ADD CONSTRAINT api_keys_operator_no_tenant CHECK ((kind = 'operator') = (tenant IS NULL));
    """
# Each entry migrates from version i to i+1 (`sidecar.ledger.schema`: BIGINT times, one more index in version 1).
MIGRATIONS: list[str] = migrations(
    POSTGRES, operator_keys=MIGRATION_3_OPERATOR_POSTGRES,
    first_extra="CREATE INDEX collections_namespace ON collections (backend, tenant, database) WHERE deleted_at IS NULL;\n    ")

_MIGRATION_LOCK = 0x6D656D77  # "memw": pg_advisory_xact_lock key for migrations
_STATISTICS_LOCK = 0x6D657374  # "mest": pg_try_advisory_xact_lock key of `refresh_statistics` (one replica at a time)

# Tables of this ledger whose planner statistics are missing or stale, by autovacuum's analyze rule
# (``autovacuum_analyze_threshold`` 50 + ``autovacuum_analyze_scale_factor`` 0.1 × rows): rows changed since the
# last ANALYZE above `min_changes` + `fraction` × the table's row estimate, or never analyzed and not empty.
_STALE_STATISTICS = (
    "SELECT s.relname AS name FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid "
    "WHERE s.schemaname = %(schema)s AND (s.n_mod_since_analyze > %(min_changes)s + %(fraction)s * GREATEST(c.reltuples, 0) "
    "OR (s.last_analyze IS NULL AND s.last_autoanalyze IS NULL AND s.n_live_tup + s.n_mod_since_analyze > 0)) "
    "ORDER BY s.relname"
)
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class SchemaOutOfDate(LedgerOpenError):
    """The database schema is older than this code and migrations at open are disabled."""


def connect_failure(url: str, timeout_s: float) -> str:
    """Why a connection to `url` fails, and what to check, in one line: one direct connection attempt
    (psycopg's pool, which failed first, does not say why). libpq's error names the host and port, never the
    password."""
    try:
        psycopg.connect(url, connect_timeout=max(1, int(timeout_s)), autocommit=True).close()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split("\n")[0].split()).removeprefix("connection failed: ") or type(exc).__name__
        return (f"{reason}; check MEMWARDEN_LEDGER_URL: PostgreSQL running and reachable at its host and port, the "
                "database created (memwarden creates its tables, not the database), the user and password")
    return (f"no connection within {timeout_s:g} s (MEMWARDEN_LEDGER_TIMEOUT_S), though one opens now; check the "
            "server's load and its max_connections")


class _Quiet(logging.Filter):
    """Drops psycopg_pool's warnings while a pool first opens: its failure is reported once, by
    `connect_failure`, not once per connection attempt."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def _readable(fd: int) -> bool:
    """Whether `fd` has data, EOF or an error pending, without blocking. ``poll(2)``, not ``select(2)``: select
    refuses descriptors >= FD_SETSIZE (1024), which a sidecar holding many client connections (or a long test
    process) reaches — every pool checkout would then fail its check and the ledger would time out."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def _check_idle(conn: psycopg.Connection[Any]) -> None:
    """Pool check on checkout, without a round trip in the common case: an idle connection whose
    socket is readable has been closed or sent something (server restart, terminated backend,
    idle timeout), so it is verified with a real round trip and discarded by the pool if broken."""
    if _readable(conn.fileno()):
        ConnectionPool.check_connection(conn)


async def _acheck_idle(conn: psycopg.AsyncConnection[Any]) -> None:
    """`_check_idle` for the asynchronous pool."""
    if _readable(conn.fileno()):
        await AsyncConnectionPool.check_connection(conn)


# The server's time in UTC microseconds (the ledger's time unit), for a key's expiry in the statements that re-check
# a key (`_READ_ROWS`, `_visible_rows_query`).
_NOW_US = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
# `last_used_at` of a key, written when the stored one is a minute old or more (`LAST_USED_RESOLUTION_US`); the
# condition repeated in the statement so that replicas seeing the same stale value write it once.
_TOUCH_KEY = "UPDATE api_keys SET last_used_at = %s WHERE key_id = %s AND (last_used_at IS NULL OR last_used_at <= %s)"


# The read of `PostgresLedger.read_rows_async`: in ONE statement, whether the key `key_id` is valid now
# (``key_ok``; true when no key is to be checked), the ledger rows of the ids asked and each row's owner as
# the agents table knows it (``a_*`` columns, NULL for an owner it does not know). The key test is the outer
# side of the join, so it answers even when no row matches.
_READ_ROWS = (
    "SELECT k.key_ok, " + ", ".join(f"r.{c.strip()}" for c in ROW_COLUMNS.split(",")) + ", "
    "a.tenant AS a_tenant, a.fleet AS a_fleet, a.agent AS a_agent, a.trust AS a_trust, a.roles AS a_roles "
    "FROM (SELECT (%(key)s::text IS NULL OR EXISTS (SELECT 1 FROM api_keys WHERE key_id = %(key)s AND revoked_at IS NULL "
    "AND (expires_at IS NULL OR expires_at > " + _NOW_US + "))) "
    "AS key_ok) AS k "
    "LEFT JOIN (rows AS r LEFT JOIN agents AS a ON a.agent_uid = r.owner) "
    "ON r.backend = %(backend)s AND r.collection_id = %(collection)s AND r.row_id = ANY(%(ids)s)"
)


# `_READ_ROWS` with the ids sent as a binary ``text[]`` (``%(ids)b``): psycopg's text array dumper tests every element
# against a case-insensitive regular expression (whether to quote it), ~15k instructions per id; the binary dumper
# sends the UTF-8 bytes. Same array, same rows. Ids that are not exact ``str`` or hold NUL take `_READ_ROWS` (so
# that they fail as they did: NUL is refused by psycopg's text dumper, by the server in binary).
_READ_ROWS_BINARY_IDS = _READ_ROWS.replace("ANY(%(ids)s)", "ANY(%(ids)b)")
assert _READ_ROWS_BINARY_IDS != _READ_ROWS


# `_READ_ROWS` for one id (a get by id, the most common read): ``r.row_id = %(ids)s`` instead of ``= ANY`` of a
# one-element array, the same rows (text equality either way) without psycopg's list dumper (~10 Python calls:
# the element type's look-up, the dimensions, the binary array header). Taken only by one exact ``str`` id without
# NUL (that fails as before on the other statements).
_READ_ONE_ROW = _READ_ROWS.replace("r.row_id = ANY(%(ids)s)", "r.row_id = %(ids)s")
assert _READ_ONE_ROW != _READ_ROWS


def _visible_rows_query(backend: str, collection_id: str, tenant: str, reader: Reader | None, limit: int,
                        key_id: str | None) -> tuple[str, tuple[Any, ...]]:
    """The statement of `PostgresLedger.visible_rows`: `_READ_ROWS`'s columns (key_ok, the row's `ROW_COLUMNS`,
    its owner's agent) over the rows `visible_ids_query` admits (at most ``limit + 1`` of them), one result row
    with NULL row columns when none is admitted. Run unprepared, as `visible_row_ids` is."""
    inner, args = visible_ids_query(POSTGRES, backend, collection_id, tenant, reader, limit, columns=ROW_COLUMNS)
    sql = ("SELECT k.key_ok, " + ", ".join(f"r.{c.strip()}" for c in ROW_COLUMNS.split(",")) + ", "
           "a.tenant AS a_tenant, a.fleet AS a_fleet, a.agent AS a_agent, a.trust AS a_trust, a.roles AS a_roles "
           "FROM (SELECT (%s::text IS NULL OR EXISTS (SELECT 1 FROM api_keys WHERE key_id = %s AND revoked_at IS NULL "
           "AND (expires_at IS NULL OR expires_at > " + _NOW_US + "))) "
           f"AS key_ok) AS k LEFT JOIN (({inner}) AS r LEFT JOIN agents AS a ON a.agent_uid = r.owner) ON true")
    return sql, (key_id, key_id, *args)


def _read_rows_query(ids: list[Any]) -> tuple[str, Any]:
    """(the statement of `PostgresLedger.read_rows` for the distinct ids `ids`, the value of its ``ids``
    parameter)."""
    for i in ids:
        if type(i) is not str or "\x00" in i:
            return _READ_ROWS, ids
    if len(ids) == 1:
        return _READ_ONE_ROW, ids[0]
    return _READ_ROWS_BINARY_IDS, ids


# The arguments the direct read takes (`pg_direct.DirectReads.params`), tested also when it is off: such reads are
# prepared from their first use on the public path (``prepare=True``), as the direct read prepares them.
_DIRECT_SHAPE = pg_direct.DirectReads(_READ_ONE_ROW, _READ_ROWS_BINARY_IDS)

# Positions in a `_READ_ROWS` tuple: key_ok, then the row's `ROW_COLUMNS` (row_id third), then the owner's
# agent (tenant, fleet, agent, trust, roles).
_ROW_ID, _AGENT = 3, 1 + N_ROW_COLUMNS


_AUTHENTICATE = "SELECT * FROM api_keys WHERE key_id = %s"


def _stale_use(r: dict[str, Any]) -> tuple[int, str, int] | None:
    """The parameters of `_TOUCH_KEY` when key row `r`'s last use is a minute old or more (or none), else None."""
    now = now_us()
    return (now, r["key_id"], now - LAST_USED_RESOLUTION_US) if use_is_stale(r, now) else None


_IDLE = psycopg.pq.TransactionStatus.IDLE
_psycopg_log = logging.getLogger("psycopg")  # where ``with conn`` logs a failed rollback


class _HotConnection(psycopg.AsyncConnection[Any]):
    """A connection of the asynchronous pool, with the cursors the hot-path reads reuse: `rows_cursor` (binary,
    plain tuples: `PostgresLedger.read_rows_async`) and `key_cursor` (the connection's ``dict_row``:
    `PostgresLedger.authenticate_async`), each made on first use. A connection serves one caller at a time
    (it is out of the pool meanwhile), and so do its cursors."""

    rows_cursor: Any = None
    key_cursor: Any = None


class _HotSyncConnection(psycopg.Connection[Any]):
    """`_HotConnection` for the synchronous pool (`PostgresLedger.read_rows`, `authenticate`); every other
    method uses these connections as plain ones. `direct_prepared`: the names of the statements
    `sidecar.ledger.pg_direct` prepared in this session (a set, made on first use); `direct_tx`: its `Transformer`."""

    rows_cursor: Any = None
    key_cursor: Any = None
    direct_prepared: Any = None
    direct_tx: Any = None


def _done_sync(conn: psycopg.Connection[Any]) -> None:
    """`_done` on a synchronous connection (``with conn`` on success)."""
    if not conn.closed and conn.pgconn.transaction_status != _IDLE:
        conn.commit()


def _failed_sync(conn: psycopg.Connection[Any]) -> None:
    """`_failed` on a synchronous connection (``with conn`` on an exception)."""
    if not conn.closed and conn.pgconn.transaction_status != _IDLE:
        try:
            conn.rollback()
        except Exception as exc:
            _psycopg_log.warning("error ignored in rollback on %s: %s", conn, exc)


async def _done(conn: psycopg.AsyncConnection[Any]) -> None:
    """What ``async with conn`` does on success (inside ``pool.connection()``): commit, unless the connection
    is closed; on an idle autocommit connection the commit sends nothing and is skipped."""
    if not conn.closed and conn.pgconn.transaction_status != _IDLE:
        await conn.commit()


async def _failed(conn: psycopg.AsyncConnection[Any]) -> None:
    """What ``async with conn`` does on an exception: roll back (its own error ignored, the caller's exception
    propagates), unless the connection is closed; on an idle connection the rollback sends nothing and is
    skipped."""
    if not conn.closed and conn.pgconn.transaction_status != _IDLE:
        try:
            await conn.rollback()
        except Exception as exc:
            _psycopg_log.warning("error ignored in rollback on %s: %s", conn, exc)


def _drop_pool(pool: AsyncConnectionPool) -> None:
    """Close the connections of an asynchronous pool whose event loop is gone (best effort: a pool can
    only be closed properly from its own loop)."""
    try:
        for conn in list(getattr(pool, "_pool", ())):
            conn.pgconn.finish()
        pool._closed = True  # noqa: SLF001
    except Exception:
        pass


class PostgresLedger(SQLLedger):
    """The `Ledger` protocol on a PostgreSQL database.

    `url`: libpq connection string or ``postgresql://`` URL. `schema`: the schema holding the
    tables (created if missing; ``public`` by default). `min_size`/`max_size`: pooled
    connections per process. `timeout_s`: seconds to wait for a pooled connection and to connect
    (a ledger that cannot answer in time raises, and the request is denied). `migrate_on_open`:
    apply pending migrations at open; when False, an out-of-date schema raises `SchemaOutOfDate`. `direct`:
    `read_rows` through psycopg's internals (`sidecar.ledger.pg_direct`, setting ``ledger_pg_direct``) while the
    installed psycopg has them; False: psycopg's public cursor only (the same rows and errors).
    Every call is a network round trip: the request path runs them off the event loop
    (`blocking_io`, `sidecar.ledger.offloop`). The hot-path reads also exist as coroutines on a second,
    asynchronous pool (`authenticate_async`, `read_rows_async`; psycopg_pool ``AsyncConnectionPool``
    with the same sizes and timeout), opened on the first such call in the running event loop and
    closed by `aclose` (or `close`); `async_io` says whether the request path uses them.
    """

    dialect = POSTGRES
    blocking_io = True
    async_io = True

    def __init__(self, url: str, *, schema: str = "public", min_size: int = 1, max_size: int = 10,
                 timeout_s: float = 5.0, migrate_on_open: bool = True, direct: bool = True) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(f"ledger schema {schema!r} must be a lower-case SQL identifier")
        self.schema = schema
        self._url = url
        self._timeout_s = timeout_s
        # `read_rows` on psycopg's internals (`sidecar.ledger.pg_direct`, setting ``ledger_pg_direct``), or None: the
        # public cursor path only
        self._direct = (pg_direct.DirectReads(_READ_ONE_ROW, _READ_ROWS_BINARY_IDS)
                        if direct and pg_direct.unavailable() is None else None)
        self.channel = f"memwarden_{schema}"  # LISTEN/NOTIFY channel of cache invalidations
        self._listener: _Listener | None = None
        self._conn_kwargs: dict[str, Any] = {
            "autocommit": True, "row_factory": dict_row, "connect_timeout": max(1, int(timeout_s)),
            "options": f"-c search_path={schema} -c synchronous_commit=on"}
        self._min_size, self._max_size = min_size, max_size
        self._pool = ConnectionPool(
            url, min_size=min_size, max_size=max_size, timeout=timeout_s, open=False, check=_check_idle,
            kwargs=self._conn_kwargs, name="memwarden-ledger", connection_class=_HotSyncConnection,
        )
        self._apool: AsyncConnectionPool | None = None
        self._apool_loop: asyncio.AbstractEventLoop | None = None
        quiet, pool_log = _Quiet(), logging.getLogger("psycopg.pool")
        pool_log.addFilter(quiet)
        try:
            self._pool.open(wait=True, timeout=timeout_s)
        except psycopg.OperationalError:  # PoolTimeout (one): the pool retries in the background and says not why
            self._pool.close()
            raise LedgerOpenError(connect_failure(url, timeout_s)) from None
        finally:
            pool_log.removeFilter(quiet)
        try:
            if migrate_on_open:
                self.migrate()
            elif self.schema_version() < len(MIGRATIONS):
                raise SchemaOutOfDate(
                    f"ledger schema version {self.schema_version()} < {len(MIGRATIONS)}: run `memwarden ledger migrate`")
        except BaseException:
            self._pool.close()
            raise

    # -- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with self._pool.connection() as conn:
            yield conn

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    def schema_version(self) -> int:
        """The migration version in force (0 for an empty schema)."""
        with self._conn() as db:
            exists = db.execute("SELECT to_regclass('schema_version') IS NOT NULL AS e").fetchone()
            if not exists or not exists["e"]:
                return 0
            r = db.execute("SELECT COALESCE(MAX(version), 0) AS v FROM schema_version").fetchone()
            return int(r["v"]) if r else 0

    def migrate(self) -> int:
        """Apply pending migrations (serialised across replicas); returns the schema version now in force."""
        with self._tx() as db:
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            db.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied_at BIGINT NOT NULL)")
            r = db.execute("SELECT COALESCE(MAX(version), 0) AS v FROM schema_version").fetchone()
            return self._apply_migrations(db, MIGRATIONS, int(r["v"]) if r else 0, applied_at=True)

    def _lock_fact(self, db: Any, key: list[Any]) -> None:
        """Concurrent activations of one (tenant, collection, partition, subject, predicate) wait for each other:
        a transaction-scoped advisory lock on that key (the partial unique index ``rows_one_active_fact`` is the
        constraint behind it)."""
        db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (json.dumps(key),))

    def _insert_rows(self, db: Any, rows: list[Row], t: int) -> list[str]:
        """``INSERT … ON CONFLICT DO NOTHING RETURNING`` of every row in one pipelined ``executemany``: a concurrent
        insert of the same id blocks on the unique index until the other transaction ends."""
        cur = db.cursor()
        cur.executemany(f"INSERT INTO rows ({ROW_COLUMNS}) VALUES ({POSTGRES.marks(N_ROW_COLUMNS)}) "
                        "ON CONFLICT DO NOTHING RETURNING row_id", [row_to_db(row, t) for row in rows], returning=True)
        inserted: list[str] = []
        while True:
            inserted += [r["row_id"] for r in cur.fetchall()]
            if not cur.nextset():
                break
        return inserted

    def _tuples(self, db: Any, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Never prepared: the generic plan PostgreSQL settles on for a prepared statement (after five runs) does
        not see the reader's values, and read 8.5 ms on a 20,000-row collection where the custom plan, planned
        anew each time, takes 1.3 ms in all."""
        cur = db.cursor(row_factory=tuple_row)
        return list(cur.execute(sql, args, prepare=False).fetchall())

    def refresh_statistics(self, min_changes: int = 50, fraction: float = 0.1) -> list[str]:
        """ANALYZE the ledger's tables whose planner statistics are missing or stale (autovacuum's analyze
        rule: more than `min_changes` + `fraction` × rows changed since the last ANALYZE, or never analyzed);
        returns the names of the tables analyzed, sorted.

        Why the ledger does this itself: with no statistics (a new ledger, a bulk `memwarden adopt`, or a
        server running with ``autovacuum = off``) PostgreSQL's default selectivities make the prefix
        ``(backend, collection_id)`` of the rows' primary key look selective, and the plan of `read_rows`
        then walks every row of the collection instead of looking up the ids asked (measured: 1.05 ms →
        0.11 ms for 10 ids of a 2,000-row collection once analyzed; 16.5 ms → 0.76 ms at 50,000 rows).
        Replicas take turns (``pg_try_advisory_xact_lock``: a replica that finds the lock held analyzes
        nothing and returns []). Raises psycopg errors (`sidecar.ledger.offloop.call` maps connection
        errors to `LedgerUnavailable`); ANALYZE needs the tables' owner, which the migrating role is."""
        with self._tx() as db:
            got = db.execute("SELECT pg_try_advisory_xact_lock(%s) AS ok", (_STATISTICS_LOCK,)).fetchone()
            if not got or not got["ok"]:
                return []
            stale = [r["name"] for r in db.execute(
                _STALE_STATISTICS, {"schema": self.schema, "min_changes": min_changes, "fraction": fraction}).fetchall()]
            for name in stale:
                db.execute(psycopg.sql.SQL("ANALYZE {}.{}").format(psycopg.sql.Identifier(self.schema),
                                                                  psycopg.sql.Identifier(name)))
        return stale

    def ping(self) -> bool:
        with self._conn() as db:
            r = db.execute("SELECT 1 AS one").fetchone()
            return r is not None and r["one"] == 1

    def pool_stats(self) -> dict[str, int]:
        """psycopg_pool statistics (pool_size, pool_available, requests_waiting, …)."""
        return dict(self._pool.get_stats())

    def close(self) -> None:
        """Close both pools and stop the listener. The asynchronous pool is closed here only when its
        event loop is not running (else call `aclose` from that loop first; a running loop gets a task)."""
        if self._listener is not None:
            self._listener.stop()
        self._pool.close()
        apool, loop = self._apool, self._apool_loop
        self._apool = self._apool_loop = None
        if apool is None or loop is None:
            return
        if loop.is_closed():
            _drop_pool(apool)
        elif loop.is_running():
            loop.call_soon_threadsafe(lambda: loop.create_task(apool.close()))
        else:
            loop.run_until_complete(apool.close())

    # -- the asynchronous pool (hot-path reads) ---------------------------------------------
    async def open_async(self) -> None:
        """Open the asynchronous pool in the running event loop (idempotent; a pool of another, earlier
        loop is dropped). Does not wait for connections: a request that finds none within `timeout_s`
        gets ``PoolTimeout``."""
        loop = asyncio.get_running_loop()
        if self._apool is not None and self._apool_loop is loop:
            return
        old = self._apool
        pool = AsyncConnectionPool(
            self._url, min_size=self._min_size, max_size=self._max_size, timeout=self._timeout_s, open=False,
            check=_acheck_idle, kwargs=self._conn_kwargs, name="memwarden-ledger-async", connection_class=_HotConnection,
        )
        self._apool, self._apool_loop = pool, loop
        await pool.open(wait=False)
        if old is not None:  # opened in an earlier loop, now gone (one loop per test): nothing to await there
            _drop_pool(old)

    async def aclose(self) -> None:
        """Close the asynchronous pool (from the loop that opened it)."""
        pool, self._apool, self._apool_loop = self._apool, None, None
        if pool is not None:
            await pool.close()

    async def authenticate_async(self, plaintext: str) -> Principal | None:
        """`authenticate`, one round trip on the asynchronous pool. Raises psycopg ``OperationalError``
        (``PoolTimeout`` included) when the ledger cannot answer."""
        parsed = parse_key(plaintext)
        if parsed is None:
            return None
        key_id, secret = parsed
        pool = self._apool
        if pool is None or self._apool_loop is not asyncio.get_running_loop():
            pool = await self._open_async_pool()
        conn = await pool.getconn()
        try:
            cur = conn.key_cursor
            if cur is None:
                cur = conn.key_cursor = conn.cursor()
            await cur.execute(_AUTHENTICATE, (key_id,))
            r = await cur.fetchone()
            principal = check_key(r, secret, now_us())
            touch = _stale_use(r) if principal is not None else None
            if touch is not None:
                try:
                    await cur.execute(_TOUCH_KEY, touch)
                except psycopg.Error:  # advisory: never fails the authentication
                    pass
            await _done(conn)
        except BaseException:
            await _failed(conn)
            raise
        finally:
            await pool.putconn(conn)
        return principal

    async def read_rows_async(self, backend: str, collection_id: str, row_ids: list[str], key_id: str | None = None
                              ) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
        """In one round trip (one statement, `_READ_ROWS`): the ledger rows of `row_ids` (any status, as
        `get_rows`), the Cedar entities of their owners the ledger knows (as `agent_entities`), and
        whether the API key `key_id` exists and is not revoked now (True when `key_id` is None). Returns
        (rows by id, owners by agent uid, key valid). Raises psycopg ``OperationalError`` as above.

        The connection is taken from and given back to the pool directly (``getconn``/``putconn``, what
        ``pool.connection()`` does around ``async with conn``, whose commit or rollback is a no-op on an
        idle autocommit connection and is made here only when the connection is not idle: `_done`,
        `_failed`), and the statement runs on the connection's own binary tuple cursor
        (`_HotConnection.rows_cursor`, made on first use): the same statement, parameters and rows as a new
        cursor per call (`tests/unit/test_ledger_pg_hot.py`), without building a cursor and its adapters
        each time."""
        query, ids_value = _read_rows_query(list(dict.fromkeys(row_ids)))
        result = await self._hot_rows(query, {"key": key_id, "backend": backend, "collection": collection_id,
                                              "ids": ids_value})
        return self._read_rows_result(result, key_id)

    async def _hot_rows(self, query: str, params: Any, prepare: bool | None = None) -> list[tuple[Any, ...]]:
        """`query` with `params` on a connection of the asynchronous pool, taken and given back directly, on the
        connection's binary tuple cursor (`_HotConnection.rows_cursor`); its rows. `prepare` as psycopg's
        ``Cursor.execute`` takes it (None: prepared after five uses)."""
        pool = self._apool
        if pool is None or self._apool_loop is not asyncio.get_running_loop():
            pool = await self._open_async_pool()
        conn = await pool.getconn()
        try:
            cur = conn.rows_cursor
            if cur is None:
                cur = conn.rows_cursor = conn.cursor(row_factory=tuple_row, binary=True)
            await cur.execute(query, params, prepare=prepare)
            result = await cur.fetchall()
            await _done(conn)
        except BaseException:
            await _failed(conn)
            raise
        finally:
            await pool.putconn(conn)
        return result

    async def visible_rows_async(self, backend: str, collection_id: str, tenant: str, reader: Reader | None,
                                 limit: int, key_id: str | None = None) -> VisibleRows | None:
        """`visible_rows` on the asynchronous pool: the same one statement, on the connection's binary tuple
        cursor (`_HotConnection.rows_cursor`). Raises psycopg ``OperationalError`` as `read_rows_async`."""
        sql, args = _visible_rows_query(backend, collection_id, tenant, reader, limit, key_id)
        return self._visible_rows_result(await self._hot_rows(sql, args, prepare=False), limit, key_id)

    def visible_rows(self, backend: str, collection_id: str, tenant: str, reader: Reader | None, limit: int,
                     key_id: str | None = None) -> VisibleRows | None:
        """`visible_row_ids` and `read_rows` of the ids it lists, in one round trip (one statement,
        `_visible_rows_query`): (the admitted rows' ids, their ledger rows by id, the Cedar entities of their
        owners the ledger knows, whether API key `key_id` exists and is not revoked now — True when None), or
        None when more than `limit` rows are admitted. Read now, never cached. For a read whose admitted rows
        are few, the list and the rows its answer is decided on come from one statement; for a long list,
        reading every admitted row costs more than a second trip for the rows the backend returns
        (docs/performance.md, round h27). Raises psycopg ``OperationalError`` when the ledger cannot answer."""
        sql, args = _visible_rows_query(backend, collection_id, tenant, reader, limit, key_id)
        with self._conn() as db:
            cur = db.cursor(row_factory=tuple_row, binary=True)
            result = cur.execute(sql, args, prepare=False).fetchall()  # type: ignore[arg-type]
        return self._visible_rows_result(result, limit, key_id)

    @classmethod
    def _visible_rows_result(cls, result: list[tuple[Any, ...]], limit: int, key_id: str | None) -> VisibleRows | None:
        ids = [t[_ROW_ID] for t in result if t[_ROW_ID] is not None]
        if len(ids) > limit:
            return None
        rows, owners, key_ok = cls._read_rows_result(result, key_id)
        return ids, rows, owners, key_ok

    async def _open_async_pool(self) -> AsyncConnectionPool:
        await self.open_async()
        assert self._apool is not None
        return self._apool

    def read_rows(self, backend: str, collection_id: str, row_ids: list[str], key_id: str | None = None
                  ) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
        """`read_rows_async` on the synchronous pool (the same one statement), the connection taken and given back
        directly with the connection's own binary tuple cursor, as there (`_HotSyncConnection`, `_done_sync`,
        `_failed_sync`). Exact ``str`` arguments without NUL take the direct read (`sidecar.ledger.pg_direct`) when
        it is on, else the cursor with the statement prepared from its first use (``prepare=True``: the same
        server-side plan reuse); other arguments take the cursor as psycopg prepares by default, and fail as it
        fails. Raises psycopg ``OperationalError`` when the ledger cannot answer."""
        ids = list(dict.fromkeys(row_ids))
        reads = self._direct
        if reads is None:
            shaped = _DIRECT_SHAPE.params(key_id, backend, collection_id, ids) is not None
            return self._read_rows_sync(backend, collection_id, ids, key_id, None, shaped)
        direct = reads.params(key_id, backend, collection_id, ids)
        if direct is None:
            return self._read_rows_sync(backend, collection_id, ids, key_id, None, False)
        try:
            return self._read_rows_sync(backend, collection_id, ids, key_id, direct, False, reads)
        except pg_direct.Unavailable:  # this psycopg lacks an internal it uses (logged once): the public path
            self._direct = None
            return self._read_rows_sync(backend, collection_id, ids, key_id, None, True)

    def _read_rows_sync(self, backend: str, collection_id: str, ids: list[Any], key_id: str | None,
                        direct: tuple[pg_direct.Statement, list[bytes | None]] | None, prepare: bool,
                        reads: pg_direct.DirectReads | None = None
                        ) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
        """`read_rows` on one connection of the synchronous pool: the direct read of `direct` by `reads`, else the
        connection's cursor, the statement prepared from its first use when `prepare` (else as psycopg decides)."""
        pool = self._pool
        conn = pool.getconn()
        try:
            if direct is not None and reads is not None:
                result = reads.rows(conn, *direct)
            else:
                cur = conn.rows_cursor
                if cur is None:
                    cur = conn.rows_cursor = conn.cursor(row_factory=tuple_row, binary=True)
                query, ids_value = _read_rows_query(ids)
                result = cur.execute(query, {"key": key_id, "backend": backend, "collection": collection_id,
                                             "ids": ids_value}, prepare=True if prepare else None).fetchall()
            _done_sync(conn)
        except BaseException:
            _failed_sync(conn)
            raise
        finally:
            pool.putconn(conn)
        return self._read_rows_result(result, key_id)

    @staticmethod
    def _read_rows_result(result: list[tuple[Any, ...]], key_id: str | None
                          ) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
        """`_READ_ROWS`'s plain tuples (key_ok, the `ROW_COLUMNS`, the owner's agent columns) read by
        position: rows by `row_from_tuple`, as `SQLiteLedger.get_rows` builds them (the same `Row` as
        `_row_from_db` by name: `tests/unit/test_ledger_rows_fast.py`)."""
        rows: dict[str, Row] = {}
        owners: dict[str, dict[str, Any]] = {}
        key_ok = bool(result[0][0]) if result else key_id is None
        for t in result:
            if t[_ROW_ID] is None:  # no row of the batch (the key check's row alone)
                continue
            row = rows[t[_ROW_ID]] = row_from_tuple(t[1:_AGENT])
            if t[_AGENT] is not None:
                owners[row.owner] = agent_entity(t[_AGENT], t[_AGENT + 1], t[_AGENT + 2], t[_AGENT + 3],
                                                 names(t[_AGENT + 4]))
        return rows, owners, key_ok

    # -- cache invalidation (sidecar.ledger.cache) ------------------------------------------
    def _notify(self, db: psycopg.Connection[dict[str, Any]], what: str) -> None:
        """Tell every replica's caches (`cache_version`) that keys, agents or collections changed; sent
        by PostgreSQL when the surrounding transaction commits."""
        db.execute("SELECT pg_notify(%s, %s)", (self.channel, what))

    def cache_version(self) -> int | None:
        """The invalidation token of `sidecar.ledger.cache.CachingLedger`: the number of notifications
        received on `channel` (and of reconnections of the listening connection), or None — cache
        nothing — while that connection is down or a notification is waiting to be read. Starts the
        listening thread on first use."""
        if self._listener is None:
            self._listener = _Listener(self._url, self.channel, self._timeout_s)
            self._listener.start()
        return self._listener.version()

    # -- keys and agents --------------------------------------------------------------------
    def authenticate(self, plaintext: str) -> Principal | None:
        """The principal of a valid, unrevoked key; None otherwise. Read on every call (never cached)."""
        parsed = parse_key(plaintext)
        if parsed is None:
            return None
        key_id, secret = parsed
        pool = self._pool
        conn = pool.getconn()
        try:
            cur = conn.key_cursor
            if cur is None:
                cur = conn.key_cursor = conn.cursor()
            r = cur.execute(_AUTHENTICATE, (key_id,)).fetchone()
            principal = check_key(r, secret, now_us())
            touch = _stale_use(r) if principal is not None else None
            if touch is not None:
                try:
                    cur.execute(_TOUCH_KEY, touch)
                except psycopg.Error:  # advisory: never fails the authentication
                    pass
            _done_sync(conn)
        except BaseException:
            _failed_sync(conn)
            raise
        finally:
            pool.putconn(conn)
        return principal

    # -- collections ------------------------------------------------------------------------
    # -- rows ------------------------------------------------------------------------------


class _Listener(threading.Thread):
    """A daemon thread holding one connection that LISTENs on the ledger's invalidation channel; counts
    notifications (and reconnections) into `version`, which is None while the connection is down.

    `version` runs on every cache lookup. It asks the kernel whether the listening socket has data, EOF or an
    error not yet read (then None: a notification may be waiting) through one ``epoll`` set made per
    connection with the socket in it (``epoll_wait`` with a zero timeout, safe from several threads at once),
    instead of a new ``poll`` object registered on each call; `_poller` is dropped before the connection is
    closed, so a closed (or reused) descriptor is never asked. Where ``select.epoll`` is missing, `_readable`
    (``poll``) on the descriptor, as before."""

    def __init__(self, url: str, channel: str, timeout_s: float) -> None:
        super().__init__(name=f"memwarden-ledger-listen-{channel}", daemon=True)
        self._url, self._channel, self._timeout_s = url, channel, timeout_s
        self._count = 0
        self._fd: int | None = None
        self._poller: Any = None  # select.epoll holding the listening socket; None while the connection is down
        self._stopped = threading.Event()

    def version(self) -> int | None:
        poller = self._poller
        if poller is None:
            return None
        try:
            if poller.poll(0):  # a notification (or EOF, an error) not yet read: no cache now
                return None
        except (OSError, ValueError):
            return None
        if self._poller is not poller:  # the connection went down meanwhile
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
                    try:
                        self._fd = conn.fileno()
                        self._poller = _socket_poller(self._fd)
                        while not self._stopped.is_set():
                            for _ in conn.notifies(timeout=1.0):
                                self._count += 1
                            conn.execute("SELECT 1")  # a dead connection raises here
                    finally:
                        self._poller = None  # before the connection (and its descriptor) is closed
                        self._fd = None
            except Exception:
                pass
            finally:
                self._poller = None
                self._fd = None
            self._stopped.wait(1.0)


class _PollFd:
    """`_socket_poller` without ``select.epoll``: `_readable` on the descriptor, as a ``poll(0)`` method."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def poll(self, timeout: float) -> bool:
        return _readable(self.fd)


def _socket_poller(fd: int) -> Any:
    """An object whose ``poll(0)`` is truthy when `fd` has data, EOF or an error pending (``EPOLLIN``,
    ``EPOLLPRI``; ``EPOLLERR`` and ``EPOLLHUP`` are always reported), as `_readable`."""
    epoll = getattr(select, "epoll", None)
    if epoll is None:
        return _PollFd(fd)
    poller = epoll()
    poller.register(fd, select.EPOLLIN | select.EPOLLPRI)
    return poller
