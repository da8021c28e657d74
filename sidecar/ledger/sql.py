"""The ledger's governance over SQL, written once for both dialects (`sidecar.ledger.dialect`).

`SQLLedger` implements the `Ledger` protocol's keys, collections, rows, tombstones, provenance and lineage,
supersession, update markers and row versions on a DB-API connection whose rows are read by column name
(``sqlite3.Row``, psycopg's ``dict_row``); `sidecar.ledger.sqlite.SQLiteLedger` and
`sidecar.ledger.postgres.PostgresLedger` provide only what differs: connections and transactions (`_tx`,
`_conn`), migrations, cache invalidation (`_notify`, ``cache_version``), the lock that serialises activations
of one fact (`_lock_fact`), the insert of new rows (`_insert_rows`), unprepared tuple reads (`_tuples`) and their
own read paths. Also here: the row codec (`ROW_COLUMNS`, `row_to_db`, `row_from_db`, …) and the visibility
statements (`visible_ids_query`, `visible_query`) both ledgers use.

Deletion closure (`tombstone`) and lineage (`lineage`) walk the lineage graph in one statement each
(``WITH RECURSIVE`` … ``UNION``: a node is reached once, so a cycle ends), then order the nodes breadth first in
Python, as the node-by-node walk did.
"""

from __future__ import annotations

import hmac
import json
import os
from collections import deque
from contextlib import AbstractContextManager
from typing import Any, Iterable, Mapping

from sidecar.core.visibility import Visibility, sql_branches
from sidecar.governance import Principal, Row, agent_entity, agent_id, fact_partition
from sidecar.ledger.base import (LAST_USED_RESOLUTION_US, UPDATE_LEASE_S, CollectionIntent, CollectionRecord, KeyRecord,
                                 RowVersion, StaleFact, UpdateLost, check_key_request, hash_secret, key_row_valid,
                                 new_key_secret, now_us, rotation_expiry)
from sidecar.ledger.dialect import Dialect

# -- the row codec -------------------------------------------------------------------------------------------
ROW_COLUMNS = (
    "backend, collection_id, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, "
    "created_at, updated_at, request_id, subject, predicate, object, extra, source, single_valued, "
    "supersedes_collection, supersedes_id, superseded_by_collection, superseded_by, superseded_at, content_hmac, "
    "fact_partition"
)
N_ROW_COLUMNS = 27
# `ROW_COLUMNS` less ``updated_at`` and ``fact_partition`` (no `Row` field holds them): what the read paths read.
READ_ROW_COLUMNS = ", ".join(c for c in (c.strip() for c in ROW_COLUMNS.split(","))
                             if c not in ("updated_at", "fact_partition"))
EMPTY_LIST, EMPTY_OBJECT = "[]", "{}"  # what `row_to_db` stores for no readers / labels / extra

Reader = tuple[str, str | None, bool]  # (agent uid, fleet, any fleet): the reader side of the visibility filter
# (admitted ids, their ledger rows by id, their owners' Cedar entities by agent uid, key valid): `visible_rows`
VisibleRows = tuple[list[str], dict[str, Row], dict[str, dict[str, Any]], bool]


def names(text: str) -> tuple[str, ...]:
    """A readers or labels column (a JSON list of strings) as a tuple; ``"[]"`` without the JSON parser."""
    return () if text == EMPTY_LIST else tuple(json.loads(text))


def _pair(collection: Any, row_id: Any) -> tuple[str, str] | None:
    return None if row_id is None else (str(collection), str(row_id))


def row_from_db(r: Any) -> Row:
    """The `Row` of a database row read by column name (`ROW_COLUMNS`, any subset holding a `Row`'s fields)."""
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


def row_from_read(t: tuple[Any, ...]) -> Row:
    """`row_from_db` for a plain tuple in `READ_ROW_COLUMNS` order: the same `Row`, built by position, and with no
    JSON parse for empty readers, labels and extra (the common case)."""
    (backend, collection, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, created_at,
     request_id, subject, predicate, obj, extra, source, single_valued, supersedes_collection, supersedes_id,
     superseded_by_collection, superseded_by, superseded_at, content_hmac) = t
    return Row(
        backend, collection, row_id, tenant, fleet, owner, scope, writer, created_at, status,
        names(readers), names(labels), request_id, subject, predicate, obj,
        {} if extra == EMPTY_OBJECT else json.loads(extra), source, (), bool(single_valued),
        None if supersedes_id is None else (str(supersedes_collection), str(supersedes_id)),
        None if superseded_by is None else (str(superseded_by_collection), str(superseded_by)),
        superseded_at, content_hmac,
    )


def row_from_tuple(t: tuple[Any, ...]) -> Row:
    """`row_from_db` for a plain tuple in `ROW_COLUMNS` order (`row_from_read` of the tuple without
    ``updated_at`` and ``fact_partition``)."""
    return row_from_read(t[:12] + t[13:26])


def row_to_db(row: Row, updated_at: int) -> tuple[Any, ...]:
    """The values of `ROW_COLUMNS` for `row`, last written at `updated_at` (UTC µs)."""
    return (
        row.backend, row.collection, row.row_id, row.tenant, row.fleet, row.owner, row.scope,
        json.dumps(list(row.readers)), json.dumps(list(row.labels)), row.status, row.writer,
        row.created_at, updated_at, row.request_id, row.subject, row.predicate, row.object, json.dumps(row.extra),
        row.source, int(row.single_valued), *(row.supersedes or (None, None)), *(row.superseded_by or (None, None)),
        row.superseded_at, row.content_hmac, fact_partition(row) if row.single_valued else None,
    )


def _version_from_db(r: Any) -> RowVersion:
    return RowVersion(int(r["version"]), r["kind"], r["event_id"], r["tenant"], r["fleet"], r["owner"], r["scope"],
                      names(r["readers"]), names(r["labels"]), int(r["written_at"]), r["request_id"])


def _intent_from_db(r: Any) -> CollectionIntent:
    return CollectionIntent(r["backend"], r["nonce"], r["tenant"], r["database"], r["name"], r["created_by"],
                            r["created_at"])


def _collection_from_db(r: Any) -> CollectionRecord:
    return CollectionRecord(r["backend"], r["collection_id"], r["tenant"], r["database"], r["name"], r["created_by"],
                            r["created_at"])


def key_from_db(r: Any) -> KeyRecord:
    """The `KeyRecord` of an ``api_keys`` row read by column name."""
    return KeyRecord(r["key_id"], r["kind"], r["tenant"], r["fleet"], r["agent"], r["trust"], r["created_at"],
                     r["revoked_at"], tuple(json.loads(r["roles"])), r["expires_at"], r["last_used_at"], r["rotated_to"])


