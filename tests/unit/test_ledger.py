"""SQLite ledger: keys are stored hashed, revocation is immediate, reservations and tombstones are atomic."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger


@pytest.fixture
def ledger(tmp_path: Path) -> SQLiteLedger:
    return SQLiteLedger(tmp_path / "l.db")


def test_keys_hashed_authenticated_revoked(ledger: SQLiteLedger, tmp_path: Path) -> None:
    rec, key = ledger.create_key("agent", "t", "red", "a", 2)
    p = ledger.authenticate(key)
    assert p is not None and (p.tenant, p.fleet, p.agent, p.trust, p.kind) == ("t", "red", "a", 2, "agent")
    raw = sqlite3.connect(tmp_path / "l.db").execute("SELECT * FROM api_keys").fetchall()
    assert key.split(".", 1)[1] not in repr(raw)
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


def test_agent_trust_recorded_for_owner_entities(ledger: SQLiteLedger) -> None:
    ledger.create_key("agent", "t", "red", "a", 1)
    ents = ledger.agent_entities({"t/red/a", "t/red/unknown"})
    assert set(ents) == {"t/red/a"} and ents["t/red/a"]["attrs"]["trust"] == 1


def _row(i: str) -> Row:
    return Row("chroma", "c1", i, "t", "red", "t/red/a", "fleet", "t/red/a", 1)


def test_reserve_activate_release_tombstone(ledger: SQLiteLedger) -> None:
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


def test_collections_and_migrations(ledger: SQLiteLedger, tmp_path: Path) -> None:
    ledger.register_collection(CollectionRecord("chroma", "c1", "t", "db", "mem", "x", 1))
    assert ledger.get_collection("chroma", "c1").tenant == "t"  # type: ignore[union-attr]
    assert [c.collection_id for c in ledger.list_collections("chroma", "t", "db")] == ["c1"]
    ledger.reserve_rows([_row("a")])
    ledger.activate_rows("chroma", "c1", ["a"])
    ledger.delete_collection("chroma", "c1", "x", "req")
    assert ledger.get_collection("chroma", "c1") is None
    assert ledger.get_rows("chroma", "c1", ["a"])["a"].status == "deleted"
    ledger.close()
    again = SQLiteLedger(tmp_path / "l.db")  # re-open: migrations are idempotent
    assert again.migrate() == 1 and again.ping()
