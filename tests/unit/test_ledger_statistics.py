"""Planner statistics of the PostgreSQL ledger (`PostgresLedger.refresh_statistics` and the sidecar's
start-up / periodic task), on a real PostgreSQL.

Without statistics — a new ledger, a bulk adoption, or a server with ``autovacuum = off`` (as this
machine's is) — PostgreSQL's plan of `read_rows` scans every row of the collection and filters the ids
instead of looking them up: the hot path of every read then grows with the collection. The ledger
analyzes its own stale tables; these tests check that it does (and only then), that replicas take turns,
and that with the statistics in place the read's plan looks the ids up in the primary key."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import psycopg
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.governance import Row
from sidecar.ledger.postgres import _READ_ROWS, _STATISTICS_LOCK, PostgresLedger
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

POLICIES = Path(__file__).resolve().parents[2] / "policies"
Opener = Callable[..., PostgresLedger]


@pytest.fixture
def opener(pg_url: str) -> Iterator[Opener]:  # noqa: F811
    schema = fresh_schema()
    opened: list[PostgresLedger] = []

    def open_() -> PostgresLedger:
        opened.append(PostgresLedger(pg_url, schema=schema, min_size=0, max_size=2))
        return opened[-1]
    yield open_
    for ledger in opened:
        ledger.close()


def fill(ledger: PostgresLedger, n: int) -> list[str]:
    ids = [f"r{i}" for i in range(n)]
    for s in range(0, n, 1000):
        assert ledger.reserve_rows([Row("chroma", "c1", i, "t", "red", "t/red/a", "tenant", "t/red/a", 1)
                                    for i in ids[s:s + 1000]]) == []
    ledger.activate_rows("chroma", "c1", ids)
    return ids


def has_statistics(ledger: PostgresLedger, table: str) -> bool:
    with ledger._conn() as db:  # noqa: SLF001
        r = db.execute("SELECT count(*) AS n FROM pg_stats WHERE schemaname = %s AND tablename = %s",
                       (ledger.schema, table)).fetchone()
    return bool(r and r["n"])


def refresh_until(ledger: PostgresLedger, table: str, timeout_s: float = 30.0) -> list[str]:
    """Call `refresh_statistics` until it has analyzed `table` (the server publishes a table's change
    counters within a few seconds of the writes); returns every table analyzed on the way."""
    analyzed: list[str] = []
    deadline = time.monotonic() + timeout_s
    while table not in analyzed:
        assert time.monotonic() < deadline, f"{table} never found stale; analyzed {analyzed}"
        analyzed += ledger.refresh_statistics()
        if table not in analyzed:
            time.sleep(0.5)
    return analyzed


def rows_scan(ledger: PostgresLedger, ids: list[str], key_id: str) -> dict[str, Any]:
    """The plan node of `read_rows`' statement that reads the ``rows`` table."""
    with ledger._conn() as db:  # noqa: SLF001
        plan = db.execute("EXPLAIN (FORMAT JSON) " + _READ_ROWS,
                          {"key": key_id, "backend": "chroma", "collection": "c1", "ids": ids}).fetchone()
    assert plan is not None
    tree = plan["QUERY PLAN"]
    tree = json.loads(tree) if isinstance(tree, str) else tree
    stack = [tree[0]["Plan"]]
    while stack:
        node = stack.pop()
        if node.get("Relation Name") == "rows":
            return node
        stack.extend(node.get("Plans", []))
    raise AssertionError("no scan of rows in the plan")


def test_stale_tables_are_analyzed_once_and_the_read_then_looks_the_ids_up(opener: Opener) -> None:
    ledger = opener()
    key, _ = ledger.create_key("agent", "t", "red", "a", 1)
    ids = fill(ledger, 3000)
    assert not has_statistics(ledger, "rows")  # autovacuum has not run (off here, or not yet)
    analyzed = refresh_until(ledger, "rows")
    assert len(set(analyzed)) == len(analyzed)  # each stale table analyzed once
    assert has_statistics(ledger, "rows")
    assert ledger.refresh_statistics() == []  # nothing changed since: nothing to analyze
    node = rows_scan(ledger, ids[100:110], key.key_id)
    assert "row_id" in node.get("Index Cond", ""), node  # the ids are looked up, not filtered out of a scan
    rows, _, key_ok = ledger.read_rows("chroma", "c1", ids[100:110], key.key_id)
    assert key_ok and sorted(rows) == sorted(ids[100:110])


def changes_since_analyze(ledger: PostgresLedger, table: str) -> int:
    with ledger._conn() as db:  # noqa: SLF001
        r = db.execute("SELECT n_mod_since_analyze AS n FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
                       (ledger.schema, table)).fetchone()
    return int(r["n"]) if r else 0


def test_a_table_changed_past_the_threshold_is_analyzed_again(opener: Opener) -> None:
    ledger = opener()
    fill(ledger, 200)
    refresh_until(ledger, "rows")
    ledger.reserve_rows([Row("chroma", "c1", f"n{i}", "t", "red", "t/red/a", "tenant", "t/red/a", 1) for i in range(10)])
    deadline = time.monotonic() + 30
    while changes_since_analyze(ledger, "rows") < 10:  # the server publishes the counters within seconds
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert "rows" not in ledger.refresh_statistics()  # 10 changes: below 50 + 10 % of 200
    assert "rows" in ledger.refresh_statistics(min_changes=5, fraction=0.0)
    assert changes_since_analyze(ledger, "rows") == 0


def test_replicas_take_turns(opener: Opener, pg_url: str) -> None:  # noqa: F811
    ledger = opener()
    fill(ledger, 100)
    with psycopg.connect(pg_url, autocommit=True) as other:  # another replica holds the turn
        other.execute("SELECT pg_advisory_lock(%s)", (_STATISTICS_LOCK,))
        time.sleep(1.5)
        assert ledger.refresh_statistics() == []
        assert not has_statistics(ledger, "rows")
        other.execute("SELECT pg_advisory_unlock(%s)", (_STATISTICS_LOCK,))
    assert "rows" in refresh_until(ledger, "rows")


def test_the_sidecar_analyzes_at_start_up(opener: Opener) -> None:
    ledger = opener()
    fill(ledger, 500)
    time.sleep(1.5)
    assert not has_statistics(ledger, "rows")
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", reconcile_interval_s=0,
                              policy_watch_interval_s=0, ledger_analyze_interval_s=0.5),
                     transport=httpx.MockTransport(lambda r: httpx.Response(503)), ledger=ledger)
    with TestClient(app):
        deadline = time.monotonic() + 30
        while not has_statistics(ledger, "rows"):
            assert time.monotonic() < deadline, "the sidecar never analyzed the rows table"
            time.sleep(0.25)


def test_the_task_is_off_when_the_interval_is_zero(opener: Opener) -> None:
    ledger = opener()
    fill(ledger, 500)
    time.sleep(1.5)
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", reconcile_interval_s=0,
                              policy_watch_interval_s=0, ledger_analyze_interval_s=0),
                     transport=httpx.MockTransport(lambda r: httpx.Response(503)), ledger=ledger)
    with TestClient(app):
        time.sleep(1.0)
    assert not has_statistics(ledger, "rows")