def check_key(r: Any, secret: str, now: int) -> Principal | None:
    """The principal of ``api_keys`` row `r` (None: no such key) if `secret` is its secret and it is neither revoked
    nor expired at `now` (UTC µs); None otherwise. Constant-time comparison, and the same work for an unknown key."""
    if r is None:
        hmac.compare_digest(hash_secret(b"\0" * 16, secret), "0" * 64)
        return None
    if not hmac.compare_digest(hash_secret(bytes.fromhex(r["salt"]), secret), r["hash"]):
        return None
    if not key_row_valid(r["revoked_at"], r["expires_at"], now):
        return None
    return key_from_db(r).principal()


def use_is_stale(r: Any, now: int) -> bool:
    """Whether key row `r`'s ``last_used_at`` is to be written at `now` (none yet, or a minute old or more)."""
    last = r["last_used_at"]
    return last is None or now - last >= LAST_USED_RESOLUTION_US


# -- the visibility statements -------------------------------------------------------------------------------
def visible_ids_query(d: Dialect, backend: str, collection_id: str, tenant: str, reader: Reader | None, limit: int,
                      columns: str = "row_id") -> tuple[str, tuple[Any, ...]]:
    """The statement of `Ledger.visible_row_ids` in dialect `d`: ``SELECT columns`` of the collection's rows of
    `tenant`, neither deleted nor pending, that `reader`'s visibility filter admits (every one when None), at most
    ``limit + 1``. One branch per disjunct of the visibility predicate (`sidecar.core.visibility.sql_branches`: the
    scopes exclude each other, so no row is listed twice), each an index range (migration 8)."""
    ph = d.ph
    base = (f"SELECT {columns} FROM rows WHERE backend = {ph} AND collection_id = {ph} AND tenant = {ph} "
            "AND status NOT IN ('deleted', 'pending')")
    common: tuple[Any, ...] = (backend, collection_id, tenant)
    if reader is None:
        return f"{base} LIMIT {ph}", common + (limit + 1,)
    parts = [(f"{base} AND {cond}", common + args)
             for cond, args in sql_branches(Visibility.of_reader(tenant, reader), ph, d.reads_json)]
    sql = " UNION ALL ".join(q for q, _ in parts) + f" LIMIT {ph}"
    return sql, tuple(a for _, args in parts for a in args) + (limit + 1,)


def visible_query(d: Dialect, backend: str, collection_id: str, tenant: str, reader: Reader | None, select: str,
                  owner: str | None = None, union: str = "UNION ALL") -> tuple[str, tuple[Any, ...]]:
    """``SELECT select`` over the rows `visible_ids_query` admits (of `owner` only, when given), one branch per
    disjunct of the visibility predicate joined by `union`, without a LIMIT."""
    ph = d.ph
    base = (f"SELECT {select} FROM rows WHERE backend = {ph} AND collection_id = {ph} AND tenant = {ph} "
            "AND status NOT IN ('deleted', 'pending')")
    common: tuple[Any, ...] = (backend, collection_id, tenant)
    if owner is not None:
        base, common = f"{base} AND owner = {ph}", common + (owner,)
    parts = [(f"{base} AND {cond}", common + args)
             for cond, args in sql_branches(Visibility.of_reader(tenant, reader), ph, d.reads_json)]
    return f" {union} ".join(q for q, _ in parts), tuple(a for _, args in parts for a in args)


def _at_most(rows: list[Any], limit: int) -> list[str] | None:
    ids = [r[0] for r in rows]
    return None if len(ids) > limit else ids


class Busy(Exception):
    """`SQLLedger._take_markers`: rows another update holds (the transaction is rolled back: no marker is taken)."""

    def __init__(self, row_ids: list[str]) -> None:
        super().__init__(row_ids)
        self.row_ids = row_ids


class Rollback(Exception):
    """Abort the current transaction (`SQLLedger._tx` rolls back on any exception) and hand `value` to the caller."""

    def __init__(self, value: Any) -> None:
        super().__init__("rollback")
        self.value = value


