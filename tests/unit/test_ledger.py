"""The ledger suite, run on SQLite and on PostgreSQL (a fresh database per session, a fresh schema per
test): keys are stored hashed, revocation is immediate, reservations and tombstones are atomic."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from sidecar.governance import Row
from sidecar.ledger import CollectionIntent, CollectionRecord, Ledger, SQLiteLedger, StaleFact, open_ledger
from sidecar.ledger.postgres import MIGRATIONS as PG_MIGRATIONS
from sidecar.ledger.postgres import PostgresLedger, SchemaOutOfDate
from sidecar.ledger.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

Opener = Callable[[], Any]


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """A function opening (again) the same ledger: one SQLite file, or one PostgreSQL schema."""
    opened: list[Any] = []
    if request.param == "sqlite":
        def open_() -> Any:
            opened.append(SQLiteLedger(tmp_path / "l.db"))
            return opened[-1]
    else:
        url, schema = request.getfixturevalue("pg_url"), fresh_schema()

        def open_() -> Any:
            opened.append(open_ledger(url, schema=schema, max_size=4))
            return opened[-1]
    yield open_
    for ledger in opened:
        try:
            ledger.close()
        except Exception:
            pass


@pytest.fixture
def ledger(opener: Opener) -> Ledger:
    return opener()


def _raw_keys(ledger: Any) -> str:
    """Everything stored in api_keys, as text."""
    if isinstance(ledger, SQLiteLedger):
        return repr(ledger._db.execute("SELECT * FROM api_keys").fetchall())
    with ledger._conn() as db:
        return repr(db.execute("SELECT * FROM api_keys").fetchall())


def test_keys_hashed_authenticated_revoked(ledger: Ledger) -> None:
    rec, key = ledger.create_key("agent", "t", "red", "a", 2)
    p = ledger.authenticate(key)
    assert p is not None and (p.tenant, p.fleet, p.agent, p.trust, p.kind) == ("t", "red", "a", 2, "agent")
    assert key.split(".", 1)[1] not in _raw_keys(ledger)
    assert ledger.authenticate(key + "x") is None
    assert ledger.authenticate(key.replace(rec.key_id, "0" * 16)) is None
    assert ledger.authenticate("garbage") is None
    assert ledger.revoke_key(rec.key_id) and not ledger.revoke_key(rec.key_id)
    assert ledger.authenticate(key) is None
    _, admin = ledger.create_key("admin", "t", None, None, 0)
    assert ledger.authenticate(admin).kind == "admin"  # type: ignore[union-attr]
    for bad in (("agent", "t", None, "a", 1), ("agent", "t/x", "f", "a", 1), ("agent", "t", "f", "a", 4), ("root", "t", None, None, 0)):
        with pytest.raises(ValueError):
            ledger.create_key(*bad)


def test_agent_trust_recorded_for_owner_entities(ledger: Ledger) -> None:
    ledger.create_key("agent", "t", "red", "a", 1)
    ents = ledger.agent_entities({"t/red/a", "t/red/unknown"})
    assert set(ents) == {"t/red/a"} and ents["t/red/a"]["attrs"]["trust"] == 1


def test_agent_roles_come_from_the_key(ledger: Ledger) -> None:
    """`memwarden keys create --role`: stored with the key (sorted, deduplicated), on the principal it
    authenticates and in its Cedar entity, and on the agent's record (its entity as another row's owner)."""
    rec, key = ledger.create_key("agent", "t", "red", "a", 1, roles=["pii-reader", "oncall", "pii-reader"])
    assert rec.roles == ("oncall", "pii-reader")
    p = ledger.authenticate(key)
    assert p is not None and p.roles == ("oncall", "pii-reader")
    assert p.entities()[0]["attrs"]["roles"] == ["oncall", "pii-reader"]
    assert ledger.agent_entities({"t/red/a"})["t/red/a"]["attrs"]["roles"] == ["oncall", "pii-reader"]
    assert [k.roles for k in ledger.list_keys("t")] == [("oncall", "pii-reader")]
    # A second key of the same agent carries its own roles; the agent's record follows the newest key.
    _, plain = ledger.create_key("agent", "t", "red", "a", 1)
    assert ledger.authenticate(plain).roles == ()  # type: ignore[union-attr]
    assert ledger.authenticate(key).roles == ("oncall", "pii-reader")  # type: ignore[union-attr]
    assert ledger.agent_entities({"t/red/a"})["t/red/a"]["attrs"]["roles"] == []
    for kind, tenant, fleet, agent, roles in (("agent", "t", "red", "b", ["has space"]), ("agent", "t", "red", "b", [""]),
                                              ("agent", "t", "red", "b", ["x" * 65]), ("agent", "t", "red", "b", ["-lead"]),
                                              ("agent", "t", "red", "b", [f"r{i}" for i in range(33)]),
                                              ("admin", "t", None, None, ["auditor"]), ("operator", None, None, None, ["ops"])):
        with pytest.raises(ValueError):
            ledger.create_key(kind, tenant, fleet, agent, 1 if kind == "agent" else 0, roles=roles)
    assert [k.agent for k in ledger.list_keys("t")] == ["a", "a"]  # nothing stored by a refused request


def test_labels_are_stored_and_updated(ledger: Ledger) -> None:
    row = _row("l")
    row.labels = ("finance", "pii")
    ledger.reserve_rows([row])
    ledger.activate_rows("chroma", "c1", ["l"])
    stored = ledger.get_rows("chroma", "c1", ["l"])["l"]
    assert stored.labels == ("finance", "pii") and stored.entity()["attrs"]["labels"] == ["finance", "pii"]
    stored.labels = ()
    ledger.update_governance([stored])
    assert ledger.get_rows("chroma", "c1", ["l"])["l"].labels == ()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_migration_5_gives_existing_keys_no_roles(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Keys written by the version-4 code authenticate after the upgrade, with no roles."""
    from sidecar.ledger.base import hash_secret

    if kind == "sqlite":
        db: Any = sqlite3.connect(tmp_path / "v4.db", isolation_level=None)
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        migrations, ph = SQLITE_MIGRATIONS, "?"
    else:
        url, schema = request.getfixturevalue("pg_url"), fresh_schema()
        db = psycopg.connect(url, autocommit=True)
        db.execute(f'CREATE SCHEMA "{schema}"')
        db.execute(f"SET search_path = {schema}")
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at BIGINT NOT NULL)")
        migrations, ph = PG_MIGRATIONS, "%s"
    for version in range(4):
        for statement in migrations[version].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"INSERT INTO schema_version VALUES ({ph}{', 0' if kind == 'postgres' else ''})", (version + 1,))
    db.execute(f"INSERT INTO api_keys (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at) "
               f"VALUES ('k4', '00', {ph}, 'agent', 't', 'red', 'a', 1, 1)", (hash_secret(b"\0", "s"),))
    db.execute("INSERT INTO agents (agent_uid, tenant, fleet, agent, trust) VALUES ('t/red/a', 't', 'red', 'a', 1)")
    db.close()
    ledger = SQLiteLedger(tmp_path / "v4.db") if kind == "sqlite" else open_ledger(url, schema=schema, max_size=2)
    try:
        assert [(k.key_id, k.roles) for k in ledger.list_keys()] == [("k4", ())]
        p = ledger.authenticate("mwk_k4.s")
        assert p is not None and p.roles == () and p.trust == 1
        assert ledger.agent_entities({"t/red/a"})["t/red/a"]["attrs"]["roles"] == []
    finally:
        ledger.close()


