"""SQLite ledger (the embedded default): WAL journal, ``synchronous=FULL``, schema migrated by code.

One connection guarded by a lock; every public method is one transaction. Source: SQLite 3
"Write-Ahead Logging" and "PRAGMA synchronous" documentation.
"""

from __future__ import annotations

import hmac
import json
import os
import sqlite3
import threading

import orjson
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from contextlib import contextmanager

from sidecar.core.visibility import Visibility, sql_branches
from sidecar.governance import Principal, Row, agent_entity, agent_id, fact_partition
from sidecar.ledger.base import (LAST_USED_RESOLUTION_US, UPDATE_LEASE_S, CollectionIntent, CollectionRecord, KeyRecord,
                                 RowVersion, StaleFact, UpdateLost, check_key_request, hash_secret, key_row_valid,
                                 new_key_secret, now_us, parse_key, rotation_expiry)

# Version 2: provenance (source, lineage), supersession (one active row per single-valued
# (backend, tenant, subject, predicate), enforced by a partial unique index) and content closure.
MIGRATION_2_PROVENANCE = """
    ALTER TABLE rows ADD COLUMN source TEXT NOT NULL DEFAULT '';
    ALTER TABLE rows ADD COLUMN single_valued INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE rows ADD COLUMN supersedes_collection TEXT;
    ALTER TABLE rows ADD COLUMN supersedes_id TEXT;
    ALTER TABLE rows ADD COLUMN superseded_by_collection TEXT;
    ALTER TABLE rows ADD COLUMN superseded_by TEXT;
    ALTER TABLE rows ADD COLUMN superseded_at INTEGER;
    ALTER TABLE rows ADD COLUMN content_hmac TEXT;
    CREATE UNIQUE INDEX rows_one_active_fact ON rows (backend, tenant, subject, predicate)
        WHERE status = 'active' AND single_valued = 1;
    CREATE INDEX rows_content ON rows (backend, tenant, content_hmac) WHERE content_hmac IS NOT NULL;
    CREATE TABLE lineage (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        parent_collection_id TEXT NOT NULL, parent_row_id TEXT NOT NULL,
        PRIMARY KEY (backend, collection_id, row_id, parent_collection_id, parent_row_id)
    );
    CREATE INDEX lineage_parent ON lineage (backend, parent_collection_id, parent_row_id);
    CREATE TABLE forgotten_content (
        tenant TEXT NOT NULL, content_hmac TEXT NOT NULL, deleted_at INTEGER NOT NULL,
        PRIMARY KEY (tenant, content_hmac)
    );
    CREATE TABLE ledger_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

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

# Version 4: supersession per visibility partition (governance.fact_partition): one active single-valued
# row per (backend, tenant, collection, partition, subject, predicate) instead of per tenant. Existing rows
# get their partition from scope, owner, fleet and readers; the tenant-wide unique index is replaced.
MIGRATION_4_PARTITIONS = """
    ALTER TABLE rows ADD COLUMN fact_partition TEXT;
    UPDATE rows SET fact_partition = CASE scope
        WHEN 'agent' THEN 'agent:' || owner
        WHEN 'fleet' THEN 'fleet:' || tenant || '/' || fleet
        WHEN 'tenant' THEN 'tenant'
        ELSE 'restricted:' || owner || '|' || COALESCE(READERS_SORTED, '') END
        WHERE single_valued = 1;
    DROP INDEX rows_one_active_fact;
    CREATE UNIQUE INDEX rows_one_active_fact ON rows (backend, tenant, collection_id, fact_partition, subject, predicate)
        WHERE status = 'active' AND single_valued = 1;
"""
# Version 5: roles of agent keys (``Agent.roles``, `memwarden keys create --role`), a sorted JSON list per
# key; existing keys have none. The agents table already had the column (its roles follow the newest key).
MIGRATION_5_ROLES = """
    ALTER TABLE api_keys ADD COLUMN roles TEXT NOT NULL DEFAULT '[]';
"""
# Version 6: adopted rows (`memwarden adopt`). A backend that lists rows by its own entity ids (Mem0's
# agent_id/user_id/run_id) keeps, per tenant, the ids under which that tenant's adopted rows are found.
MIGRATION_6_LISTING_KEYS = """
    CREATE TABLE listing_keys (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, tenant TEXT NOT NULL, field TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (backend, collection_id, tenant, field, value)
    );
"""
# Version 7: collection creates in flight (`CollectionIntent`): recorded before the backend's create, resolved
# (registered, or dropped) after it, so a crash in between never leaves a collection nobody may open.
MIGRATION_7_COLLECTION_INTENTS = """
    CREATE TABLE collection_intents (
        backend TEXT NOT NULL, nonce TEXT NOT NULL, tenant TEXT NOT NULL, database TEXT NOT NULL, name TEXT NOT NULL,
        created_by TEXT NOT NULL, created_at INTEGER NOT NULL,
        PRIMARY KEY (backend, nonce)
    );
    CREATE INDEX collection_intents_name ON collection_intents (backend, tenant, database, name);
"""
# Version 8: the rows the visibility filter admits in a collection (`visible_row_ids`), found per scope — tenant
# rows, an owner's agent rows, a fleet's fleet rows, restricted rows — instead of by reading every row of the
# collection. One partial index per scope (together about the size of one index on rows), each holding what the
# statement reads but readers, so only restricted rows are read from the table; and no index another scope's
# branch could pick by mistake when the planner has no statistics yet.
MIGRATION_8_VISIBILITY = """
    CREATE INDEX rows_visible_tenant ON rows (backend, collection_id, tenant, status, row_id) WHERE scope = 'tenant';
    CREATE INDEX rows_visible_agent ON rows (backend, collection_id, owner, tenant, status, row_id) WHERE scope = 'agent';
    CREATE INDEX rows_visible_fleet ON rows (backend, collection_id, fleet, tenant, status, row_id) WHERE scope = 'fleet';
    CREATE INDEX rows_visible_restricted ON rows (backend, collection_id, tenant, status, row_id) WHERE scope = 'restricted';
"""
# Version 9: per-row update markers (`begin_update`: one update of a row at a time) and the governance each version
# of a row was written under (`row_versions`: Mem0's history entries are each served under their own). Existing Mem0
# rows get a ``baseline`` version, the governance they have now, which matches none of their past history events
# (what those were written under is not known, so they are served only where every known governance allows).
MIGRATION_9_UPDATES = """
    CREATE TABLE row_updates (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        request_id TEXT NOT NULL, started_at INTEGER NOT NULL,
        PRIMARY KEY (backend, collection_id, row_id)
    );
    CREATE TABLE row_versions (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL, version INTEGER NOT NULL,
        kind TEXT NOT NULL, event_id TEXT, tenant TEXT NOT NULL, fleet TEXT NOT NULL, owner TEXT NOT NULL,
        scope TEXT NOT NULL, readers TEXT NOT NULL, labels TEXT NOT NULL, written_at INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        PRIMARY KEY (backend, collection_id, row_id, version)
    );
    INSERT INTO row_versions (backend, collection_id, row_id, version, kind, event_id, tenant, fleet, owner, scope,
                              readers, labels, written_at, request_id)
        SELECT backend, collection_id, row_id, 0, 'baseline', NULL, tenant, fleet, owner, scope, readers, labels,
               updated_at, request_id FROM rows WHERE backend = 'mem0' AND status IN ('active', 'superseded')