def _by_collection(rows: list[Row]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        ids = out.setdefault((row.backend, row.collection), [])
        if row.row_id not in ids:
            ids.append(row.row_id)
    return out


def breadth_first(seeds: Iterable[tuple[str, str]], edges: Mapping[tuple[str, str], list[tuple[str, str]]],
                  max_nodes: int | None = None) -> list[tuple[int, tuple[str, str]]]:
    """(depth, node) of the nodes reached from `seeds` (depth 0, in order) along `edges` (node → next nodes, in
    order), breadth first, each once at the depth it is first reached; at most `max_nodes`. The order of the
    node-by-node walk the ledger made before one statement read the graph."""
    out: list[tuple[int, tuple[str, str]]] = []
    seen: set[tuple[str, str]] = set()
    queue = deque((0, s) for s in seeds)
    while queue and (max_nodes is None or len(out) < max_nodes):
        depth, node = queue.popleft()
        if node in seen:
            continue
        seen.add(node)
        out.append((depth, node))
        queue.extend((depth + 1, n) for n in edges.get(node, ()))
    return out


class SQLLedger:
    """The `Ledger` protocol over a `Dialect`; subclasses provide the connection (see the module docstring)."""

    dialect: Dialect

    # -- what a dialect's ledger provides ------------------------------------------------------------------
    def _tx(self) -> AbstractContextManager[Any]:
        """A write transaction: the connection, committed on exit, rolled back on an exception."""
        raise NotImplementedError

    def _conn(self) -> AbstractContextManager[Any]:
        """A connection for reads (no write transaction)."""
        raise NotImplementedError

    def _notify(self, db: Any, what: str) -> None:
        """Tell other replicas' caches that keys or collections changed, when `db`'s transaction commits."""

    def _lock_fact(self, db: Any, key: list[Any]) -> None:
        """Serialise activations of one single-valued fact `key` for the rest of `db`'s transaction."""

    def _insert_rows(self, db: Any, rows: list[Row], t: int) -> list[str]:
        """Insert `rows` (written at `t`) unless their ids exist; the ids inserted, in order."""
        raise NotImplementedError

    def _tuples(self, db: Any, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """`sql`'s rows as plain tuples, never from a prepared plan (the visibility statements)."""
        raise NotImplementedError

    def _apply_migrations(self, db: Any, migrations: list[str], current: int, applied_at: bool) -> int:
        """Apply `migrations` after version `current` in `db`'s transaction, recording each version (with the time
        when `applied_at`); returns the version now in force."""
        p = self.dialect.ph
        for version in range(current, len(migrations)):
            for statement in migrations[version].split(";"):
                if statement.strip():
                    db.execute(statement)
            if applied_at:
                db.execute(f"INSERT INTO schema_version (version, applied_at) VALUES ({p}, {p})", (version + 1, now_us()))
            else:
                db.execute(f"INSERT INTO schema_version (version) VALUES ({p})", (version + 1,))
        return len(migrations)

    # -- keys and agents -----------------------------------------------------------------------------------
    def create_key(self, kind: str, tenant: str | None, fleet: str | None, agent: str | None, trust: int,
                   roles: Iterable[str] = (), expires_at: int | None = None) -> tuple[KeyRecord, str]:
        """Store a new key (salted hash only) and return its record and the plaintext, shown once.

        Kinds: ``agent`` (tenant, fleet, agent, trust, roles), ``admin`` (tenant), ``operator`` (no tenant:
        the deployment). For agent keys the agent's record (trust and roles, as other rows' owner) is created
        or updated to this key's. `expires_at`: UTC µs from which the key is refused (None: never). Raises
        ValueError on bad input (`check_key_request`).
        """
        with self._tx() as db:
            created = self._create_key(db, kind, tenant, fleet, agent, trust, roles, expires_at)
            self._notify(db, "keys")
        return created

    def _create_key(self, db: Any, kind: str, tenant: str | None, fleet: str | None, agent: str | None, trust: int,
                    roles: Iterable[str], expires_at: int | None) -> tuple[KeyRecord, str]:
        roles = check_key_request(kind, tenant, fleet, agent, trust, roles)
        key_id, secret = new_key_secret()
        salt = os.urandom(16)
        tenant = tenant if kind != "operator" else None
        record = KeyRecord(key_id, kind, tenant, fleet if kind == "agent" else None,
                           agent if kind == "agent" else None, trust if kind == "agent" else 0, now_us(), None, roles,
                           expires_at=expires_at)
        d = self.dialect
        db.execute(
            "INSERT INTO api_keys (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at, roles, expires_at) "
            f"VALUES ({d.marks(11)})",
            (key_id, salt.hex(), hash_secret(salt, secret), kind, tenant, record.fleet, record.agent, record.trust,
             record.created_at, json.dumps(list(roles)), expires_at),
        )
        if kind == "agent":
            assert tenant is not None and fleet is not None and agent is not None
            db.execute(
                f"INSERT INTO agents (agent_uid, tenant, fleet, agent, trust, roles) VALUES ({d.marks(6)}) "
                "ON CONFLICT (agent_uid) DO UPDATE SET trust = excluded.trust, roles = excluded.roles",
                (agent_id(tenant, fleet, agent), tenant, fleet, agent, trust, json.dumps(list(roles))),
            )
        return record, f"mwk_{key_id}.{secret}"

    def list_keys(self, tenant: str | None = None) -> list[KeyRecord]:
        """Every key (of `tenant` when given), oldest first (ties by key id)."""
        with self._conn() as db:
            if tenant is None:
                rows = db.execute("SELECT * FROM api_keys ORDER BY created_at, key_id").fetchall()
            else:
                rows = db.execute(f"SELECT * FROM api_keys WHERE tenant = {self.dialect.ph} ORDER BY created_at, key_id",
                                  (tenant,)).fetchall()
        return [key_from_db(r) for r in rows]

    def key_valid(self, key_id: str) -> bool:
        """Whether key `key_id` exists, is not revoked and has not expired (read now)."""
        p = self.dialect.ph
        with self._conn() as db:
            r = db.execute(f"SELECT 1 AS one FROM api_keys WHERE key_id = {p} AND revoked_at IS NULL AND "
                           f"(expires_at IS NULL OR expires_at > {p})", (key_id, now_us())).fetchone()
        return r is not None

    def revoke_key(self, key_id: str) -> bool:
        """Revoke a key; True if it existed and was active. Committed before return."""
        p = self.dialect.ph
        with self._tx() as db:
            cur = db.execute(f"UPDATE api_keys SET revoked_at = {p} WHERE key_id = {p} AND revoked_at IS NULL",
                             (now_us(), key_id))
            self._notify(db, "keys")
            return bool(cur.rowcount == 1)

    def rotate_key(self, key_id: str, grace_s: float, expires_at: int | None = None) -> tuple[KeyRecord, str, int]:
        """Replace key `key_id` by a new key of the same principal (kind, tenant, fleet, agent, trust, roles), in one
        transaction (the old key's row locked where the dialect locks rows): the new key (expiring at `expires_at`,
        UTC µs; None: after the old key's lifetime when it had one, else never: `rotation_expiry`) is returned with
        its plaintext, and the old one stays valid for `grace_s` more seconds (never longer than it already would),
        recorded as rotated to the new one. Returns (new record, plaintext, the old key's expiry). Raises ValueError
        for a key that is unknown, revoked, expired or already rotated, or a negative grace."""
        if grace_s < 0:
            raise ValueError("the grace period is not negative")
        p = self.dialect.ph
        with self._tx() as db:
            r = db.execute(f"SELECT * FROM api_keys WHERE key_id = {p}{self.dialect.for_update}", (key_id,)).fetchone()
            now = now_us()
            if r is None or not key_row_valid(r["revoked_at"], r["expires_at"], now):
                raise ValueError(f"no active key {key_id}")
            if r["rotated_to"] is not None:
                raise ValueError(f"key {key_id} was rotated already (to {r['rotated_to']}); rotate that one")
            old = key_from_db(r)
            record, plaintext = self._create_key(db, old.kind, old.tenant, old.fleet, old.agent, old.trust, old.roles,
                                                 rotation_expiry(old, now, expires_at))
            until = now + int(grace_s * 1_000_000)
            if old.expires_at is not None:
                until = min(until, old.expires_at)
            db.execute(f"UPDATE api_keys SET expires_at = {p}, rotated_to = {p} WHERE key_id = {p}",
                       (until, record.key_id, key_id))
            self._notify(db, "keys")
        return record, plaintext, until

    def agent_entities(self, agent_uids: set[str]) -> dict[str, dict[str, Any]]:
        """Cedar entities of the known agents among `agent_uids`."""
        out: dict[str, dict[str, Any]] = {}
        if not agent_uids:
            return out
        with self._conn() as db:
            for cond, args in self.dialect.in_ids("agent_uid", sorted(agent_uids)):
                for r in db.execute(f"SELECT * FROM agents WHERE {cond}", args).fetchall():
                    out[r["agent_uid"]] = agent_entity(r["tenant"], r["fleet"], r["agent"], r["trust"],
                                                       tuple(json.loads(r["roles"])))
        return out

    # -- collections ---------------------------------------------------------------------------------------
    def _insert_collection(self, db: Any, record: CollectionRecord) -> None:
        db.execute(
            "INSERT INTO collections (backend, collection_id, tenant, database, name, created_by, created_at) "
            f"VALUES ({self.dialect.marks(7)})",
            (record.backend, record.collection_id, record.tenant, record.database, record.name, record.created_by,
             record.created_at),
        )
        self._notify(db, "collections")

    def register_collection(self, record: CollectionRecord) -> None:
        with self._tx() as db:
            self._insert_collection(db, record)

    def get_collection(self, backend: str, collection_id: str) -> CollectionRecord | None:
        p = self.dialect.ph
        with self._conn() as db:
            r = db.execute(f"SELECT * FROM collections WHERE backend = {p} AND collection_id = {p} AND deleted_at IS NULL",
                           (backend, collection_id)).fetchone()
        return None if r is None else _collection_from_db(r)

    def list_collections(self, backend: str, tenant: str, database: str) -> list[CollectionRecord]:
        """The live collections of (`tenant`, `database`), oldest first (ties by id)."""
        p = self.dialect.ph
        with self._conn() as db:
            rows = db.execute(f"SELECT * FROM collections WHERE backend = {p} AND tenant = {p} AND database = {p} "
                              "AND deleted_at IS NULL ORDER BY created_at, collection_id",
                              (backend, tenant, database)).fetchall()
        return [_collection_from_db(r) for r in rows]

    def record_collection_intent(self, intent: CollectionIntent) -> None:
        """Record a collection create about to be sent to the backend (durable before it returns)."""
        with self._tx() as db:
            db.execute(f"INSERT INTO collection_intents VALUES ({self.dialect.marks(7)})",
                       (intent.backend, intent.nonce, intent.tenant, intent.database, intent.name, intent.created_by,
                        intent.created_at))

    def collection_intent(self, backend: str, nonce: str) -> CollectionIntent | None:
        p = self.dialect.ph
        with self._conn() as db:
            r = db.execute(f"SELECT * FROM collection_intents WHERE backend = {p} AND nonce = {p}",
                           (backend, nonce)).fetchone()
        return None if r is None else _intent_from_db(r)

    def resolve_collection_intent(self, intent: CollectionIntent, record: CollectionRecord | None) -> None:
        """In one transaction: register `record` (the collection `intent` made; None: it made none) and drop every
        intent of the same name (a create that failed leaves nothing to resolve later)."""
        p = self.dialect.ph
        with self._tx() as db:
            if record is not None:
                self._insert_collection(db, record)
            db.execute(f"DELETE FROM collection_intents WHERE backend = {p} AND (nonce = {p} OR ({p} AND tenant = {p} "
                       f"AND database = {p} AND name = {p}))",
                       (intent.backend, intent.nonce, record is not None, intent.tenant, intent.database, intent.name))

    def delete_collection(self, backend: str, collection_id: str, by: str, request_id: str) -> None:
        """Mark the collection deleted and tombstone all its rows (durable), in one transaction."""
        p, t = self.dialect.ph, now_us()
        with self._tx() as db:
            self._notify(db, "collections")
            db.execute(f"UPDATE collections SET deleted_at = {p} WHERE backend = {p} AND collection_id = {p}",
                       (t, backend, collection_id))
            db.execute(
                "INSERT INTO tombstones (backend, collection_id, row_id, deleted_at, deleted_by, request_id, "
                f"backend_deleted_at) SELECT backend, collection_id, row_id, {p}, {p}, {p}, {p} FROM rows "
                f"WHERE backend = {p} AND collection_id = {p} AND status != 'pending' ON CONFLICT DO NOTHING",
                (t, by, request_id, t, backend, collection_id),
            )
            db.execute(f"UPDATE rows SET status = 'deleted', updated_at = {p} WHERE backend = {p} AND collection_id = {p}",
                       (t, backend, collection_id))

    # -- rows ----------------------------------------------------------------------------------------------
    def get_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> dict[str, Row]:
        """Ledger rows for `row_ids` (any status, including pending and deleted), by row id."""
        p = self.dialect.ph
        out: dict[str, Row] = {}
        if not row_ids:
            return out
        with self._conn() as db:
            for cond, args in self.dialect.in_ids("row_id", list(dict.fromkeys(row_ids))):
                for r in db.execute(f"SELECT {ROW_COLUMNS} FROM rows WHERE backend = {p} AND collection_id = {p} "
                                    f"AND {cond}", (backend, collection_id, *args)).fetchall():
                    out[r["row_id"]] = row_from_db(r)
        return out

    def reserve_rows(self, rows: list[Row]) -> list[str]:
        """Insert `rows` with status ``pending`` atomically (their lineage with them); returns the ids that already
        exist, in order, and then inserts none and leaves `rows` as they were."""
        if not rows:
            return []
        t = now_us()
        ids = list(dict.fromkeys(r.row_id for r in rows))
        statuses = [row.status for row in rows]
        try:
            with self._tx() as db:
                for row in rows:
                    row.status = "pending"
                inserted = set(self._insert_rows(db, rows, t))
                taken = [i for i in ids if i not in inserted]
                if taken:
                    raise Rollback(taken)
                edges = [(r.backend, r.collection, r.row_id, pc, pr) for r in rows for pc, pr in r.derived_from]
                if edges:
                    db.cursor().executemany(
                        f"INSERT INTO lineage VALUES ({self.dialect.marks(5)}) ON CONFLICT DO NOTHING", edges)
        except Rollback as rb:
            for row, status in zip(rows, statuses):
                row.status = status
            return list(rb.value)
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
            for row in rows:
                row.status = "active"
            inserted = self._insert_rows(db, rows, t)
            if listing:
                db.cursor().executemany(
                    f"INSERT INTO listing_keys VALUES ({self.dialect.marks(5)}) ON CONFLICT DO NOTHING",
                    [(rows[0].backend, rows[0].collection, *key) for key in listing])
        return inserted

    def listing_keys(self, backend: str, collection_id: str, tenant: str) -> list[tuple[str, str]]:
        """(field, value) entity ids under which adopted rows of `tenant` are listed in the backend, in byte order."""
        d = self.dialect
        p = d.ph
        with self._conn() as db:
            rows = db.execute(f"SELECT field, value FROM listing_keys WHERE backend = {p} AND collection_id = {p} "
                              f"AND tenant = {p} ORDER BY field{d.collate_bytes}, value{d.collate_bytes}",
                              (backend, collection_id, tenant)).fetchall()
        return [(r["field"], r["value"]) for r in rows]

    def activate_rows(self, backend: str, collection_id: str, row_ids: list[str],
                      expect: Mapping[str, tuple[str, str] | None] | None = None) -> list[tuple[str, tuple[str, str]]]:
        """Make reserved rows active. A row with a single-valued triple supersedes the active row for
        (backend, tenant, collection, visibility partition, subject, predicate) in the same transaction;
        returns (new id, superseded (collection, id)) pairs. The partial unique index
        ``rows_one_active_fact`` is the constraint (and `_lock_fact` serialises concurrent activations of one fact
        where the database needs it).

        `expect` (compare-and-set): for a row named in it, the (collection, id) of the fact it may
        supersede, or None for none; when the active fact differs, `StaleFact` is raised and nothing
        is activated (the caller decides again on the new fact)."""
        p = self.dialect.ph
        t = now_us()
        replaced: list[tuple[str, tuple[str, str]]] = []
        with self._tx() as db:
            for row_id in row_ids:
                r = db.execute(f"SELECT tenant, subject, predicate, single_valued, fact_partition FROM rows "
                               f"WHERE backend = {p} AND collection_id = {p} AND row_id = {p} AND status = 'pending'",
                               (backend, collection_id, row_id)).fetchone()
                if r is None:
                    continue
                old = None
                if r["single_valued"] and r["subject"] is not None and r["predicate"] is not None:
                    key = [backend, r["tenant"], collection_id, r["fact_partition"], r["subject"], r["predicate"]]
                    self._lock_fact(db, key)
                    old = db.execute(
                        f"SELECT collection_id, row_id FROM rows WHERE backend = {p} AND tenant = {p} AND collection_id = {p} "
                        f"AND fact_partition = {p} AND subject = {p} AND predicate = {p} AND status = 'active' "
                        f"AND single_valued = 1{self.dialect.for_update}", tuple(key)).fetchone()
                if expect is not None and row_id in expect:
                    current = (old["collection_id"], old["row_id"]) if old is not None else None
                    if current != expect[row_id]:
                        raise StaleFact(row_id, current)
                if old is not None:
                    db.execute(f"UPDATE rows SET status = 'superseded', superseded_by_collection = {p}, superseded_by = {p}, "
                               f"superseded_at = {p}, updated_at = {p} WHERE backend = {p} AND collection_id = {p} AND row_id = {p}",
                               (collection_id, row_id, t, t, backend, old["collection_id"], old["row_id"]))
                    replaced.append((row_id, (old["collection_id"], old["row_id"])))
                db.execute(f"UPDATE rows SET status = 'active', supersedes_collection = {p}, supersedes_id = {p}, "
                           f"updated_at = {p} WHERE backend = {p} AND collection_id = {p} AND row_id = {p}",
                           (old["collection_id"] if old else None, old["row_id"] if old else None, t, backend,
                            collection_id, row_id))
        return replaced

    def release_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> None:
        """Drop write reservations (status pending) after a failed backend write."""
        p = self.dialect.ph
        with self._tx() as db:
            for cond, args in self.dialect.in_ids("row_id", list(row_ids)):
                db.execute(f"DELETE FROM lineage WHERE backend = {p} AND collection_id = {p} AND {cond} AND row_id IN "
                           f"(SELECT row_id FROM rows WHERE backend = {p} AND collection_id = {p} AND status = 'pending')",
                           (backend, collection_id, *args, backend, collection_id))
                db.execute(f"DELETE FROM rows WHERE backend = {p} AND collection_id = {p} AND status = 'pending' AND {cond}",
                           (backend, collection_id, *args))

    def update_governance(self, rows: list[Row], *, holder: str | None = None,
                          history: Mapping[str, str | None] | None = None) -> None:
        """Persist scope, fleet, readers, labels and content HMAC of existing rows (`Ledger.update_governance`:
        `holder` must hold their update markers, which are then released — else `UpdateLost` and nothing is
        written; `history` records their versions)."""
        if not rows:
            return
        p, t = self.dialect.ph, now_us()
        with self._tx() as db:
            self._check_holder(db, rows, holder)
            self._record_versions(db, rows, t, holder, history)
            db.cursor().executemany(
                f"UPDATE rows SET scope = {p}, fleet = {p}, readers = {p}, labels = {p}, content_hmac = {p}, "
                f"fact_partition = {p}, updated_at = {p} WHERE backend = {p} AND collection_id = {p} AND row_id = {p}",
                [(row.scope, row.fleet, json.dumps(list(row.readers)), json.dumps(list(row.labels)), row.content_hmac,
                  fact_partition(row) if row.single_valued else None, t, row.backend, row.collection, row.row_id)
                 for row in rows])
            if holder is not None:
                for backend, collection_id in _by_collection(rows):
                    db.execute(f"DELETE FROM row_updates WHERE backend = {p} AND collection_id = {p} AND request_id = {p}",
                               (backend, collection_id, holder))

    def _check_holder(self, db: Any, rows: list[Row], holder: str | None) -> None:
        """With `holder`, every row's update marker must be the holder's, else `UpdateLost` (the caller's transaction
        is rolled back)."""
        if holder is None:
            return
        p = self.dialect.ph
        lost = []
        for (backend, collection_id), ids in _by_collection(rows).items():
            held = {r["row_id"] for cond, args in self.dialect.in_ids("row_id", ids) for r in db.execute(
                f"SELECT row_id FROM row_updates WHERE backend = {p} AND collection_id = {p} AND request_id = {p} AND {cond}",
                (backend, collection_id, holder, *args)).fetchall()}
            lost += [i for i in ids if i not in held]
        if lost:
            raise UpdateLost(lost)

    def _record_versions(self, db: Any, rows: list[Row], t: int, holder: str | None,
                         history: Mapping[str, str | None] | None) -> None:
        """With `history`, each named row's new version — its governance before this update first, as version 0
        ``created``, when the row has no version yet."""
        if not history:
            return
        p = self.dialect.ph
        where = f"WHERE backend = {p} AND collection_id = {p} AND row_id = {p}"
        for row in rows:
            if row.row_id not in history:
                continue
            key = (row.backend, row.collection, row.row_id)
            last = db.execute(f"SELECT MAX(version) AS v FROM row_versions {where}", key).fetchone()["v"]
            if last is None:
                db.execute("INSERT INTO row_versions (backend, collection_id, row_id, version, kind, event_id, tenant, "
                           "fleet, owner, scope, readers, labels, written_at, request_id) SELECT backend, collection_id, "
                           "row_id, 0, 'created', NULL, tenant, fleet, owner, scope, readers, labels, updated_at, "
                           f"request_id FROM rows {where}", key)
                last = 0
            db.execute("INSERT INTO row_versions (backend, collection_id, row_id, version, kind, event_id, tenant, fleet, "
                       "owner, scope, readers, labels, written_at, request_id) VALUES "
                       f"({p}, {p}, {p}, {p}, 'update', {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
                       (*key, int(last) + 1, history[row.row_id], row.tenant, row.fleet, row.owner, row.scope,
                        json.dumps(list(row.readers)), json.dumps(list(row.labels)), t, holder or ""))

    # -- per-row update markers and row versions ----------------------------------------------------------
    def begin_update(self, backend: str, collection_id: str, row_ids: list[str], request_id: str,
                     lease_s: float = UPDATE_LEASE_S) -> list[str]:
        """`Ledger.begin_update`: all markers or none, in one transaction: one upsert per chunk of ids that takes a
        row's marker when there is none, when it is `request_id`'s, or when it is older than `lease_s` (an update
        that died). On PostgreSQL a concurrent taker of the same row waits on the row's unique index for this
        transaction, then sees its marker; SQLite has one writer at a time."""
        try:
            with self._tx() as db:
                self._take_markers(db, backend, collection_id, row_ids, request_id, now_us(), int(lease_s * 1_000_000))
        except Busy as busy:
            return busy.row_ids
        return []

    def _take_markers(self, db: Any, backend: str, collection_id: str, row_ids: list[str], request_id: str, now: int,
                      lease_us: int) -> None:
        p = self.dialect.ph
        ids = sorted(set(row_ids))
        taken: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            sql = ("INSERT INTO row_updates (backend, collection_id, row_id, request_id, started_at) VALUES "
                   + ",".join([f"({self.dialect.marks(5)})"] * len(chunk))
                   + " ON CONFLICT (backend, collection_id, row_id) DO UPDATE SET request_id = excluded.request_id, "
                   f"started_at = excluded.started_at WHERE row_updates.started_at <= {p} "
                   "OR row_updates.request_id = excluded.request_id RETURNING row_id")
            args = [a for i in chunk for a in (backend, collection_id, i, request_id, now)] + [now - lease_us]
            taken.update(r["row_id"] for r in db.execute(sql, tuple(args)).fetchall())
        busy = [i for i in ids if i not in taken]
        if busy:
            raise Busy(busy)

    def end_update(self, backend: str, collection_id: str, row_ids: list[str], request_id: str) -> None:
        """`Ledger.end_update`."""
        p = self.dialect.ph
        with self._tx() as db:
            for cond, args in self.dialect.in_ids("row_id", sorted(set(row_ids))):
                db.execute(f"DELETE FROM row_updates WHERE backend = {p} AND collection_id = {p} AND request_id = {p} "
                           f"AND {cond}", (backend, collection_id, request_id, *args))

    def row_versions(self, backend: str, collection_id: str, row_id: str) -> list[RowVersion]:
        """`Ledger.row_versions`."""
        p = self.dialect.ph
        with self._conn() as db:
            rows = db.execute("SELECT version, kind, event_id, tenant, fleet, owner, scope, readers, labels, written_at, "
                              f"request_id FROM row_versions WHERE backend = {p} AND collection_id = {p} AND row_id = {p} "
                              "ORDER BY version", (backend, collection_id, row_id)).fetchall()
        return [_version_from_db(r) for r in rows]

    # -- tombstones and the deletion closure --------------------------------------------------------------
    def tombstone(self, backend: str, collection_id: str, row_ids: list[str], by: str, request_id: str,
                  closure: str = "cascade", also: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
        """Durably mark rows deleted (status + tombstone) before the backend delete is attempted.

        Deletion closure in the same transaction: with ``closure="cascade"`` every row derived from a
        deleted row, transitively (`descendants`: one statement); `also` adds (collection, id) rows the caller
        chose (content copies it may delete). Content HMACs of every tombstoned row are remembered per tenant
        (`forgotten`). Returns every (collection, row id) tombstoned, breadth first from the requested ones (then
        `also`), which come first; the caller deletes them from the backend (the reconciler retries what it could
        not). A constant number of statements whatever the size of the closure.
        """
        seeds = list(dict.fromkeys([(collection_id, r) for r in row_ids] + list(also or [])))
        if not seeds:
            return []
        d, t = self.dialect, now_us()
        p = d.ph
        with self._tx() as db:
            if closure == "cascade":
                order = [node for _, node in breadth_first(seeds, self._descendants(db, backend, seeds))]
            else:
                order = seeds
            pairs, pair_args = d.pairs(order)
            row = f"r.backend = {p} AND r.collection_id = pairs.collection_id AND r.row_id = pairs.row_id"
            db.execute(f"INSERT INTO forgotten_content (tenant, content_hmac, deleted_at) SELECT DISTINCT r.tenant, "
                       f"r.content_hmac, {p} FROM {pairs} {d.lookup('rows', 'r', row, outer=False)} "
                       "WHERE r.content_hmac IS NOT NULL AND r.content_hmac != '' "
                       "ON CONFLICT (tenant, content_hmac) DO NOTHING", (t, *pair_args, backend))
            db.execute(f"INSERT INTO tombstones (backend, collection_id, row_id, deleted_at, deleted_by, request_id) "
                       f"SELECT {p}, pairs.collection_id, pairs.row_id, {p}, {p}, {p} FROM {pairs} WHERE true "
                       "ON CONFLICT DO NOTHING", (backend, t, by, request_id, *pair_args))
            db.execute(f"UPDATE rows SET status = 'deleted', updated_at = {p} WHERE backend = {p} "
                       f"AND (collection_id, row_id) IN (SELECT collection_id, row_id FROM {pairs})",
                       (t, backend, *pair_args))
        return order

    def _descendants(self, db: Any, backend: str, seeds: list[tuple[str, str]]
                     ) -> dict[tuple[str, str], list[tuple[str, str]]]:
        """The rows derived from `seeds`, transitively, in one statement: each reached node → the rows derived
        from it directly (ordered by collection and id)."""
        d = self.dialect
        p = d.ph
        pairs, pair_args = d.pairs(seeds)
        derived = f"l.backend = {p} AND l.parent_collection_id = reach.collection_id AND l.parent_row_id = reach.row_id"
        rows = db.execute(
            "WITH RECURSIVE reach (collection_id, row_id) AS ("
            f"SELECT collection_id, row_id FROM {pairs} "
            "UNION SELECT l.collection_id, l.row_id FROM reach "
            f"{d.lookup('lineage', 'l', derived, 'lineage_parent', outer=False)}) "
            "SELECT reach.collection_id AS n_collection, reach.row_id AS n_row, l.collection_id AS c_collection, "
            f"l.row_id AS c_row FROM reach {d.lookup('lineage', 'l', derived, 'lineage_parent')} "
            "ORDER BY n_collection, n_row, c_collection, c_row", (*pair_args, backend, backend)).fetchall()
        out: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for r in rows:
            children = out.setdefault((r["n_collection"], r["n_row"]), [])
            if r["c_row"] is not None:
                children.append((r["c_collection"], r["c_row"]))
        return out

    def lineage(self, backend: str, collection_id: str, row_id: str,
                max_nodes: int = 1000) -> list[tuple[int, Row | None, tuple[str, str], list[tuple[str, str]]]]:
        """Ancestors of a row, breadth first from it (depth 0): (depth, ledger row or None, (collection, id), its
        parents ordered by collection and id), at most `max_nodes`. One statement reads the whole ancestry
        (``WITH RECURSIVE``; a cycle ends)."""
        d = self.dialect
        p = d.ph
        columns = ", ".join(f"r.{c.strip()}" for c in ROW_COLUMNS.split(","))
        edges = f"l.backend = {p} AND l.collection_id = up.collection_id AND l.row_id = up.row_id"
        row = f"r.backend = {p} AND r.collection_id = up.collection_id AND r.row_id = up.row_id"
        with self._conn() as db:
            found = db.execute(
                "WITH RECURSIVE up (collection_id, row_id) AS ("
                f"SELECT CAST({p} AS TEXT), CAST({p} AS TEXT) "
                f"UNION SELECT l.parent_collection_id, l.parent_row_id FROM up "
                f"{d.lookup('lineage', 'l', edges, outer=False)}) "
                "SELECT up.collection_id AS n_collection, up.row_id AS n_row, l.parent_collection_id AS p_collection, "
                f"l.parent_row_id AS p_row, {columns} FROM up "
                f"{d.lookup('lineage', 'l', edges)} "
                f"{d.lookup('rows', 'r', row)} "
                "ORDER BY n_collection, n_row, p_collection, p_row",
                (collection_id, row_id, backend, backend, backend)).fetchall()
        parents: dict[tuple[str, str], list[tuple[str, str]]] = {}
        rows: dict[tuple[str, str], Row | None] = {}
        for r in found:
            key = (r["n_collection"], r["n_row"])
            if key not in rows:
                rows[key] = None if r["backend"] is None else row_from_db(r)
                parents[key] = []
            if r["p_row"] is not None:
                parents[key].append((r["p_collection"], r["p_row"]))
        return [(depth, rows.get(key), key, parents.get(key, []))
                for depth, key in breadth_first([(collection_id, row_id)], parents, max_nodes)]

    def reset(self, backend: str, collection_id: str | None, by: str, request_id: str) -> int:
        """An operator's reset of the deployment, recorded once the backend's own reset succeeded (a reset the
        backend refuses changes nothing here): every row of `backend` (or of one ledger collection, e.g. a Mem0
        deployment) is tombstoned, pending rows included (they never activate), and with `collection_id` None
        every collection is marked deleted. Content is not remembered as forgotten (a reset is not a tenant
        deleting memory). Returns the number of rows tombstoned; `reset_done` confirms their backend deletes."""
        p, t = self.dialect.ph, now_us()
        scope, args = self._scope(backend, collection_id)
        with self._tx() as db:
            self._notify(db, "collections")
            if collection_id is None:
                db.execute(f"UPDATE collections SET deleted_at = {p} WHERE {scope} AND deleted_at IS NULL", (t, *args))
            db.execute("INSERT INTO tombstones (backend, collection_id, row_id, deleted_at, deleted_by, request_id) "
                       f"SELECT backend, collection_id, row_id, {p}, {p}, {p} FROM rows WHERE {scope} "
                       "AND status != 'deleted' ON CONFLICT DO NOTHING", (t, by, request_id, *args))
            cur = db.execute(f"UPDATE rows SET status = 'deleted', updated_at = {p} WHERE {scope} AND status != 'deleted'",
                             (t, *args))
            return int(cur.rowcount)

    def _scope(self, backend: str, collection_id: str | None) -> tuple[str, tuple[Any, ...]]:
        p = self.dialect.ph
        if collection_id is None:
            return f"backend = {p}", (backend,)
        return f"backend = {p} AND collection_id = {p}", (backend, collection_id)

    def reset_done(self, backend: str, collection_id: str | None) -> None:
        """The backend's reset succeeded: every tombstone of `backend` (or the collection) is confirmed."""
        scope, args = self._scope(backend, collection_id)
        with self._tx() as db:
            db.execute(f"UPDATE tombstones SET backend_deleted_at = {self.dialect.ph} WHERE {scope} "
                       "AND backend_deleted_at IS NULL", (now_us(), *args))

    # -- provenance and supersession -------------------------------------------------------------------------
    def content_copies(self, backend: str, tenant: str, digests: list[str], deleted: bool = False) -> list[Row]:
        """Rows of `tenant` whose content HMAC is one of `digests`: servable ones (candidates for
        closure), or with `deleted` the tombstoned ones (to judge a re-write of forgotten content)."""
        p = self.dialect.ph
        statuses = "('deleted')" if deleted else "('active', 'superseded')"
        out: list[Row] = []
        with self._conn() as db:
            for cond, args in self.dialect.in_ids("content_hmac", list(dict.fromkeys(digests))):
                out += [row_from_db(r) for r in db.execute(
                    f"SELECT {ROW_COLUMNS} FROM rows WHERE backend = {p} AND tenant = {p} AND status IN {statuses} "
                    f"AND {cond}", (backend, tenant, *args)).fetchall()]
        return out

    def active_fact(self, backend: str, tenant: str, subject: str, predicate: str, *,
                    collection: str | None = None, partition: str | None = None) -> Row | None:
        """The active single-valued row for (tenant, subject, predicate) in one ledger `collection` and
        visibility `partition` (`governance.fact_partition`) when given; None if none. Over several
        partitions, the newest."""
        p = self.dialect.ph
        sql = (f"SELECT {ROW_COLUMNS} FROM rows WHERE backend = {p} AND tenant = {p} AND subject = {p} "
               f"AND predicate = {p} AND status = 'active' AND single_valued = 1")
        args: list[Any] = [backend, tenant, subject, predicate]
        if collection is not None:
            sql, args = f"{sql} AND collection_id = {p}", [*args, collection]
        if partition is not None:
            sql, args = f"{sql} AND fact_partition = {p}", [*args, partition]
        with self._conn() as db:
            r = db.execute(f"{sql} ORDER BY created_at DESC, row_id LIMIT 1", tuple(args)).fetchone()
        return None if r is None else row_from_db(r)

    def forgotten(self, tenant: str, hmacs: list[str]) -> set[str]:
        """The subset of content HMACs that belong to deleted rows of `tenant`."""
        out: set[str] = set()
        with self._conn() as db:
            for cond, args in self.dialect.in_ids("content_hmac", list(dict.fromkeys(hmacs))):
                out.update(r["content_hmac"] for r in db.execute(
                    f"SELECT content_hmac FROM forgotten_content WHERE tenant = {self.dialect.ph} AND {cond}",
                    (tenant, *args)).fetchall())
        return out

    def content_key(self) -> bytes:
        """The ledger's content-HMAC key (32 random bytes, created once, shared by every replica)."""
        with self._tx() as db:
            db.execute("INSERT INTO ledger_secrets (name, value) VALUES ('content_hmac_key', "
                       f"{self.dialect.ph}) ON CONFLICT DO NOTHING", (os.urandom(32).hex(),))
            r = db.execute("SELECT value FROM ledger_secrets WHERE name = 'content_hmac_key'").fetchone()
        return bytes.fromhex(r["value"])

    # -- the reconciler ------------------------------------------------------------------------------------
    def backend_deleted_tombstones(self, backend: str, after: tuple[str, str] = ("", ""),
                                   limit: int = 500) -> list[tuple[str, str]]:
        """Tombstones whose backend delete was confirmed, in key order after `after` (for reappearance checks)."""
        p = self.dialect.ph
        with self._conn() as db:
            rows = db.execute(
                f"SELECT collection_id, row_id FROM tombstones WHERE backend = {p} AND backend_deleted_at IS NOT NULL "
                f"AND (collection_id, row_id) > ({p}, {p}) ORDER BY collection_id, row_id LIMIT {p}",
                (backend, *after, limit)).fetchall()
        return [(r["collection_id"], r["row_id"]) for r in rows]

    def mark_backend_deleted(self, backend: str, collection_id: str, row_ids: list[str]) -> None:
        """The backend confirmed the deletes of `row_ids`."""
        p, t = self.dialect.ph, now_us()
        with self._tx() as db:
            for cond, args in self.dialect.in_ids("row_id", list(row_ids)):
                db.execute(f"UPDATE tombstones SET backend_deleted_at = {p} WHERE backend = {p} AND collection_id = {p} "
                           f"AND {cond}", (t, backend, collection_id, *args))

    def pending_tombstones(self, backend: str) -> list[tuple[str, str]]:
        """(collection_id, row_id) of tombstones whose backend delete has not been confirmed, oldest first."""
        with self._conn() as db:
            rows = db.execute(f"SELECT collection_id, row_id FROM tombstones WHERE backend = {self.dialect.ph} "
                              "AND backend_deleted_at IS NULL ORDER BY deleted_at, collection_id, row_id",
                              (backend,)).fetchall()
        return [(r["collection_id"], r["row_id"]) for r in rows]

    def last_backend_delete(self, backend: str) -> int | None:
        """When (UTC µs) the backend last confirmed a delete of `backend` (newest ``backend_deleted_at`` of its
        tombstones, a reset's included); None when none is confirmed. Read by the scheduled purge
        (`sidecar.erase.schedule`) to purge only after deletes."""
        with self._conn() as db:
            r = db.execute(f"SELECT MAX(backend_deleted_at) AS t FROM tombstones WHERE backend = {self.dialect.ph}",
                           (backend,)).fetchone()
        return None if r is None or r["t"] is None else int(r["t"])

    # -- statistics for the query planner and the visibility filter ------------------------------------------
    def visibility_counts(self, backend: str, collection_id: str) -> list[tuple[str, str, str, tuple[str, ...], str, int]]:
        """Rows of a collection per (scope, fleet, owner, readers, status): the query planner's statistics."""
        p = self.dialect.ph
        with self._conn() as db:
            rows = db.execute(f"SELECT scope, fleet, owner, readers, status, COUNT(*) AS n FROM rows WHERE backend = {p} "
                              f"AND collection_id = {p} GROUP BY scope, fleet, owner, readers, status",
                              (backend, collection_id)).fetchall()
        return [(r["scope"], r["fleet"], r["owner"], tuple(json.loads(r["readers"])), r["status"], int(r["n"]))
                for r in rows]

    def visible_row_ids(self, backend: str, collection_id: str, tenant: str, reader: Reader | None,
                        limit: int) -> list[str] | None:
        """`Ledger.visible_row_ids`: one statement over the collection's rows (`visible_ids_query`)."""
        sql, args = visible_ids_query(self.dialect, backend, collection_id, tenant, reader, limit)
        with self._conn() as db:
            return _at_most(self._tuples(db, sql, args), limit)

    def visible_owners(self, backend: str, collection_id: str, tenant: str, reader: Reader | None) -> list[str]:
        """`Ledger.visible_owners`: one statement (`visible_query`)."""
        sql, args = visible_query(self.dialect, backend, collection_id, tenant, reader, "DISTINCT owner", union="UNION")
        with self._conn() as db:
            return sorted(r[0] for r in self._tuples(db, sql, args))

    def visible_row_ids_of(self, backend: str, collection_id: str, tenant: str, reader: Reader | None, owner: str,
                           limit: int) -> list[str] | None:
        """`Ledger.visible_row_ids_of`: one statement (`visible_query`)."""
        sql, args = visible_query(self.dialect, backend, collection_id, tenant, reader, "row_id", owner=owner)
        with self._conn() as db:
            return _at_most(self._tuples(db, f"{sql} LIMIT {self.dialect.ph}", (*args, limit + 1)), limit)