def _row(i: str) -> Row:
    return Row("chroma", "c1", i, "t", "red", "t/red/a", "fleet", "t/red/a", 1)


def test_reserve_activate_release_tombstone(ledger: Ledger) -> None:
    assert ledger.reserve_rows([_row("a"), _row("b")]) == []
    assert {r.status for r in ledger.get_rows("chroma", "c1", ["a", "b"]).values()} == {"pending"}
    assert ledger.reserve_rows([_row("c"), _row("a")]) == ["a"]
    assert "c" not in ledger.get_rows("chroma", "c1", ["c"])  # all or nothing
    ledger.activate_rows("chroma", "c1", ["a"])
    ledger.release_rows("chroma", "c1", ["a", "b"])  # only pending rows are released
    rows = ledger.get_rows("chroma", "c1", ["a", "b"])
    assert set(rows) == {"a"} and rows["a"].status == "active"
    ledger.tombstone("chroma", "c1", ["a"], "t/red/a", "req")
    assert ledger.get_rows("chroma", "c1", ["a"])["a"].status == "deleted"
    assert ledger.pending_tombstones("chroma") == [("c1", "a")]
    ledger.mark_backend_deleted("chroma", "c1", ["a"])
    assert ledger.pending_tombstones("chroma") == []
    assert ledger.reserve_rows([_row("a")]) == ["a"]  # a tombstoned id is never reusable