"""

# Version 10: API key hygiene (`memwarden keys create --expires-in`, `keys rotate`, `keys list`): when a key stops
# authenticating (NULL: never), when it last authenticated (written at most once a minute per key), and the key a
# rotation replaced it with. Self-contained (three added, nullable columns; nothing rewritten), so it can be
# renumbered when merged after another migration.
MIGRATION_10_KEY_HYGIENE = """
    ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
    ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;
    ALTER TABLE api_keys ADD COLUMN rotated_to TEXT;
"""
SQLITE_READERS_SORTED = "(SELECT group_concat(value, ',') FROM (SELECT value FROM json_each(rows.readers) ORDER BY value))"

# Each entry migrates from version i to i+1; applied in order at open.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE api_keys (
        key_id TEXT PRIMARY KEY, salt TEXT NOT NULL, hash TEXT NOT NULL, kind TEXT NOT NULL,
        tenant TEXT NOT NULL, fleet TEXT, agent TEXT, trust INTEGER NOT NULL,
        created_at INTEGER NOT NULL, revoked_at INTEGER
    );
    CREATE TABLE agents (
        agent_uid TEXT PRIMARY KEY, tenant TEXT NOT NULL, fleet TEXT NOT NULL, agent TEXT NOT NULL,
        trust INTEGER NOT NULL, roles TEXT NOT NULL DEFAULT '[]'
    );
    CREATE TABLE collections (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, tenant TEXT NOT NULL, database TEXT NOT NULL,
        name TEXT NOT NULL, created_by TEXT NOT NULL, created_at INTEGER NOT NULL, deleted_at INTEGER,
        PRIMARY KEY (backend, collection_id)
    );
    CREATE TABLE rows (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        tenant TEXT NOT NULL, fleet TEXT NOT NULL, owner TEXT NOT NULL, scope TEXT NOT NULL,
        readers TEXT NOT NULL, labels TEXT NOT NULL, status TEXT NOT NULL, writer TEXT NOT NULL,
        created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, request_id TEXT NOT NULL,
        subject TEXT, predicate TEXT, object TEXT, extra TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (backend, collection_id, row_id)
    );
    CREATE TABLE tombstones (
        backend TEXT NOT NULL, collection_id TEXT NOT NULL, row_id TEXT NOT NULL,
        deleted_at INTEGER NOT NULL, deleted_by TEXT NOT NULL, request_id TEXT NOT NULL,
        backend_deleted_at INTEGER,
        PRIMARY KEY (backend, collection_id, row_id)
    );
    CREATE INDEX tombstones_pending ON tombstones (backend) WHERE backend_deleted_at IS NULL;
    """,
    MIGRATION_2_PROVENANCE,
    MIGRATION_3_OPERATOR_SQLITE,
    MIGRATION_4_PARTITIONS.replace("READERS_SORTED", SQLITE_READERS_SORTED),
    MIGRATION_5_ROLES,
    MIGRATION_6_LISTING_KEYS,
    MIGRATION_7_COLLECTION_INTENTS,
    MIGRATION_8_VISIBILITY,
    MIGRATION_9_UPDATES,
    MIGRATION_10_KEY_HYGIENE,
]

def _intent_to_db(i: CollectionIntent) -> tuple[Any, ...]:
    return (i.backend, i.nonce, i.tenant, i.database, i.name, i.created_by, i.created_at)


def _intent_from_db(r: Any) -> CollectionIntent:
    return CollectionIntent(r["backend"], r["nonce"], r["tenant"], r["database"], r["name"], r["created_by"], r["created_at"])


_ROW_COLUMNS = (
    "backend, collection_id, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, "
    "created_at, updated_at, request_id, subject, predicate, object, extra, source, single_valued, "
    "supersedes_collection, supersedes_id, superseded_by_collection, superseded_by, superseded_at, content_hmac, "
    "fact_partition"
)
_N_ROW_COLUMNS = 27


def _pair(collection: Any, row_id: Any) -> tuple[str, str] | None:
    return None if row_id is None else (str(collection), str(row_id))


def _row_from_db(r: Any) -> Row:
    return Row(
        backend=r["backend"], collection=r["collection_id"], row_id=r["row_id"], tenant=r["tenant"],
        fleet=r["fleet"], owner=r["owner"], scope=r["scope"], writer=r["writer"], created_at=r["created_at"],
        status=r["status"], readers=tuple(json.loads(r["readers"])), labels=tuple(json.loads(r["labels"])),
        request_id=r["request_id"], subject=r["subject"], predicate=r["predicate"], object=r["object"],
        extra=json.loads(r["extra"]), source=r["source"], single_valued=bool(r["single_valued"]),
        supersedes=_pair(r["supersedes_collection"], r["supersedes_id"]),
        superseded_by=_pair(r["superseded_by_collection"], r["superseded_by"]),
        superseded_at=r["superseded_at"], content_hmac=r["content_hmac"],
    )


_EMPTY_LIST, _EMPTY_OBJECT = "[]", "{}"  # what `_row_to_db` stores for no readers / labels / extra


def _names(text: str) -> tuple[str, ...]:
    """A readers or labels column (a JSON list of strings) as a tuple; ``"[]"`` without the JSON parser."""
    return () if text == _EMPTY_LIST else tuple(json.loads(text))


def _row_from_tuple(t: tuple[Any, ...]) -> Row:
    """`_row_from_db` for a plain tuple in `_ROW_COLUMNS` order (a cursor without a row factory): the same
    `Row`, built by position instead of by name (`_row_from_read` of the tuple without ``updated_at`` and
    ``fact_partition``, which no `Row` field holds)."""
    return _row_from_read(t[:12] + t[13:26])


# The columns `SQLiteLedger.get_rows` reads: `_ROW_COLUMNS` less ``updated_at`` and ``fact_partition`` (no `Row`
# field holds them; two fewer values decoded per row on the read path).
_READ_ROW_COLUMNS = ", ".join(c for c in (c.strip() for c in _ROW_COLUMNS.split(",")) if c not in ("updated_at", "fact_partition"))


def _row_from_read(t: tuple[Any, ...]) -> Row:
    """`_row_from_db` for a plain tuple in `_READ_ROW_COLUMNS` order: the same `Row`, built by position, and
    with no JSON parse for empty readers, labels and extra (the common case). Used on the SQLite read path
    (`SQLiteLedger.get_rows`)."""
    (backend, collection, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, created_at,
     request_id, subject, predicate, obj, extra, source, single_valued, supersedes_collection, supersedes_id,
     superseded_by_collection, superseded_by, superseded_at, content_hmac) = t
    return Row(
        backend, collection, row_id, tenant, fleet, owner, scope, writer, created_at, status,
        _names(readers), _names(labels), request_id, subject, predicate, obj,
        {} if extra == _EMPTY_OBJECT else json.loads(extra), source, (), bool(single_valued),
        None if supersedes_id is None else (str(supersedes_collection), str(supersedes_id)),
        None if superseded_by is None else (str(superseded_by_collection), str(superseded_by)),
        superseded_at, content_hmac,
    )


_GET_ROWS_SQL: dict[int, str] = {}  # `get_rows` statement text by number of ids (sqlite3 caches by text)


