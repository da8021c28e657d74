"""Per-row update markers and row versions (ledger schema version 9; issue 34, finding 11), on SQLite and on
PostgreSQL: one update of a row at a time, a dead update's marker taken over after the lease, the governance write
only by the marker's holder, and the governance each version of a row was written under."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from sidecar.governance import Row
from sidecar.ledger import SQLiteLedger, open_ledger
from sidecar.ledger.base import UpdateLost
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
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
        ledger.close()


def row(row_id: str, scope: str = "fleet", backend: str = "mem0") -> Row:
    return Row(backend, "c", row_id, "t", "red", "t/red/a", scope, "t/red/a", 1, request_id="req-add")


def put(ledger: Any, *rows: Row) -> None:
    ledger.reserve_rows(list(rows))
    ledger.activate_rows(rows[0].backend, "c", [r.row_id for r in rows])


def test_one_update_of_a_row_at_a_time(opener: Callable[[], Any]) -> None:
    ledger = opener()
    put(ledger, row("a"), row("b"))
    assert ledger.begin_update("mem0", "c", ["a"], "r1") == []
    assert ledger.begin_update("mem0", "c", ["a"], "r1") == []  # its own marker again
    assert ledger.begin_update("mem0", "c", ["b", "a"], "r2") == ["a"]  # all or none: b is not taken either
    assert ledger.begin_update("mem0", "c", ["b"], "r3") == []
    ledger.end_update("mem0", "c", ["a"], "r2")  # not r2's: left alone
    assert ledger.begin_update("mem0", "c", ["a"], "r2") == ["a"]
    ledger.end_update("mem0", "c", ["a"], "r1")
    assert ledger.begin_update("mem0", "c", ["a"], "r2") == []
    assert ledger.begin_update("chroma", "c", ["a"], "r4") == []  # another backend's row of the same id


def test_a_dead_updates_marker_is_taken_over_after_the_lease(opener: Callable[[], Any]) -> None:
    ledger = opener()
    put(ledger, row("a"))
    assert ledger.begin_update("mem0", "c", ["a"], "dead", lease_s=30) == []
    assert ledger.begin_update("mem0", "c", ["a"], "next", lease_s=30) == ["a"]
    assert ledger.begin_update("mem0", "c", ["a"], "next", lease_s=1e-6) == []  # older than the lease: taken over
    # the dead update, come back, can no longer write governance: nothing is written
    widened = row("a", scope="tenant")
    with pytest.raises(UpdateLost):
        ledger.update_governance([widened], holder="dead")
    assert ledger.get_rows("mem0", "c", ["a"])["a"].scope == "fleet"
    ledger.update_governance([widened], holder="next")
    assert ledger.get_rows("mem0", "c", ["a"])["a"].scope == "tenant"
    assert ledger.begin_update("mem0", "c", ["a"], "third") == []  # released by the holder's write


def test_concurrent_takers_get_one_marker(opener: Callable[[], Any]) -> None:
    """Eight threads, each on its own connection, take the marker of one row at once: exactly one gets it."""
    first = opener()
    put(first, row("a"))
    ledgers = [opener() for _ in range(8)]
    barrier = threading.Barrier(len(ledgers))
    got: list[list[str]] = [[] for _ in ledgers]

    def take(n: int) -> None:
        barrier.wait()
        got[n] = ledgers[n].begin_update("mem0", "c", ["a"], f"r{n}")

    threads = [threading.Thread(target=take, args=(n,)) for n in range(len(ledgers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(tuple, got)) == [()] + [("a",)] * (len(ledgers) - 1)


def test_versions_record_the_governance_each_update_wrote(opener: Callable[[], Any]) -> None:
    ledger = opener()
    put(ledger, row("a", scope="agent"))
    assert ledger.row_versions("mem0", "c", "a") == []  # never updated: its governance now is its creation's
    assert ledger.begin_update("mem0", "c", ["a"], "u1") == []
    ledger.update_governance([row("a", scope="fleet")], holder="u1", history={"a": "ev-1"})
    assert ledger.begin_update("mem0", "c", ["a"], "u2") == []
    ledger.update_governance([row("a", scope="tenant")], holder="u2", history={"a": None})
    got = [(v.version, v.kind, v.event_id, v.scope, v.request_id) for v in ledger.row_versions("mem0", "c", "a")]
    assert got == [(0, "created", None, "agent", "req-add"), (1, "update", "ev-1", "fleet", "u1"),
                   (2, "update", None, "tenant", "u2")]
    # without `history` (Chroma), no version is recorded
    put(ledger, row("x", backend="chroma"))
    ledger.update_governance([row("x", scope="tenant", backend="chroma")])
    assert ledger.row_versions("chroma", "c", "x") == []


def test_migration_9_gives_existing_mem0_rows_a_baseline(tmp_path: Path) -> None:
    """A ledger of schema version 8 with a Mem0 row: after the migration, the row's governance of that moment is its
    ``baseline`` version (its past history entries are matched to none)."""
    from sidecar.ledger.sqlite import MIGRATIONS

    path = tmp_path / "old.db"
    old = SQLiteLedger(path)
    put(old, row("m", scope="tenant"), )
    put(old, row("k", scope="agent", backend="chroma"))
    old._db.execute("DROP TABLE row_versions")
    old._db.execute("DROP TABLE row_updates")
    for column in ("expires_at", "last_used_at", "rotated_to"):  # version 10 (key hygiene) undone too
        old._db.execute(f"ALTER TABLE api_keys DROP COLUMN {column}")
    old._db.execute("DELETE FROM schema_version WHERE version > 8")
    assert len(MIGRATIONS) >= 9
    old.close()
    again = SQLiteLedger(path)
    try:
        assert [(v.version, v.kind, v.scope) for v in again.row_versions("mem0", "c", "m")] == [(0, "baseline", "tenant")]
        assert again.row_versions("chroma", "c", "k") == []
        assert again.begin_update("mem0", "c", ["m"], "u1") == []
        again.update_governance([row("m", scope="fleet")], holder="u1", history={"m": "ev"})
        assert [v.kind for v in again.row_versions("mem0", "c", "m")] == ["baseline", "update"]
    finally:
        again.close()