def test_operator_keys_have_no_tenant(ledger: Ledger) -> None:
    rec, key = ledger.create_key("operator", None, None, None, 0)
    assert rec.kind == "operator" and rec.tenant is None
    p = ledger.authenticate(key)
    assert p is not None and p.kind == "operator" and p.uid == ("Operator", rec.key_id) and p.tenant == ""
    assert p.entities() == [{"uid": {"type": "Operator", "id": rec.key_id}, "attrs": {}, "parents": []}]
    ledger.create_key("admin", "t", None, None, 0)
    assert [k.kind for k in ledger.list_keys("t")] == ["admin"]  # a tenant's listing never shows operators
    assert "operator" in [k.kind for k in ledger.list_keys()]
    for bad in (("operator", "t", None, None, 0), ("admin", None, None, None, 0), ("agent", "", "f", "a", 1)):
        with pytest.raises(ValueError):
            ledger.create_key(*bad)
    # the database itself refuses an operator row with a tenant, and a tenant key without one
    for kind, tenant in (("operator", "t"), ("admin", None), ("root", "t")):
        with pytest.raises((sqlite3.IntegrityError, psycopg.errors.CheckViolation)):
            if isinstance(ledger, SQLiteLedger):
                with ledger._tx() as db:
                    db.execute("INSERT INTO api_keys (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at, "
                               "revoked_at) VALUES ('x', '00', 'h', ?, ?, NULL, NULL, 0, 1, NULL)", (kind, tenant))
            else:
                with ledger._tx() as db:  # type: ignore[attr-defined]
                    db.execute("INSERT INTO api_keys (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at, "
                               "revoked_at) VALUES ('x', '00', 'h', %s, %s, NULL, NULL, 0, 1, NULL)", (kind, tenant))
    assert ledger.revoke_key(rec.key_id) and ledger.authenticate(key) is None


def test_sqlite_migration_3_keeps_existing_keys(tmp_path: Path) -> None:
    """A version-2 ledger with keys migrates to operator-capable api_keys without losing a key."""
    db = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for version in range(2):
        for statement in SQLITE_MIGRATIONS[version].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO schema_version VALUES (?)", (version + 1,))
    db.close()
    db = sqlite3.connect(tmp_path / "old.db", isolation_level=None)  # a key as the version-2 code wrote it
    db.execute("INSERT INTO api_keys VALUES ('k1', '00', 'h', 'admin', 't', NULL, NULL, 0, 1, NULL)")
    db.close()
    ledger = SQLiteLedger(tmp_path / "old.db")
    assert [(k.key_id, k.kind, k.tenant) for k in ledger.list_keys()] == [("k1", "admin", "t")]
    assert ledger.create_key("operator", None, None, None, 0)[0].tenant is None
    ledger.close()


def test_collections_and_migrations(ledger: Ledger, opener: Opener) -> None:
    ledger.register_collection(CollectionRecord("chroma", "c1", "t", "db", "mem", "x", 1))
    assert ledger.get_collection("chroma", "c1").tenant == "t"  # type: ignore[union-attr]
    assert [c.collection_id for c in ledger.list_collections("chroma", "t", "db")] == ["c1"]
    ledger.reserve_rows([_row("a")])
    ledger.activate_rows("chroma", "c1", ["a"])
    ledger.delete_collection("chroma", "c1", "x", "req")
    assert ledger.get_collection("chroma", "c1") is None
    assert ledger.get_rows("chroma", "c1", ["a"])["a"].status == "deleted"
    ledger.close()
    again = opener()  # re-open: migrations are idempotent, the data is still there
    assert again.migrate() == len(SQLITE_MIGRATIONS) == len(PG_MIGRATIONS) and again.ping()
    assert again.get_rows("chroma", "c1", ["a"])["a"].status == "deleted"


def test_second_instance_sees_every_commit_at_once(opener: Opener) -> None:
    """Two ledgers on one store (two replicas): nothing is cached, every commit is seen on the next call."""
    a, b = opener(), opener()
    rec, key = a.create_key("agent", "t", "red", "a", 1)
    assert b.authenticate(key) is not None
    assert a.revoke_key(rec.key_id)
    assert b.authenticate(key) is None
    assert a.reserve_rows([_row("x"), _row("y")]) == []
    assert b.reserve_rows([_row("y")]) == ["y"]
    a.activate_rows("chroma", "c1", ["x", "y"])
    assert {r.status for r in b.get_rows("chroma", "c1", ["x", "y"]).values()} == {"active"}
    moved = b.get_rows("chroma", "c1", ["x"])["x"]
    moved.scope, moved.readers = "restricted", ("t/red/b",)
    b.update_governance([moved])
    assert a.get_rows("chroma", "c1", ["x"])["x"].readers == ("t/red/b",)
    a.tombstone("chroma", "c1", ["y"], "t/red/a", "req")
    assert b.get_rows("chroma", "c1", ["y"])["y"].status == "deleted"
    assert b.pending_tombstones("chroma") == [("c1", "y")]
    b.register_collection(CollectionRecord("chroma", "c9", "t", "db", "mem", "x", 1))
    assert a.get_collection("chroma", "c9") is not None