def _get_rows_sql(n: int) -> str:
    sql = _GET_ROWS_SQL.get(n)
    if sql is None:
        sql = _GET_ROWS_SQL.setdefault(n, f"SELECT {_READ_ROW_COLUMNS} FROM rows WHERE backend = ? AND collection_id = ? "
                                          f"AND row_id IN ({','.join('?' * n)})")
    return sql


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
    are the statement's own, equal to the stored ones): the same `Row` as `_row_from_read`. Raises `_NotExact`
    when a time column holds a REAL."""
    (row_id, tenant, fleet, owner, scope, writer, created_at, status, readers, labels, request_id, subject, predicate,
     obj, extra, source, single_valued, supersedes_collection, supersedes_id, superseded_by_collection, superseded_by,
     superseded_at, content_hmac) = v
    if type(created_at) is float or type(superseded_at) is float:
        raise _NotExact
    return Row(
        backend, collection, row_id, tenant, fleet, owner, scope, writer, created_at, status,
        () if readers == _EMPTY_LIST else tuple(json.loads(readers)),
        () if labels == _EMPTY_LIST else tuple(json.loads(labels)), request_id, subject, predicate, obj,
        {} if extra == _EMPTY_OBJECT else json.loads(extra), source, (), bool(single_valued),
        None if supersedes_id is None else (str(supersedes_collection), str(supersedes_id)),
        None if superseded_by is None else (str(superseded_by_collection), str(superseded_by)),
        superseded_at, content_hmac,
    )


def _row_to_db(row: Row, updated_at: int) -> tuple[Any, ...]:
    return (
        row.backend, row.collection, row.row_id, row.tenant, row.fleet, row.owner, row.scope,
        json.dumps(list(row.readers)), json.dumps(list(row.labels)), row.status, row.writer,
        row.created_at, updated_at, row.request_id, row.subject, row.predicate, row.object, json.dumps(row.extra),
        row.source, int(row.single_valued), *(row.supersedes or (None, None)), *(row.superseded_by or (None, None)),
        row.superseded_at, row.content_hmac, fact_partition(row) if row.single_valued else None,
    )


def _chunks(items: list[str], size: int = 500) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class SQLiteLedger:
    """The `Ledger` protocol on one SQLite file. `path` may be ``":memory:"`` for unit tests."""

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

    def migrate(self) -> int:
        """Apply pending migrations; returns the schema version now in force."""
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            current = db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            for version in range(current, len(MIGRATIONS)):
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (version + 1,))
            return len(MIGRATIONS)

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
            return self._db.execute("SELECT 1").fetchone()[0] == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- keys and agents --------------------------------------------------------------------
    def create_key(self, kind: str, tenant: str | None, fleet: str | None, agent: str | None, trust: int,
                   roles: Iterable[str] = (), expires_at: int | None = None) -> tuple[KeyRecord, str]:
        """Store a new key (salted hash only) and return its record and the plaintext, shown once.

        Kinds: ``agent`` (tenant, fleet, agent, trust, roles), ``admin`` (tenant), ``operator`` (no tenant:
        the deployment). For agent keys the agent's record (trust and roles, as other rows' owner) is created
        or updated to this key's. `expires_at`: UTC µs from which the key is refused (None: never). Raises
        ValueError on bad input (`check_key_request`).
        """
        with self._tx() as db:
            return self._create_key(db, kind, tenant, fleet, agent, trust, roles, expires_at)

    def _create_key(self, db: sqlite3.Connection, kind: str, tenant: str | None, fleet: str | None, agent: str | None,
                    trust: int, roles: Iterable[str], expires_at: int | None) -> tuple[KeyRecord, str]:
        roles = check_key_request(kind, tenant, fleet, agent, trust, roles)
        key_id, secret = new_key_secret()
        salt = os.urandom(16)
        tenant = tenant if kind != "operator" else None
        record = KeyRecord(key_id, kind, tenant, fleet if kind == "agent" else None,
                           agent if kind == "agent" else None, trust if kind == "agent" else 0, now_us(), None, roles,
                           expires_at=expires_at)
        db.execute(
            "INSERT INTO api_keys (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at, roles, expires_at) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (key_id, salt.hex(), hash_secret(salt, secret), kind, tenant, record.fleet, record.agent, record.trust,
             record.created_at, json.dumps(list(roles)), expires_at),
        )
        if kind == "agent":
            assert tenant is not None and fleet is not None and agent is not None
            db.execute(
                "INSERT INTO agents (agent_uid, tenant, fleet, agent, trust, roles) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(agent_uid) DO UPDATE SET trust=excluded.trust, roles=excluded.roles",
                (agent_id(tenant, fleet, agent), tenant, fleet, agent, trust, json.dumps(list(roles))),
            )
        return record, f"mwk_{key_id}.{secret}"

    def authenticate(self, plaintext: str) -> Principal | None:
        """The principal of a valid (unrevoked, unexpired) key; None otherwise. Constant-time hash comparison.
        Records the key's use (`last_used_at`) when the stored time is a minute old or more."""
        parsed = parse_key(plaintext)
        if parsed is None:
            return None
        key_id, secret = parsed
        with self._lock:
            r = self._db.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        if r is None:
            # Spend the same work as a real comparison so unknown ids are not faster.
            hmac.compare_digest(hash_secret(b"\0" * 16, secret), "0" * 64)
            return None
        if not hmac.compare_digest(hash_secret(bytes.fromhex(r["salt"]), secret), r["hash"]):
            return None
        now = now_us()
        if not key_row_valid(r["revoked_at"], r["expires_at"], now):
            return None
        last = r["last_used_at"]
        if last is None or now - last >= LAST_USED_RESOLUTION_US:
            self._touch_key(key_id, now)
        return self._key(r).principal()

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

    @staticmethod
    def _key(r: sqlite3.Row) -> KeyRecord:
        return KeyRecord(r["key_id"], r["kind"], r["tenant"], r["fleet"], r["agent"], r["trust"], r["created_at"], r["revoked_at"],
                         tuple(json.loads(r["roles"])), r["expires_at"], r["last_used_at"], r["rotated_to"])

    def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        with self._lock:
            if tenant is None:
                rows = self._db.execute("SELECT * FROM api_keys ORDER BY created_at").fetchall()
            else:
                rows = self._db.execute("SELECT * FROM api_keys WHERE tenant = ? ORDER BY created_at", (tenant,)).fetchall()
        return [self._key(r) for r in rows]

    def key_valid(self, key_id: str) -> bool:
        """Whether key `key_id` exists, is not revoked and has not expired (read now)."""
        with self._lock:
            r = self._db.execute("SELECT 1 FROM api_keys WHERE key_id = ? AND revoked_at IS NULL AND "
                                 "(expires_at IS NULL OR expires_at > ?)", (key_id, now_us())).fetchone()
        return r is not None

    def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; True if it existed and was active."""
        with self._tx() as db:
            cur = db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (now_us(), key_id))
            return cur.rowcount == 1

    def rotate_key(self, key_id: str, grace_s: float, expires_at: int | None = None) -> tuple[KeyRecord, str, int]:
        """Replace key `key_id` by a new key of the same principal (kind, tenant, fleet, agent, trust, roles), in one
        transaction: the new key (expiring at `expires_at`, UTC µs; None: after the old key's lifetime when it had one,
        else never: `rotation_expiry`) is returned with its plaintext, and
        the old one stays valid for `grace_s` more seconds (never longer than it already would), recorded as rotated
        to the new one. Returns (new record, plaintext, the old key's expiry). Raises ValueError for a key that is
        unknown, revoked, expired or already rotated, or a negative grace."""
        if grace_s < 0:
            raise ValueError("the grace period is not negative")
        with self._tx() as db:
            r = db.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
            now = now_us()
            if r is None or not key_row_valid(r["revoked_at"], r["expires_at"], now):
                raise ValueError(f"no active key {key_id}")
            if r["rotated_to"] is not None:
                raise ValueError(f"key {key_id} was rotated already (to {r['rotated_to']}); rotate that one")
            old = self._key(r)
            record, plaintext = self._create_key(db, old.kind, old.tenant, old.fleet, old.agent, old.trust, old.roles,
                                                 rotation_expiry(old, now, expires_at))
            until = now + int(grace_s * 1_000_000)
            if old.expires_at is not None:
                until = min(until, old.expires_at)
            db.execute("UPDATE api_keys SET expires_at = ?, rotated_to = ? WHERE key_id = ?", (until, record.key_id, key_id))
        return record, plaintext, until

    def agent_entities(self, agent_uids: set[str]) -> dict[str, dict[str, Any]]:
        """Cedar entities of the known agents among `agent_uids`."""
        out: dict[str, dict[str, Any]] = {}
        ids = sorted(agent_uids)
        with self._lock:
            for chunk in _chunks(ids):
                q = f"SELECT * FROM agents WHERE agent_uid IN ({','.join('?' * len(chunk))})"
                for r in self._db.execute(q, chunk):
                    out[r["agent_uid"]] = agent_entity(r["tenant"], r["fleet"], r["agent"], r["trust"], tuple(json.loads(r["roles"])))
        return out

    # -- collections ------------------------------------------------------------------------
    def register_collection(self, record: CollectionRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO collections (backend, collection_id, tenant, database, name, created_by, created_at) VALUES (?,?,?,?,?,?,?)",
                (record.backend, record.collection_id, record.tenant, record.database, record.name, record.created_by, record.created_at),
            )

    def get_collection(self, backend: str, collection_id: str) -> CollectionRecord | None:
        with self._lock:
            r = self._db.execute(
                "SELECT * FROM collections WHERE backend = ? AND collection_id = ? AND deleted_at IS NULL", (backend, collection_id)
            ).fetchone()
        return None if r is None else self._collection(r)

    @staticmethod
    def _collection(r: sqlite3.Row) -> CollectionRecord:
        return CollectionRecord(r["backend"], r["collection_id"], r["tenant"], r["database"], r["name"], r["created_by"], r["created_at"])

    def list_collections(self, backend: str, tenant: str, database: str) -> list[CollectionRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM collections WHERE backend = ? AND tenant = ? AND database = ? AND deleted_at IS NULL",
                (backend, tenant, database),
            ).fetchall()
        return [self._collection(r) for r in rows]

    def record_collection_intent(self, intent: CollectionIntent) -> None:
        """Record a collection create about to be sent to the backend (durable before it returns)."""
        with self._tx() as db:
            db.execute("INSERT INTO collection_intents VALUES (?,?,?,?,?,?,?)", _intent_to_db(intent))

    def collection_intent(self, backend: str, nonce: str) -> CollectionIntent | None:
        with self._lock:
            r = self._db.execute("SELECT * FROM collection_intents WHERE backend = ? AND nonce = ?", (backend, nonce)).fetchone()
        return None if r is None else _intent_from_db(r)

    def resolve_collection_intent(self, intent: CollectionIntent, record: CollectionRecord | None) -> None:
        """In one transaction: register `record` (the collection `intent` made; None: it made none) and drop every
        intent of the same name (a create that failed leaves nothing to resolve later)."""
        with self._tx() as db:
            if record is not None:
                db.execute(
                    "INSERT INTO collections (backend, collection_id, tenant, database, name, created_by, created_at) VALUES (?,?,?,?,?,?,?)",
                    (record.backend, record.collection_id, record.tenant, record.database, record.name, record.created_by, record.created_at),
                )
            db.execute("DELETE FROM collection_intents WHERE backend = ? AND (nonce = ? OR (? AND tenant = ? AND database = ? AND name = ?))",
                       (intent.backend, intent.nonce, record is not None, intent.tenant, intent.database, intent.name))

    def delete_collection(self, backend: str, collection_id: str, by: str, request_id: str) -> None:
        """Mark the collection deleted and tombstone all its rows (durable), in one transaction."""
        t = now_us()
        with self._tx() as db:
            db.execute("UPDATE collections SET deleted_at = ? WHERE backend = ? AND collection_id = ?", (t, backend, collection_id))
            db.execute(
                "INSERT OR IGNORE INTO tombstones (backend, collection_id, row_id, deleted_at, deleted_by, request_id, backend_deleted_at) "
                "SELECT backend, collection_id, row_id, ?, ?, ?, ? FROM rows WHERE backend = ? AND collection_id = ? AND status != 'pending'",
                (t, by, request_id, t, backend, collection_id),
            )
            db.execute("UPDATE rows SET status = 'deleted', updated_at = ? WHERE backend = ? AND collection_id = ?", (t, backend, collection_id))

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
            order = sorted(ids) if len(ids) <= 500 else [i for chunk in _chunks(ids) for i in sorted(chunk)]
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
        (`_row_from_read`)."""
        out: dict[str, Row] = {}
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None  # plain tuples, read by position (`_row_from_read`)
            for chunk in _chunks(ids):
                for t in cur.execute(_get_rows_sql(len(chunk)), (backend, collection_id, *chunk)):
                    out[t[2]] = _row_from_read(t)
        return out

    def reserve_rows(self, rows: list[Row]) -> list[str]:
        """Insert `rows` with status ``pending`` atomically; returns the ids that already exist (then inserts none)."""
        if not rows:
            return []
        t = now_us()
        with self._tx() as db:
            backend, collection = rows[0].backend, rows[0].collection
            ids = [r.row_id for r in rows]
            existing: list[str] = []
            for chunk in _chunks(ids):
                q = f"SELECT row_id FROM rows WHERE backend = ? AND collection_id = ? AND row_id IN ({','.join('?' * len(chunk))})"
                existing += [r[0] for r in db.execute(q, (backend, collection, *chunk))]
            if existing:
                return existing
            for row in rows:
                row.status = "pending"
                db.execute(f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * _N_ROW_COLUMNS)})", _row_to_db(row, t))
                for parent_collection, parent_id in row.derived_from:
                    db.execute("INSERT OR IGNORE INTO lineage VALUES (?,?,?,?,?)",
                               (row.backend, row.collection, row.row_id, parent_collection, parent_id))
        return []

    def adopt_rows(self, rows: list[Row], listing: list[tuple[str, str, str]] | None = None) -> list[str]:
        """Register rows that already exist in the backend (``memwarden adopt``), active, in one transaction.

        A row whose (backend, collection, id) the ledger already holds, in any state — governed, pending,
        tombstoned — is left exactly as it is: adoption never widens, re-scopes or revives a row. Rows must
        share one backend and collection. `listing`: (tenant, field, value) entity ids under which the backend
        lists the rows (`listing_keys`), recorded in the same transaction. Returns the ids inserted."""
        if not rows:
            return []
        t = now_us()
        with self._tx() as db:
            inserted: list[str] = []
            for row in rows:
                row.status = "active"
                n = db.total_changes
                db.execute(f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * _N_ROW_COLUMNS)}) ON CONFLICT DO NOTHING",
                           _row_to_db(row, t))
                if db.total_changes > n:
                    inserted.append(row.row_id)
            for tenant, field, value in listing or []:
                db.execute("INSERT INTO listing_keys VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
                           (rows[0].backend, rows[0].collection, tenant, field, value))
        return inserted

    def listing_keys(self, backend: str, collection_id: str, tenant: str) -> list[tuple[str, str]]:
        """(field, value) entity ids under which adopted rows of `tenant` are listed in the backend, sorted."""
        with self._lock:
            rows = self._db.execute(
                "SELECT field, value FROM listing_keys WHERE backend = ? AND collection_id = ? AND tenant = ? ORDER BY field, value",
                (backend, collection_id, tenant)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def activate_rows(self, backend: str, collection_id: str, row_ids: list[str],
                      expect: Mapping[str, tuple[str, str] | None] | None = None) -> list[tuple[str, tuple[str, str]]]:
        """Make reserved rows active. A row with a single-valued triple supersedes the active row for
        (backend, tenant, collection, visibility partition, subject, predicate) in the same transaction;
        returns (new id, superseded (collection, id)) pairs. The partial unique index
        ``rows_one_active_fact`` is the constraint.

        `expect` (compare-and-set): for a row named in it, the (collection, id) of the fact it may
        supersede, or None for none; when the active fact differs, `StaleFact` is raised and nothing
        is activated (the caller decides again on the new fact)."""
        with self._tx() as db:
            return _activate(db, "?", backend, collection_id, row_ids, expect, lock=None)

    def release_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> None:
        """Drop write reservations (status pending) after a failed backend write."""
        with self._tx() as db:
            for chunk in _chunks(row_ids):
                db.execute(
                    f"DELETE FROM lineage WHERE backend = ? AND collection_id = ? AND row_id IN ({','.join('?' * len(chunk))}) "
                    f"AND row_id IN (SELECT row_id FROM rows WHERE backend = ? AND collection_id = ? AND status = 'pending')",
                    (backend, collection_id, *chunk, backend, collection_id),
                )
                db.execute(
                    f"DELETE FROM rows WHERE backend = ? AND collection_id = ? AND status = 'pending' "
                    f"AND row_id IN ({','.join('?' * len(chunk))})", (backend, collection_id, *chunk),
                )

    def update_governance(self, rows: list[Row], *, holder: str | None = None,
                          history: Mapping[str, str | None] | None = None) -> None:
        """Persist scope, fleet, readers, labels and content HMAC of existing rows (`Ledger.update_governance`:
        `holder` must hold their update markers, which are then released; `history` records their versions)."""
        t = now_us()
        with self._tx() as db:
            _before_update(db, "?", rows, t, holder, history)
            for row in rows:
                db.execute(
                    "UPDATE rows SET scope = ?, fleet = ?, readers = ?, labels = ?, content_hmac = ?, fact_partition = ?, "
                    "updated_at = ? WHERE backend = ? AND collection_id = ? AND row_id = ?",
                    (row.scope, row.fleet, json.dumps(list(row.readers)), json.dumps(list(row.labels)), row.content_hmac,
                     fact_partition(row) if row.single_valued else None, t, row.backend, row.collection, row.row_id),
                )
            _release_holder(db, "?", rows, holder)

    def begin_update(self, backend: str, collection_id: str, row_ids: list[str], request_id: str,
                     lease_s: float = UPDATE_LEASE_S) -> list[str]:
        """`Ledger.begin_update`: all markers or none, in one transaction (``BEGIN IMMEDIATE``: one writer at a time)."""
        try:
            with self._tx() as db:
                _begin_update(db, "?", backend, collection_id, row_ids, request_id, now_us(), int(lease_s * 1_000_000))
        except _Busy as busy:
            return busy.row_ids
        return []

    def end_update(self, backend: str, collection_id: str, row_ids: list[str], request_id: str) -> None:
        """`Ledger.end_update`."""
        with self._tx() as db:
            _end_update(db, "?", backend, collection_id, row_ids, request_id)

    def row_versions(self, backend: str, collection_id: str, row_id: str) -> list[RowVersion]:
        """`Ledger.row_versions`."""
        with self._lock:
            rows = self._db.execute(_ROW_VERSIONS_SQL, (backend, collection_id, row_id)).fetchall()
        return [_version_from_db(r) for r in rows]

    def tombstone(self, backend: str, collection_id: str, row_ids: list[str], by: str, request_id: str,
                  closure: str = "cascade", also: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
        """Durably mark rows deleted (status + tombstone) before the backend delete is attempted.

        Deletion closure in the same transaction: with ``closure="cascade"`` every row derived from a
        deleted row, transitively; `also` adds (collection, id) rows the caller chose (content copies it
        may delete). Content HMACs of every tombstoned row are remembered per tenant (`forgotten`).
        Returns every (collection, row id) tombstoned, the requested ones first; the caller deletes them
        from the backend (the reconciler retries what it could not).
        """
        t = now_us()
        with self._tx() as db:
            return _closure_tombstone(db, "?", backend, collection_id, row_ids, by, request_id, closure, t, also or [])

    def reset(self, backend: str, collection_id: str | None, by: str, request_id: str) -> int:
        """An operator's reset of the deployment, recorded once the backend's own reset succeeded (a reset the
        backend refuses changes nothing here): every row of `backend` (or of one ledger collection, e.g. a Mem0
        deployment) is tombstoned, pending rows included (they never activate), and with `collection_id` None
        every collection is marked deleted. Content is not remembered as forgotten (a reset is not a tenant
        deleting memory). Returns the number of rows tombstoned; `reset_done` confirms their backend deletes."""
        with self._tx() as db:
            return _reset(db, "?", backend, collection_id, by, request_id, now_us())

    def reset_done(self, backend: str, collection_id: str | None) -> None:
        """The backend's reset succeeded: every tombstone of `backend` (or the collection) is confirmed."""
        with self._tx() as db:
            _reset_done(db, "?", backend, collection_id, now_us())

    def content_copies(self, backend: str, tenant: str, digests: list[str], deleted: bool = False) -> list[Row]:
        """Rows of `tenant` whose content HMAC is one of `digests`: servable ones (candidates for
        closure), or with `deleted` the tombstoned ones (to judge a re-write of forgotten content)."""
        statuses = "('deleted')" if deleted else "('active', 'superseded')"
        out: list[Row] = []
        with self._lock:
            for chunk in _chunks(list(dict.fromkeys(digests))):
                q = (f"SELECT {_ROW_COLUMNS} FROM rows WHERE backend = ? AND tenant = ? AND status IN {statuses} "
                     f"AND content_hmac IN ({','.join('?' * len(chunk))})")
                out += [_row_from_db(r) for r in self._db.execute(q, (backend, tenant, *chunk))]
        return out

    def active_fact(self, backend: str, tenant: str, subject: str, predicate: str, *,
                    collection: str | None = None, partition: str | None = None) -> Row | None:
        """The active single-valued row for (tenant, subject, predicate) in one ledger `collection` and
        visibility `partition` (`governance.fact_partition`) when given; None if none. Over several
        partitions, the newest."""
        sql, args = _fact_query(backend, tenant, subject, predicate, collection, partition)
        with self._lock:
            r = self._db.execute(sql, args).fetchone()
        return None if r is None else _row_from_db(r)

    def forgotten(self, tenant: str, hmacs: list[str]) -> set[str]:
        """The subset of content HMACs that belong to deleted rows of `tenant`."""
        out: set[str] = set()
        with self._lock:
            for chunk in _chunks(list(dict.fromkeys(hmacs))):
                q = f"SELECT content_hmac FROM forgotten_content WHERE tenant = ? AND content_hmac IN ({','.join('?' * len(chunk))})"
                out.update(r[0] for r in self._db.execute(q, (tenant, *chunk)))
        return out

    def content_key(self) -> bytes:
        """The ledger's content-HMAC key (32 random bytes, created once, shared by every replica)."""
        with self._tx() as db:
            r = db.execute("SELECT value FROM ledger_secrets WHERE name = 'content_hmac_key'").fetchone()
            if r is None:
                value = os.urandom(32).hex()
                db.execute("INSERT INTO ledger_secrets (name, value) VALUES ('content_hmac_key', ?)", (value,))
                return bytes.fromhex(value)
            return bytes.fromhex(r[0])

    def lineage(self, backend: str, collection_id: str, row_id: str, max_nodes: int = 1000) -> list[tuple[int, Row | None, tuple[str, str], list[tuple[str, str]]]]:
        """Ancestors of a row, breadth first: (depth, ledger row or None, (collection, id), parents)."""
        with self._lock:
            return _walk_lineage(lambda q, a: self._db.execute(q.replace("%s", "?"), a).fetchall(), backend, collection_id, row_id, max_nodes)

    def backend_deleted_tombstones(self, backend: str, after: tuple[str, str] = ("", ""), limit: int = 500) -> list[tuple[str, str]]:
        """Tombstones whose backend delete was confirmed, in key order after `after` (for reappearance checks)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT collection_id, row_id FROM tombstones WHERE backend = ? AND backend_deleted_at IS NOT NULL "
                "AND (collection_id, row_id) > (?, ?) ORDER BY collection_id, row_id LIMIT ?", (backend, *after, limit)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def mark_backend_deleted(self, backend: str, collection_id: str, row_ids: list[str]) -> None:
        t = now_us()
        with self._tx() as db:
            for chunk in _chunks(row_ids):
                db.execute(
                    f"UPDATE tombstones SET backend_deleted_at = ? WHERE backend = ? AND collection_id = ? "
                    f"AND row_id IN ({','.join('?' * len(chunk))})", (t, backend, collection_id, *chunk),
                )

    def visibility_counts(self, backend: str, collection_id: str) -> list[tuple[str, str, str, tuple[str, ...], str, int]]:
        """Rows of a collection per (scope, fleet, owner, readers, status): the query planner's statistics."""
        with self._lock:
            rows = self._db.execute(
                "SELECT scope, fleet, owner, readers, status, COUNT(*) FROM rows WHERE backend = ? AND collection_id = ? "
                "GROUP BY scope, fleet, owner, readers, status", (backend, collection_id)).fetchall()
        return [(r[0], r[1], r[2], tuple(json.loads(r[3])), r[4], int(r[5])) for r in rows]

    def visible_row_ids(self, backend: str, collection_id: str, tenant: str, reader: Reader | None,
                        limit: int) -> list[str] | None:
        """`Ledger.visible_row_ids`: one statement over the collection's rows (`_visible_ids_query`)."""
        sql, args = _visible_ids_query("?", "EXISTS (SELECT 1 FROM json_each(rows.readers) WHERE value = ?)",
                                       backend, collection_id, tenant, reader, limit)
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            return _visible(cur.execute(sql, args).fetchall(), limit)

    def visible_owners(self, backend: str, collection_id: str, tenant: str, reader: Reader | None) -> list[str]:
        """`Ledger.visible_owners`: one statement (`_visible_query`)."""
        sql, args = _visible_query("?", READS_JSON_SQLITE, backend, collection_id, tenant, reader, "DISTINCT owner", union="UNION")
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            return sorted(r[0] for r in cur.execute(sql, args).fetchall())

    def visible_row_ids_of(self, backend: str, collection_id: str, tenant: str, reader: Reader | None, owner: str,
                           limit: int) -> list[str] | None:
        """`Ledger.visible_row_ids_of`: one statement (`_visible_query`)."""
        sql, args = _visible_query("?", READS_JSON_SQLITE, backend, collection_id, tenant, reader, "row_id", owner=owner)
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = None
            return _visible(cur.execute(f"{sql} LIMIT ?", (*args, limit + 1)).fetchall(), limit)

    def pending_tombstones(self, backend: str) -> list[tuple[str, str]]:
        """(collection_id, row_id) of tombstones whose backend delete has not been confirmed."""
        with self._lock:
            rows = self._db.execute(
                "SELECT collection_id, row_id FROM tombstones WHERE backend = ? AND backend_deleted_at IS NULL", (backend,)
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def last_backend_delete(self, backend: str) -> int | None:
        """When (UTC µs) the backend last confirmed a delete of `backend` (newest ``backend_deleted_at`` of its
        tombstones, a reset's included); None when none is confirmed. Read by the scheduled purge
        (`sidecar.erase.schedule`) to purge only after deletes."""
        with self._lock:
            r = self._db.execute("SELECT MAX(backend_deleted_at) FROM tombstones WHERE backend = ?", (backend,)).fetchone()
        return None if r is None or r[0] is None else int(r[0])


Reader = tuple[str, str | None, bool]  # (agent uid, fleet, any fleet): the reader side of the visibility filter
# (admitted ids, their ledger rows by id, their owners' Cedar entities by agent uid, key valid): `visible_rows`
VisibleRows = tuple[list[str], dict[str, Row], dict[str, dict[str, Any]], bool]


def _visible_ids_query(ph: str, reads_json: str, backend: str, collection_id: str, tenant: str, reader: Reader | None,
                       limit: int, columns: str = "row_id") -> tuple[str, tuple[Any, ...]]:
    """The statement of `visible_row_ids` (shared by both ledgers): `ph` is the placeholder, `reads_json` the
    dialect's "readers (JSON array text) holds the string ``{ph}``" test; `columns` what it selects of each
    admitted row (PostgreSQL's `visible_rows`: the whole row)."""
    base = (f"SELECT {columns} FROM rows WHERE backend = {ph} AND collection_id = {ph} AND tenant = {ph} "
            "AND status NOT IN ('deleted', 'pending')")
    common: tuple[Any, ...] = (backend, collection_id, tenant)
    if reader is None:
        return f"{base} LIMIT {ph}", common + (limit + 1,)
    # One branch per disjunct of the visibility predicate (`sidecar.core.visibility.sql_branches`: the scopes
    # exclude each other, so no row is listed twice), each an index range (migration 8).
    parts = [(f"{base} AND {cond}", common + args)
             for cond, args in sql_branches(Visibility.of_reader(tenant, reader), ph, reads_json)]
    sql = " UNION ALL ".join(q for q, _ in parts) + f" LIMIT {ph}"
    return sql, tuple(a for _, args in parts for a in args) + (limit + 1,)


READS_JSON_SQLITE = "EXISTS (SELECT 1 FROM json_each(rows.readers) WHERE value = ?)"


def _visible_query(ph: str, reads_json: str, backend: str, collection_id: str, tenant: str, reader: Reader | None,
                   select: str, owner: str | None = None, union: str = "UNION ALL") -> tuple[str, tuple[Any, ...]]:
    """``SELECT select`` over the rows `_visible_ids_query` admits (of `owner` only, when given), one branch per
    disjunct of the visibility predicate joined by `union`, without a LIMIT (shared by both ledgers: `ph` and
    `reads_json` as there)."""
    base = (f"SELECT {select} FROM rows WHERE backend = {ph} AND collection_id = {ph} AND tenant = {ph} "
            "AND status NOT IN ('deleted', 'pending')")
    common: tuple[Any, ...] = (backend, collection_id, tenant)
    if owner is not None:
        base, common = f"{base} AND owner = {ph}", common + (owner,)
    parts = [(f"{base} AND {cond}", common + args)
             for cond, args in sql_branches(Visibility.of_reader(tenant, reader), ph, reads_json)]
    return f" {union} ".join(q for q, _ in parts), tuple(a for _, args in parts for a in args)


def _visible(rows: list[Any], limit: int) -> list[str] | None:
    ids = [r[0] for r in rows]
    return None if len(ids) > limit else ids


def _reset(db: Any, ph: str, backend: str, collection_id: str | None, by: str, request_id: str, t: int) -> int:
    """`Ledger.reset` inside the caller's transaction (shared by both ledgers)."""
    scope, args = ("backend = ? AND collection_id = ?", (backend, collection_id)) if collection_id is not None \
        else ("backend = ?", (backend,))

    def q(sql: str, params: tuple[Any, ...]) -> Any:
        return db.execute(sql.replace("?", ph), params)

    if collection_id is None:
        q(f"UPDATE collections SET deleted_at = ? WHERE {scope} AND deleted_at IS NULL", (t, *args))
    q("INSERT INTO tombstones (backend, collection_id, row_id, deleted_at, deleted_by, request_id) "
      f"SELECT backend, collection_id, row_id, ?, ?, ? FROM rows WHERE {scope} AND status != 'deleted' "
      "ON CONFLICT DO NOTHING", (t, by, request_id, *args))
    cur = q(f"UPDATE rows SET status = 'deleted', updated_at = ? WHERE {scope} AND status != 'deleted'", (t, *args))
    return int(cur.rowcount)


def _reset_done(db: Any, ph: str, backend: str, collection_id: str | None, t: int) -> None:
    scope, args = ("backend = ? AND collection_id = ?", (backend, collection_id)) if collection_id is not None \
        else ("backend = ?", (backend,))
    db.execute(f"UPDATE tombstones SET backend_deleted_at = ? WHERE {scope} AND backend_deleted_at IS NULL".replace("?", ph),
               (t, *args))


def _fact_query(backend: str, tenant: str, subject: str, predicate: str, collection: str | None,
                partition: str | None) -> tuple[str, tuple[Any, ...]]:
    """``active_fact``'s query with ``?`` placeholders (both ledgers)."""
    sql = (f"SELECT {_ROW_COLUMNS} FROM rows WHERE backend = ? AND tenant = ? AND subject = ? AND predicate = ? "
           "AND status = 'active' AND single_valued = 1")
    args: list[Any] = [backend, tenant, subject, predicate]
    if collection is not None:
        sql, args = sql + " AND collection_id = ?", [*args, collection]
    if partition is not None:
        sql, args = sql + " AND fact_partition = ?", [*args, partition]
    return sql + " ORDER BY created_at DESC, row_id LIMIT 1", tuple(args)


class _Busy(Exception):
    """`_begin_update`: rows another update holds (the transaction is rolled back: no marker is taken)."""

    def __init__(self, row_ids: list[str]) -> None:
        super().__init__(row_ids)
        self.row_ids = row_ids


def _begin_update(db: Any, ph: str, backend: str, collection_id: str, row_ids: list[str], request_id: str, now: int,
                  lease_us: int) -> None:
    """`begin_update` of the SQLite and PostgreSQL ledgers, inside the caller's transaction: one upsert per chunk of
    ids that takes a row's marker when there is none, when it is `request_id`'s, or when it is older than `lease_us`
    (an update that died). Raises `_Busy` with the ids it could not take; the caller rolls back. On PostgreSQL a
    concurrent taker of the same row waits on the row's unique index for this transaction, then sees its marker."""
    ids = sorted(set(row_ids))
    taken: set[str] = set()
    for chunk in _chunks(ids):
        sql = ("INSERT INTO row_updates (backend, collection_id, row_id, request_id, started_at) VALUES "
               + ",".join(["(?, ?, ?, ?, ?)"] * len(chunk))
               + " ON CONFLICT (backend, collection_id, row_id) DO UPDATE SET request_id = excluded.request_id, "
               "started_at = excluded.started_at WHERE row_updates.started_at <= ? OR row_updates.request_id = excluded.request_id "
               "RETURNING row_id")
        args = [a for i in chunk for a in (backend, collection_id, i, request_id, now)] + [now - lease_us]
        taken.update(r["row_id"] for r in db.execute(sql.replace("?", ph), tuple(args)).fetchall())
    busy = [i for i in ids if i not in taken]
    if busy:
        raise _Busy(busy)


def _end_update(db: Any, ph: str, backend: str, collection_id: str, row_ids: list[str], request_id: str) -> None:
    for chunk in _chunks(sorted(set(row_ids))):
        db.execute((f"DELETE FROM row_updates WHERE backend = ? AND collection_id = ? AND request_id = ? "
                    f"AND row_id IN ({','.join('?' * len(chunk))})").replace("?", ph),
                   (backend, collection_id, request_id, *chunk))


def _before_update(db: Any, ph: str, rows: list[Row], t: int, holder: str | None,
                   history: Mapping[str, str | None] | None) -> None:
    """The part of `update_governance` before the rows are written, inside its transaction: with `holder`, every
    row's marker must be the holder's (else `UpdateLost`, and the caller's transaction is rolled back); with
    `history`, each named row's new version is recorded — its governance before this update first, as version 0
    ``created``, when the row has no version yet."""
    def q(sql: str, args: tuple[Any, ...]) -> Any:
        return db.execute(sql.replace("?", ph), args)

    if holder is not None:
        lost = []
        for (backend, collection_id), ids in _by_collection(rows).items():
            held = {r["row_id"] for chunk in _chunks(ids) for r in q(
                f"SELECT row_id FROM row_updates WHERE backend = ? AND collection_id = ? AND request_id = ? "
                f"AND row_id IN ({','.join('?' * len(chunk))})", (backend, collection_id, holder, *chunk)).fetchall()}
            lost += [i for i in ids if i not in held]
        if lost:
            raise UpdateLost(lost)
    for row in rows:
        if history is None or row.row_id not in history:
            continue
        key = (row.backend, row.collection, row.row_id)
        last = q("SELECT MAX(version) AS v FROM row_versions WHERE backend = ? AND collection_id = ? AND row_id = ?",
                 key).fetchone()["v"]
        if last is None:
            q("INSERT INTO row_versions (backend, collection_id, row_id, version, kind, event_id, tenant, fleet, owner, "
              "scope, readers, labels, written_at, request_id) SELECT backend, collection_id, row_id, 0, 'created', NULL, "
              "tenant, fleet, owner, scope, readers, labels, updated_at, request_id FROM rows "
              "WHERE backend = ? AND collection_id = ? AND row_id = ?", key)
            last = 0
        q("INSERT INTO row_versions (backend, collection_id, row_id, version, kind, event_id, tenant, fleet, owner, "
          "scope, readers, labels, written_at, request_id) VALUES (?, ?, ?, ?, 'update', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
          (*key, int(last) + 1, history[row.row_id], row.tenant, row.fleet, row.owner, row.scope,
           json.dumps(list(row.readers)), json.dumps(list(row.labels)), t, holder or ""))


def _release_holder(db: Any, ph: str, rows: list[Row], holder: str | None) -> None:
    """The end of `update_governance` with `holder`: every marker the holder has in the rows' collections released."""
    if holder is None:
        return
    for backend, collection_id in _by_collection(rows):
        db.execute("DELETE FROM row_updates WHERE backend = ? AND collection_id = ? AND request_id = ?".replace("?", ph),
                   (backend, collection_id, holder))


def _by_collection(rows: list[Row]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        ids = out.setdefault((row.backend, row.collection), [])
        if row.row_id not in ids:
            ids.append(row.row_id)
    return out


_ROW_VERSIONS_SQL = ("SELECT version, kind, event_id, tenant, fleet, owner, scope, readers, labels, written_at, request_id "
                     "FROM row_versions WHERE backend = ? AND collection_id = ? AND row_id = ? ORDER BY version")


def _version_from_db(r: Any) -> RowVersion:
    return RowVersion(int(r["version"]), r["kind"], r["event_id"], r["tenant"], r["fleet"], r["owner"], r["scope"],
                      _names(r["readers"]), _names(r["labels"]), int(r["written_at"]), r["request_id"])


def _activate(db: Any, ph: str, backend: str, collection_id: str, row_ids: list[str],
              expect: Mapping[str, tuple[str, str] | None] | None, lock: Callable[[Any, list[Any]], None] | None,
              for_update: str = "") -> list[tuple[str, tuple[str, str]]]:
    """`activate_rows` of the SQLite and PostgreSQL ledgers, inside the caller's transaction (`ph` is the
    driver's placeholder; `lock(db, key)` serialises activations of one single-valued key where the
    database needs it; `for_update` is appended to the select of the current fact)."""
    def q(sql: str, args: tuple[Any, ...]) -> Any:
        return db.execute(sql.replace("?", ph), args)

    t = now_us()
    replaced: list[tuple[str, tuple[str, str]]] = []
    for row_id in row_ids:
        r = q("SELECT tenant, subject, predicate, single_valued, fact_partition FROM rows WHERE backend = ? AND "
              "collection_id = ? AND row_id = ? AND status = 'pending'", (backend, collection_id, row_id)).fetchone()
        if r is None:
            continue
        old = None
        if r["single_valued"] and r["subject"] is not None and r["predicate"] is not None:
            key = [backend, r["tenant"], collection_id, r["fact_partition"], r["subject"], r["predicate"]]
            if lock is not None:
                lock(db, key)
            old = q("SELECT collection_id, row_id FROM rows WHERE backend = ? AND tenant = ? AND collection_id = ? "
                    "AND fact_partition = ? AND subject = ? AND predicate = ? AND status = 'active' AND single_valued = 1"
                    + for_update, tuple(key)).fetchone()
        if expect is not None and row_id in expect:
            current = (old["collection_id"], old["row_id"]) if old is not None else None
            if current != expect[row_id]:
                raise StaleFact(row_id, current)
        if old is not None:
            q("UPDATE rows SET status = 'superseded', superseded_by_collection = ?, superseded_by = ?, "
              "superseded_at = ?, updated_at = ? WHERE backend = ? AND collection_id = ? AND row_id = ?",
              (collection_id, row_id, t, t, backend, old["collection_id"], old["row_id"]))
            replaced.append((row_id, (old["collection_id"], old["row_id"])))
        q("UPDATE rows SET status = 'active', supersedes_collection = ?, supersedes_id = ?, updated_at = ? "
          "WHERE backend = ? AND collection_id = ? AND row_id = ?",
          (old["collection_id"] if old else None, old["row_id"] if old else None, t, backend, collection_id, row_id))
    return replaced


def _closure_tombstone(db: Any, ph: str, backend: str, collection_id: str, row_ids: list[str], by: str,
                       request_id: str, closure: str, t: int, also: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Shared by the SQLite and PostgreSQL ledgers (`ph` is the driver's placeholder)."""
    def q(sql: str, args: tuple[Any, ...]) -> list[Any]:
        return list(db.execute(sql.replace("?", ph), args).fetchall())

    order: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    queue = [(collection_id, r) for r in row_ids] + list(also)
    while queue:
        key = queue.pop(0)
        if key in seen:
            continue
        seen.add(key)
        order.append(key)
        rows = q("SELECT tenant, content_hmac FROM rows WHERE backend = ? AND collection_id = ? AND row_id = ?", (backend, *key))
        if rows and rows[0]["content_hmac"]:
            tenant, digest = rows[0]["tenant"], rows[0]["content_hmac"]
            db.execute(("INSERT INTO forgotten_content (tenant, content_hmac, deleted_at) VALUES (?,?,?) "
                        "ON CONFLICT (tenant, content_hmac) DO NOTHING").replace("?", ph), (tenant, digest, t))
        if closure == "cascade":
            queue += [(r["collection_id"], r["row_id"]) for r in q(
                "SELECT collection_id, row_id FROM lineage WHERE backend = ? AND parent_collection_id = ? AND parent_row_id = ?",
                (backend, *key))]
    for coll, row_id in order:
        db.execute(("INSERT INTO tombstones (backend, collection_id, row_id, deleted_at, deleted_by, request_id) "
                    "VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING").replace("?", ph), (backend, coll, row_id, t, by, request_id))
        db.execute("UPDATE rows SET status = 'deleted', updated_at = ? WHERE backend = ? AND collection_id = ? AND row_id = ?".replace("?", ph),
                   (t, backend, coll, row_id))
    return order


def _walk_lineage(fetch: Any, backend: str, collection_id: str, row_id: str,
                  max_nodes: int) -> list[tuple[int, Row | None, tuple[str, str], list[tuple[str, str]]]]:
    out: list[tuple[int, Row | None, tuple[str, str], list[tuple[str, str]]]] = []
    seen: set[tuple[str, str]] = set()
    frontier = [(0, (collection_id, row_id))]
    while frontier and len(out) < max_nodes:
        depth, key = frontier.pop(0)
        if key in seen:
            continue
        seen.add(key)
        found = fetch(f"SELECT {_ROW_COLUMNS} FROM rows WHERE backend = %s AND collection_id = %s AND row_id = %s", (backend, *key))
        parents = [(r["parent_collection_id"], r["parent_row_id"]) for r in fetch(
            "SELECT parent_collection_id, parent_row_id FROM lineage WHERE backend = %s AND collection_id = %s AND row_id = %s "
            "ORDER BY parent_collection_id, parent_row_id", (backend, *key))]
        out.append((depth, _row_from_db(found[0]) if found else None, key, parents))
        frontier += [(depth + 1, p) for p in parents]
    return out
