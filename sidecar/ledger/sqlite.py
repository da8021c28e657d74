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
from pathlib import Path
from typing import Any, Iterator

from contextlib import contextmanager

from sidecar.governance import Principal, Row, agent_entity, agent_id
from sidecar.ledger.base import CollectionRecord, KeyRecord, hash_secret, new_key_secret, now_us, parse_key

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
]

_ROW_COLUMNS = (
    "backend, collection_id, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, "
    "created_at, updated_at, request_id, subject, predicate, object, extra"
)


def _row_from_db(r: sqlite3.Row) -> Row:
    return Row(
        backend=r["backend"], collection=r["collection_id"], row_id=r["row_id"], tenant=r["tenant"],
        fleet=r["fleet"], owner=r["owner"], scope=r["scope"], writer=r["writer"], created_at=r["created_at"],
        status=r["status"], readers=tuple(json.loads(r["readers"])), labels=tuple(json.loads(r["labels"])),
        request_id=r["request_id"], subject=r["subject"], predicate=r["predicate"], object=r["object"],
        extra=json.loads(r["extra"]),
    )


def _row_to_db(row: Row, updated_at: int) -> tuple[Any, ...]:
    return (
        row.backend, row.collection, row.row_id, row.tenant, row.fleet, row.owner, row.scope,
        json.dumps(list(row.readers)), json.dumps(list(row.labels)), row.status, row.writer,
        row.created_at, updated_at, row.request_id, row.subject, row.predicate, row.object, json.dumps(row.extra),
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
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=30000")
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

    def ping(self) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1").fetchone()[0] == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- keys and agents --------------------------------------------------------------------
    def create_key(self, kind: str, tenant: str, fleet: str | None, agent: str | None, trust: int) -> tuple[KeyRecord, str]:
        """Store a new key (salted hash only) and return its record and the plaintext, shown once.

        For agent keys the agent's record (trust) is created or updated. Raises ValueError on bad input.
        """
        if kind not in ("agent", "admin"):
            raise ValueError("kind must be 'agent' or 'admin'")
        for name, value in (("tenant", tenant), ("fleet", fleet), ("agent", agent)):
            if value is not None and (not value or "/" in value or ":" in value or not value.isprintable()):
                raise ValueError(f"{name} must be a non-empty printable name without '/' or ':'")
        if kind == "agent" and (not fleet or not agent):
            raise ValueError("agent keys need fleet and agent")
        if not 0 <= trust <= 3:
            raise ValueError("trust must be 0..3")
        key_id, secret = new_key_secret()
        salt = os.urandom(16)
        record = KeyRecord(key_id, kind, tenant, fleet if kind == "agent" else None,
                           agent if kind == "agent" else None, trust if kind == "agent" else 0, now_us(), None)
        with self._tx() as db:
            db.execute(
                "INSERT INTO api_keys (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (key_id, salt.hex(), hash_secret(salt, secret), kind, tenant, record.fleet, record.agent, record.trust, record.created_at),
            )
            if kind == "agent":
                assert fleet is not None and agent is not None
                db.execute(
                    "INSERT INTO agents (agent_uid, tenant, fleet, agent, trust) VALUES (?,?,?,?,?) "
                    "ON CONFLICT(agent_uid) DO UPDATE SET trust=excluded.trust",
                    (agent_id(tenant, fleet, agent), tenant, fleet, agent, trust),
                )
        return record, f"mwk_{key_id}.{secret}"

    def authenticate(self, plaintext: str) -> Principal | None:
        """The principal of a valid, unrevoked key; None otherwise. Constant-time hash comparison."""
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
        if r["revoked_at"] is not None:
            return None
        return self._key(r).principal()

    @staticmethod
    def _key(r: sqlite3.Row) -> KeyRecord:
        return KeyRecord(r["key_id"], r["kind"], r["tenant"], r["fleet"], r["agent"], r["trust"], r["created_at"], r["revoked_at"])

    def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        with self._lock:
            if tenant is None:
                rows = self._db.execute("SELECT * FROM api_keys ORDER BY created_at").fetchall()
            else:
                rows = self._db.execute("SELECT * FROM api_keys WHERE tenant = ? ORDER BY created_at", (tenant,)).fetchall()
        return [self._key(r) for r in rows]

    def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; True if it existed and was active."""
        with self._tx() as db:
            cur = db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (now_us(), key_id))
            return cur.rowcount == 1

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
        """Ledger rows for `row_ids` (any status, including pending and deleted)."""
        out: dict[str, Row] = {}
        with self._lock:
            for chunk in _chunks(list(dict.fromkeys(row_ids))):
                q = f"SELECT {_ROW_COLUMNS} FROM rows WHERE backend = ? AND collection_id = ? AND row_id IN ({','.join('?' * len(chunk))})"
                for r in self._db.execute(q, (backend, collection_id, *chunk)):
                    out[r["row_id"]] = _row_from_db(r)
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
                db.execute(f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * 18)})", _row_to_db(row, t))
        return []

    def activate_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> None:
        with self._tx() as db:
            for chunk in _chunks(row_ids):
                db.execute(
                    f"UPDATE rows SET status = 'active' WHERE backend = ? AND collection_id = ? AND status = 'pending' "
                    f"AND row_id IN ({','.join('?' * len(chunk))})", (backend, collection_id, *chunk),
                )

    def release_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> None:
        """Drop write reservations (status pending) after a failed backend write."""
        with self._tx() as db:
            for chunk in _chunks(row_ids):
                db.execute(
                    f"DELETE FROM rows WHERE backend = ? AND collection_id = ? AND status = 'pending' "
                    f"AND row_id IN ({','.join('?' * len(chunk))})", (backend, collection_id, *chunk),
                )

    def update_governance(self, rows: list[Row]) -> None:
        """Persist scope, fleet and readers of existing rows."""
        t = now_us()
        with self._tx() as db:
            for row in rows:
                db.execute(
                    "UPDATE rows SET scope = ?, fleet = ?, readers = ?, updated_at = ? WHERE backend = ? AND collection_id = ? AND row_id = ?",
                    (row.scope, row.fleet, json.dumps(list(row.readers)), t, row.backend, row.collection, row.row_id),
                )

    def tombstone(self, backend: str, collection_id: str, row_ids: list[str], by: str, request_id: str) -> None:
        """Durably mark rows deleted (status + tombstone) before the backend delete is attempted."""
        t = now_us()
        with self._tx() as db:
            for row_id in row_ids:
                db.execute(
                    "INSERT OR IGNORE INTO tombstones (backend, collection_id, row_id, deleted_at, deleted_by, request_id) VALUES (?,?,?,?,?,?)",
                    (backend, collection_id, row_id, t, by, request_id),
                )
                db.execute(
                    "UPDATE rows SET status = 'deleted', updated_at = ? WHERE backend = ? AND collection_id = ? AND row_id = ?",
                    (t, backend, collection_id, row_id),
                )

    def mark_backend_deleted(self, backend: str, collection_id: str, row_ids: list[str]) -> None:
        t = now_us()
        with self._tx() as db:
            for chunk in _chunks(row_ids):
                db.execute(
                    f"UPDATE tombstones SET backend_deleted_at = ? WHERE backend = ? AND collection_id = ? "
                    f"AND row_id IN ({','.join('?' * len(chunk))})", (t, backend, collection_id, *chunk),
                )

    def pending_tombstones(self, backend: str) -> list[tuple[str, str]]:
        """(collection_id, row_id) of tombstones whose backend delete has not been confirmed."""
        with self._lock:
            rows = self._db.execute(
                "SELECT collection_id, row_id FROM tombstones WHERE backend = ? AND backend_deleted_at IS NULL", (backend,)
            ).fetchall()
        return [(r[0], r[1]) for r in rows]