def test_reserve_is_all_or_nothing_under_concurrency(opener: Opener) -> None:
    """Eight threads reserve {shared, own_i}: exactly one wins, the others insert nothing."""
    ledger = opener()
    results: dict[int, list[str]] = {}
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        rows = [_row("shared"), _row(f"own{i}")]
        barrier.wait()
        results[i] = ledger.reserve_rows(rows)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, taken in results.items() if taken == []]
    assert len(winners) == 1 and all(results[i] == ["shared"] for i in results if i not in winners)
    present = set(ledger.get_rows("chroma", "c1", ["shared", *(f"own{i}" for i in range(8))]))
    assert present == {"shared", f"own{winners[0]}"}


def test_conflicting_reservation_leaves_rows_untouched(ledger: Ledger) -> None:
    ledger.reserve_rows([_row("a")])
    mine = [_row("b"), _row("a")]
    assert ledger.reserve_rows(mine) == ["a"]
    assert [r.status for r in mine] == ["active", "active"]


def test_duplicate_collection_is_refused(ledger: Ledger) -> None:
    rec = CollectionRecord("chroma", "c1", "t", "db", "mem", "x", 1)
    ledger.register_collection(rec)
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.UniqueViolation)):
        ledger.register_collection(rec)
    assert [c.collection_id for c in ledger.list_collections("chroma", "t", "db")] == ["c1"]


def test_collection_intents_resolve_once(ledger: Ledger, opener: Opener) -> None:
    """A create intent is durable (seen by a second instance), found by its nonce only, and resolved in one
    transaction with the registration: every intent of that name goes; a failed create drops only its own."""
    a = CollectionIntent("chroma", "n-a", "t", "db", "mem", "t/admin/k1", 10)
    b = CollectionIntent("chroma", "n-b", "t", "db", "mem", "t/admin/k2", 11)
    other = CollectionIntent("chroma", "n-c", "t", "db", "other", "t/admin/k1", 12)
    for intent in (a, b, other):
        ledger.record_collection_intent(intent)
    second = opener()
    assert second.collection_intent("chroma", "n-a") == a and second.collection_intent("mem0", "n-a") is None
    assert second.collection_intent("chroma", "nope") is None
    ledger.resolve_collection_intent(other, None)  # Chroma refused this create: only its intent goes
    assert ledger.collection_intent("chroma", "n-c") is None and ledger.collection_intent("chroma", "n-b") == b
    ledger.resolve_collection_intent(a, CollectionRecord("chroma", "c1", "t", "db", "mem", a.created_by, a.created_at))
    assert second.get_collection("chroma", "c1").created_by == "t/admin/k1"  # type: ignore[union-attr]
    assert second.collection_intent("chroma", "n-a") is None and second.collection_intent("chroma", "n-b") is None
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.UniqueViolation)):  # registered once, whoever races
        ledger.resolve_collection_intent(b, CollectionRecord("chroma", "c1", "t", "db", "mem", b.created_by, 1))
    assert second.get_collection("chroma", "c1").created_by == "t/admin/k1"  # type: ignore[union-attr]


def test_postgres_versioned_migrations(pg_url: str) -> None:
    schema = fresh_schema()
    with pytest.raises(SchemaOutOfDate):
        PostgresLedger(pg_url, schema=schema, migrate_on_open=False)
    # replicas starting together: the advisory lock makes them migrate once
    errors: list[BaseException] = []

    def start() -> None:
        try:
            PostgresLedger(pg_url, schema=schema, max_size=2).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ledger = PostgresLedger(pg_url, schema=schema, migrate_on_open=False)
    try:
        assert ledger.schema_version() == len(PG_MIGRATIONS)
        with ledger._conn() as db:
            assert [r["version"] for r in db.execute("SELECT version FROM schema_version ORDER BY version")] == \
                list(range(1, len(PG_MIGRATIONS) + 1))
    finally:
        ledger.close()
    with pytest.raises(ValueError):
        PostgresLedger(pg_url, schema="Robert'); DROP TABLE x;--")


def test_postgres_unreachable_fails_fast() -> None:
    with pytest.raises(Exception):
        PostgresLedger("postgresql://postgres@127.0.0.1:1/none", timeout_s=1.0)


def test_cli_ledger_migrate_and_keys_on_postgres(pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sidecar.cli import app

    schema = fresh_schema()
    monkeypatch.setenv("MEMWARDEN_LEDGER_URL", pg_url)
    monkeypatch.setenv("MEMWARDEN_LEDGER_SCHEMA", schema)
    monkeypatch.setenv("MEMWARDEN_LEDGER_MIGRATE_ON_START", "false")
    runner = CliRunner()
    first = runner.invoke(app, ["ledger", "migrate"])
    assert first.exit_code == 0 and f"version {len(PG_MIGRATIONS)}" in first.output, first.output
    assert runner.invoke(app, ["ledger", "migrate"]).exit_code == 0  # idempotent
    created = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--fleet", "red", "--agent", "a", "--trust", "1"])
    assert created.exit_code == 0, created.output
    key = next(line for line in created.output.splitlines() if line.startswith("mwk_"))
    ledger = PostgresLedger(pg_url, schema=schema, migrate_on_open=False)
    try:
        assert ledger.authenticate(key) is not None
    finally:
        ledger.close()
    sqlite_run = runner.invoke(app, ["ledger", "migrate", "--ledger", str(tmp_path / "x.db")])
    assert sqlite_run.exit_code == 0 and f"version {len(SQLITE_MIGRATIONS)}" in sqlite_run.output
    monkeypatch.setenv("MEMWARDEN_LEDGER_URL", "postgresql://postgres@127.0.0.1:1/none")
    monkeypatch.setenv("MEMWARDEN_LEDGER_TIMEOUT_S", "1")
    assert runner.invoke(app, ["ledger", "migrate"]).exit_code == 1


# -- provenance, supersession and deletion closure (both ledgers) ------------------------------

def _fact(i: str, obj: str, collection: str = "c1", derived: tuple[tuple[str, str], ...] = (), digest: str | None = None,
          scope: str = "fleet", owner: str = "t/red/a", readers: tuple[str, ...] = ()) -> Row:
    return Row("chroma", collection, i, "t", owner.split("/")[1], owner, scope, owner, 1, subject="svc", predicate="status",
               object=obj, single_valued=True, derived_from=derived, content_hmac=digest, readers=readers)


def _add(ledger: Any, *rows: Row) -> list[tuple[str, tuple[str, str]]]:
    assert ledger.reserve_rows(list(rows)) == []
    out: list[tuple[str, tuple[str, str]]] = []
    for r in rows:
        out += ledger.activate_rows("chroma", r.collection, [r.row_id])
    return out


def test_supersession_keeps_one_active_fact_per_partition(ledger: Any) -> None:
    assert _add(ledger, _fact("a", "paused")) == []
    assert _add(ledger, _fact("b", "running")) == [("b", ("c1", "a"))]
    assert _add(ledger, _fact("c", "stopped")) == [("c", ("c1", "b"))]
    rows = ledger.get_rows("chroma", "c1", ["a", "b", "c"])
    assert [rows[i].status for i in "abc"] == ["superseded", "superseded", "active"]
    assert rows["b"].supersedes == ("c1", "a") and rows["b"].superseded_by == ("c1", "c")
    assert rows["a"].superseded_at is not None and rows["c"].superseded_by is None
    # Other partitions hold their own fact: another collection, another fleet, an agent's private fact,
    # the tenant-wide fact, a restricted audience (readers in any order are one audience)
    others = [_fact("k2", "x", collection="c2"), _fact("blue", "x", owner="t/blue/b"), _fact("mine", "x", scope="agent"),
              _fact("all", "x", scope="tenant"), _fact("r1", "x", scope="restricted", readers=("t/red/z", "t/blue/y"))]
    for row in others:
        assert _add(ledger, row) == [], row.row_id
    assert _add(ledger, _fact("r2", "y", scope="restricted", readers=("t/blue/y", "t/red/z"))) == [("r2", ("c1", "r1"))]
    assert _add(ledger, _fact("all2", "y", scope="tenant", owner="t/blue/b")) == [("all2", ("c1", "all"))]
    assert ledger.active_fact("chroma", "t", "svc", "status", collection="c1", partition="fleet:t/red").row_id == "c"
    assert ledger.active_fact("chroma", "t", "svc", "status", collection="c1", partition="tenant").row_id == "all2"
    other = Row("chroma", "c1", "o", "t", "red", "t/red/a", "fleet", "t/red/a", 1, subject="svc", predicate="note", object="x")
    assert _add(ledger, other) == []  # not single-valued: no supersession


def test_activation_compares_and_sets_the_fact_it_supersedes(ledger: Any) -> None:
    """`expect`: a row supersedes only the fact its writer was allowed to update; if another write replaced
    it since, `StaleFact` names the fact now active and nothing of the call is activated."""
    _add(ledger, _fact("a", "paused"))
    assert ledger.reserve_rows([_fact("b", "running"), _fact("c", "stopped"), _fact("d", "up")]) == []
    ledger.activate_rows("chroma", "c1", ["b"], expect={"b": ("c1", "a")})  # b replaces a, as decided
    with pytest.raises(StaleFact) as stale:  # c was decided against a, but b is active now
        ledger.activate_rows("chroma", "c1", ["d", "c"], expect={"d": ("c1", "b"), "c": ("c1", "a")})
    assert (stale.value.row_id, stale.value.current) == ("c", ("c1", "d"))
    rows = ledger.get_rows("chroma", "c1", ["a", "b", "c", "d"])
    assert [rows[i].status for i in "abcd"] == ["superseded", "active", "pending", "pending"]  # d rolled back too
    with pytest.raises(StaleFact):
        ledger.activate_rows("chroma", "c1", ["c"], expect={"c": None})
    # decided again on b: c then d, each over the previous one
    assert ledger.activate_rows("chroma", "c1", ["c", "d"], expect={"c": ("c1", "b"), "d": ("c1", "c")}) == [
        ("c", ("c1", "b")), ("d", ("c1", "c"))]
    assert ledger.active_fact("chroma", "t", "svc", "status").row_id == "d"


def _writers(ledger: Any, wanted: int = 50) -> int:
    """How many racing writers (one connection each) this ledger's server can hold: `wanted` on SQLite; on
    PostgreSQL at most the free connections minus a margin of 10 (a full suite run shares the server with
    other clients; CI's cluster had fewer free than 50), and never fewer than 8, a real race."""
    if isinstance(ledger, SQLiteLedger):
        return wanted
    with ledger._conn() as db:
        row = db.execute("SELECT current_setting('max_connections')::int AS max_connections,"
                         " (SELECT count(*) FROM pg_stat_activity)::int AS used").fetchone()
    limit, used = (row["max_connections"], row["used"]) if isinstance(row, dict) else row
    free = limit - used
    assert free - 10 >= 8, f"PostgreSQL has {free} free connections of {limit}: too few for a race of 8 writers"
    return min(wanted, free - 10)


def test_concurrent_activations_leave_exactly_one_active(opener: Opener) -> None:
    first = opener()
    n = _writers(first)
    rows = [_fact(f"w{i}", f"v{i}") for i in range(n)]
    assert first.reserve_rows(rows) == []
    errors: list[BaseException] = []
    # One ledger (connection) per writer, opened before the race: what races is the activations, not the
    # opens (50 opens at once queue on the migration lock and can outlast the pool timeout on a busy machine).
    ledgers = [opener() for _ in rows]

    def activate(ledger: Any, row_id: str) -> None:
        try:
            ledger.activate_rows("chroma", "c1", [row_id])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=activate, args=(ledger, r.row_id)) for ledger, r in zip(ledgers, rows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = first.get_rows("chroma", "c1", [r.row_id for r in rows])
    statuses = [got[r.row_id].status for r in rows]
    assert statuses.count("active") == 1 and statuses.count("superseded") == n - 1  # none lost
    # The supersession links form one chain through all n rows.
    by = {r.row_id: r for r in got.values()}
    head = next(r for r in got.values() if r.status == "active")
    seen = 1
    while head.supersedes is not None:
        head = by[head.supersedes[1]]
        seen += 1
    assert seen == n


def test_deletion_closure_cascades_and_remembers_content(ledger: Any) -> None:
    root = Row("chroma", "c1", "root", "t", "red", "t/red/a", "fleet", "t/red/a", 1, content_hmac="h-root")
    child = Row("chroma", "c1", "child", "t", "red", "t/red/a", "fleet", "t/red/a", 1, derived_from=(("c1", "root"),))
    grandchild = Row("chroma", "c2", "gc", "t", "red", "t/red/a", "fleet", "t/red/a", 1, derived_from=(("c1", "child"),))
    copy = Row("chroma", "c2", "copy", "t", "red", "t/red/a", "fleet", "t/red/a", 1, content_hmac="h-root")
    foreign_copy = Row("chroma", "c3", "x", "u", "red", "u/red/a", "fleet", "u/red/a", 1, content_hmac="h-root")
    unrelated = Row("chroma", "c1", "other", "t", "red", "t/red/a", "fleet", "t/red/a", 1)
    for r in (root, child, grandchild, copy, foreign_copy, unrelated):
        _add(ledger, r)
    lineage = ledger.lineage("chroma", "c2", "gc")
    assert [(d, key) for d, _, key, _ in lineage] == [(0, ("c2", "gc")), (1, ("c1", "child")), (2, ("c1", "root"))]
    copies = ledger.content_copies("chroma", "t", ["h-root"])
    assert {(r.collection, r.row_id) for r in copies} == {("c1", "root"), ("c2", "copy")}  # never another tenant's
    closed = ledger.tombstone("chroma", "c1", ["root"], "t/red/a", "req", also=[("c2", "copy")])
    assert closed[0] == ("c1", "root") and set(closed) == {("c1", "root"), ("c1", "child"), ("c2", "gc"), ("c2", "copy")}
    assert ledger.get_rows("chroma", "c3", ["x"])["x"].status == "active"  # another tenant's copy is not touched
    assert ledger.get_rows("chroma", "c1", ["other"])["other"].status == "active"
    assert set(ledger.pending_tombstones("chroma")) == set(closed)
    assert ledger.forgotten("t", ["h-root", "h-other"]) == {"h-root"} and ledger.forgotten("u", ["h-root"]) == set()


def test_redact_closure_keeps_derived_rows(ledger: Any) -> None:
    root = Row("chroma", "c1", "root", "t", "red", "t/red/a", "fleet", "t/red/a", 1)
    child = Row("chroma", "c1", "child", "t", "red", "t/red/a", "fleet", "t/red/a", 1, derived_from=(("c1", "root"),))
    _add(ledger, root, child)
    assert ledger.tombstone("chroma", "c1", ["root"], "x", "r", closure="redact") == [("c1", "root")]
    assert ledger.get_rows("chroma", "c1", ["child"])["child"].status == "active"


def test_released_reservation_drops_its_lineage_and_key_is_stable(ledger: Any, opener: Opener) -> None:
    child = Row("chroma", "c1", "child", "t", "red", "t/red/a", "fleet", "t/red/a", 1, derived_from=(("c1", "p"),))
    assert ledger.reserve_rows([child]) == []
    ledger.release_rows("chroma", "c1", ["child"])
    assert ledger.lineage("chroma", "c1", "child")[0][1] is None
    assert ledger.lineage("chroma", "c1", "child")[0][3] == []
    key = ledger.content_key()
    assert len(key) == 32 and opener().content_key() == key


def test_postgres_survives_a_terminated_connection(pg_url: str) -> None:
    """A pooled connection killed server-side (restart, idle timeout) is detected at checkout and
    replaced: the next call succeeds instead of failing once per stale connection."""
    ledger = PostgresLedger(pg_url, schema=fresh_schema(), min_size=1, max_size=1)
    try:
        _, key = ledger.create_key("agent", "t", "red", "a", 1)
        with ledger._conn() as db:
            pid = db.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        import time

        time.sleep(0.2)
        assert ledger.authenticate(key) is not None
        with ledger._conn() as db:
            assert db.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"] != pid
    finally:
        ledger.close()


ROW_V3 = ("INSERT INTO rows (backend, collection_id, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, "
          "created_at, updated_at, request_id, subject, predicate, object, single_valued) VALUES "
          "('chroma', 'c1', {id}, 't', 'red', 't/red/a', {scope}, {readers}, '[]', 'active', 't/red/a', 1, 1, 'r', "
          "'svc', 'status', 'x', 1)")
PARTITIONS_V3 = {"f": ("fleet", "[]", "fleet:t/red"), "g": ("agent", "[]", "agent:t/red/a"), "h": ("tenant", "[]", "tenant"),
                 "r": ("restricted", '["t/red/z", "t/blue/Y", "t/blue/y"]', "restricted:t/red/a|t/blue/Y,t/blue/y,t/red/z")}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_migration_4_gives_existing_facts_their_partition(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Facts written under the tenant-wide supersession (version 3) get the partition the code computes,
    readers sorted by code point on both databases, and may then be active side by side."""
    if kind == "sqlite":
        db: Any = sqlite3.connect(tmp_path / "v3.db", isolation_level=None)
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        migrations, ph = SQLITE_MIGRATIONS, "?"
    else:
        url, schema = request.getfixturevalue("pg_url"), fresh_schema()
        db = psycopg.connect(url, autocommit=True)
        db.execute(f'CREATE SCHEMA "{schema}"')
        db.execute(f"SET search_path = {schema}")
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at BIGINT NOT NULL)")
        migrations, ph = PG_MIGRATIONS, "%s"
    for version in range(3):
        for statement in migrations[version].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"INSERT INTO schema_version VALUES ({ph}{', 0' if kind == 'postgres' else ''})", (version + 1,))
    # under version 3 only one of them could be active at once: insert them superseded
    for i, (scope, readers, _) in PARTITIONS_V3.items():
        db.execute(ROW_V3.format(id=f"'{i}'", scope=f"'{scope}'", readers=f"'{readers}'").replace("'active'", "'superseded'"))
    db.close()
    ledger = SQLiteLedger(tmp_path / "v3.db") if kind == "sqlite" else open_ledger(url, schema=schema, max_size=2)
    try:
        from sidecar.governance import fact_partition
        rows = ledger.get_rows("chroma", "c1", list(PARTITIONS_V3))
        for i, (_, _, expected) in PARTITIONS_V3.items():
            assert fact_partition(rows[i]) == expected
            if kind == "sqlite":
                stored = ledger._db.execute("SELECT fact_partition FROM rows WHERE row_id = ?", (i,)).fetchone()[0]
            else:
                with ledger._conn() as conn:  # type: ignore[attr-defined]
                    stored = conn.execute("SELECT fact_partition FROM rows WHERE row_id = %s", (i,)).fetchone()["fact_partition"]
            assert stored == expected
        with ledger._tx() as conn:  # type: ignore[attr-defined]  # one active fact per partition: all four at once
            conn.execute("UPDATE rows SET status = 'active' WHERE backend = 'chroma'")
        assert {r.status for r in ledger.get_rows("chroma", "c1", list(PARTITIONS_V3)).values()} == {"active"}
    finally:
        ledger.close()


def test_adopt_rows_never_touches_what_the_ledger_holds(ledger: Ledger) -> None:
    """`memwarden adopt`: new ids become active in one transaction; an id the ledger holds in any state
    (active, pending, tombstoned) keeps exactly what it had; listing keys are recorded once per tenant."""
    assert ledger.reserve_rows([_row("pending")]) == []
    assert ledger.reserve_rows([_row("live"), _row("gone")]) == []
    ledger.activate_rows("chroma", "c1", ["live", "gone"])
    ledger.tombstone("chroma", "c1", ["gone"], "t/red/a", "req")
    before = ledger.get_rows("chroma", "c1", ["pending", "live", "gone"])
    wide = [_row(i) for i in ("pending", "live", "gone", "new1", "new2")]
    for r in wide:
        r.scope, r.owner = "tenant", "t/red/other"
    assert sorted(ledger.adopt_rows(wide, [("t", "agent_id", "bot"), ("t", "agent_id", "bot"), ("u", "user_id", "x")])) == ["new1", "new2"]
    after = ledger.get_rows("chroma", "c1", ["pending", "live", "gone", "new1", "new2"])
    for i in ("pending", "live", "gone"):
        assert (after[i].status, after[i].scope, after[i].owner) == (before[i].status, before[i].scope, before[i].owner)
    assert {(after[i].status, after[i].scope) for i in ("new1", "new2")} == {("active", "tenant")}
    assert ledger.adopt_rows([_row("new1")]) == [] and ledger.adopt_rows([]) == []
    assert ledger.listing_keys("chroma", "c1", "t") == [("agent_id", "bot")]
    assert ledger.listing_keys("chroma", "c1", "u") == [("user_id", "x")]
    assert ledger.listing_keys("chroma", "c2", "t") == []


def test_postgres_ledger_works_with_descriptors_above_fd_setsize(pg_url: str) -> None:  # noqa: F811
    """With more than 1,024 descriptors open (a sidecar holding many client connections; seen in a full
    test run), the pool's checkout check and the listener's pending-notification test still work: select(2)
    cannot watch such descriptors, and every checkout used to fail its check until PoolTimeout."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1400, hard), hard))
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(max(0, 1100 - len(os.listdir("/proc/self/fd"))))]
    try:
        ledger = PostgresLedger(pg_url, schema=fresh_schema(), min_size=1, max_size=2, timeout_s=3)
        try:
            with ledger._conn() as db:
                assert db.fileno() >= 1024  # the case this test is about
            _, key = ledger.create_key("agent", "t", "red", "a", 1)
            assert ledger.authenticate(key) is not None  # a checkout after an idle period: the check ran
            deadline = time.monotonic() + 10
            while ledger.cache_version() is None and time.monotonic() < deadline:  # the listener connects
                time.sleep(0.01)
            assert ledger.cache_version() is not None
        finally:
            ledger.close()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
