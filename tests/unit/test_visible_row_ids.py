"""`Ledger.visible_row_ids` — the visibility filter over the ledger's own columns, the id-list form of the
pushdown (docs/design.md §2.7) — on SQLite and on a real PostgreSQL, against the reference predicate written
out here from docs/design.md §3 (`auth`, tenant and status included) and against the planner's estimate
(`sidecar.planner.admitted_count` of the same rows' `visibility_counts`): rows of every scope, status, fleet,
owner and readers list (names with quotes, JSON escapes and non-ASCII), principals of every kind and trust, and
the limit (None exactly when more rows qualify)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.backends.chroma import visibility_reader
from sidecar.governance import Principal, Row
from sidecar.ledger.postgres import PostgresLedger
from sidecar.ledger.sqlite import SQLiteLedger
from sidecar.ledger.sql import N_ROW_COLUMNS as _N_ROW_COLUMNS, ROW_COLUMNS as _ROW_COLUMNS, row_to_db as _row_to_db
from sidecar.planner import admitted_count
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

TENANTS = ["t", "u"]
FLEETS = ["f", "g", 'q"x']
AGENTS = ["a", "b", "é\\n"]
UIDS = [f"{t}/{f}/{a}" for t in TENANTS for f in FLEETS for a in AGENTS]

rows = st.builds(
    lambda i, tenant, fleet, owner, scope, status, readers: Row(
        "chroma", "c", f"r{i}", tenant, fleet, owner, scope, owner, 1, status, readers=readers),
    st.integers(0, 10**6), st.sampled_from(TENANTS), st.sampled_from(FLEETS), st.sampled_from(UIDS),
    st.sampled_from(["agent", "fleet", "tenant", "restricted", "other"]),
    st.sampled_from(["active", "superseded", "pending", "deleted"]),
    st.lists(st.sampled_from(UIDS), max_size=3, unique=True).map(tuple))
principals = st.one_of(
    st.builds(lambda t, f, a, trust: Principal("agent", "k", t, f, a, trust),
              st.sampled_from(TENANTS), st.sampled_from(FLEETS), st.sampled_from(AGENTS), st.integers(0, 3)),
    st.builds(lambda t: Principal("admin", "k1", t), st.sampled_from(TENANTS)),
    st.just(Principal("operator", "k2", "")))


def reference(p: Principal, batch: list[Row], wide: bool) -> set[str]:
    """docs/design.md §3's `auth` without Cedar: same tenant, not deleted (nor pending: never servable), and
    agent → the owner, fleet → the fleet or trust ≥ 2, tenant → anyone, restricted → a named reader; the whole
    tenant for a tenant admin or the tenant-only filter (`wide`)."""
    me = p.uid[1]
    out = set()
    for r in batch:
        if r.tenant != p.tenant or r.status in ("deleted", "pending"):
            continue
        if wide or p.kind == "admin" or r.scope == "tenant" or (r.scope == "agent" and r.owner == me) \
                or (r.scope == "fleet" and (r.fleet == p.fleet or p.trust >= 2)) \
                or (r.scope == "restricted" and me in r.readers):
            out.add(r.row_id)
    return out


@pytest.fixture(params=["sqlite", "postgres"], scope="module")
def ledger(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if request.param == "sqlite":
        led: Any = SQLiteLedger(tmp_path_factory.mktemp("vis") / "l.db")
    else:
        led = PostgresLedger(request.getfixturevalue("pg_url"), schema=fresh_schema(), min_size=0, max_size=2)
    yield led
    led.close()


_collections = itertools.count()


def store(ledger: Any, batch: list[Row]) -> str:
    """`batch` as the rows of a new collection, written as stored rows are (`_row_to_db`)."""
    collection = f"c{next(_collections)}"
    sqlite = isinstance(ledger, SQLiteLedger)
    ph = "?" if sqlite else "%s"
    sql = f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join([ph] * _N_ROW_COLUMNS)}) ON CONFLICT DO NOTHING"
    values = []
    for row in batch:
        v = list(_row_to_db(row, 7))
        v[1] = collection
        values.append(v)
    if sqlite:
        with ledger._lock:  # noqa: SLF001
            ledger._db.executemany(sql, values)  # noqa: SLF001
    else:
        with ledger._tx() as db:  # noqa: SLF001
            db.cursor().executemany(sql, values)
    return collection


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rows, max_size=25, unique_by=lambda r: r.row_id), principals, st.booleans(), st.integers(0, 30))
def test_visible_row_ids_is_the_reference_predicate(ledger: Any, batch: list[Row], p: Principal, wide: bool,
                                                     limit: int) -> None:
    collection = store(ledger, batch)
    mode = "tenant" if wide else "scope"
    expected = reference(p, batch, wide)
    got = ledger.visible_row_ids("chroma", collection, p.tenant, visibility_reader(p, mode), limit)
    if len(expected) > limit:
        assert got is None
    else:
        assert got is not None and sorted(got) == sorted(expected)
    # another backend's or collection's rows are never listed
    assert ledger.visible_row_ids("mem0", collection, p.tenant, visibility_reader(p, mode), 10**6) == []
    assert ledger.visible_row_ids("chroma", collection + "x", p.tenant, visibility_reader(p, mode), 10**6) == []
    # the planner's estimate from the collection's counts is the same number when the rows are the tenant's
    own = [r for r in batch if r.tenant == p.tenant]
    if own == batch and p.kind != "operator":
        counts = ledger.visibility_counts("chroma", collection)
        assert admitted_count(p, counts, wide) == len(expected)


def test_limit_is_exact(ledger: Any) -> None:
    """`limit` rows qualify: listed; one more: None. Deleted and pending rows count for neither."""
    batch = [Row("chroma", "c", f"r{i}", "t", "f", "t/f/a", "tenant", "t/f/a", 1) for i in range(5)]
    batch += [Row("chroma", "c", f"d{i}", "t", "f", "t/f/a", "tenant", "t/f/a", 1, status) for i, status in
              enumerate(["deleted", "pending"])]
    collection = store(ledger, batch)
    reader = visibility_reader(Principal("agent", "k", "t", "g", "z", 0), "scope")
    assert sorted(ledger.visible_row_ids("chroma", collection, "t", reader, 5) or []) == [f"r{i}" for i in range(5)]
    assert ledger.visible_row_ids("chroma", collection, "t", reader, 4) is None
    assert ledger.visible_row_ids("chroma", collection, "t", reader, 0) is None
    assert ledger.visible_row_ids("chroma", collection, "u", reader, 5) == []


def test_reader_of_each_principal_kind() -> None:
    """The reader side follows `visibility_where`: the tenant filter alone for admins and mode ``tenant``."""
    agent = Principal("agent", "k", "t", "f", "a", 2)
    assert visibility_reader(agent, "scope") == ("t/f/a", None, True)  # every fleet: no fleet to name
    assert visibility_reader(Principal("agent", "k", "t", "f", "a", 1), "scope") == ("t/f/a", "f", False)
    assert visibility_reader(agent, "tenant") is None
    assert visibility_reader(Principal("admin", "k", "t"), "scope") is None


def test_sqlite_file_roundtrip(tmp_path: Path) -> None:
    """Rows written through the ledger's own write path (reserve, activate) are listed once active."""
    led = SQLiteLedger(tmp_path / "l.db")
    try:
        row = Row("chroma", "c", "r1", "t", "f", "t/f/a", "restricted", "t/f/a", 1, readers=("t/g/b",))
        assert led.reserve_rows([row]) == []
        reader_b = visibility_reader(Principal("agent", "k", "t", "g", "b", 0), "scope")
        assert led.visible_row_ids("chroma", "c", "t", reader_b, 10) == []  # pending
        led.activate_rows("chroma", "c", ["r1"])
        assert led.visible_row_ids("chroma", "c", "t", reader_b, 10) == ["r1"]
        reader_c = visibility_reader(Principal("agent", "k", "t", "g", "c", 0), "scope")
        assert led.visible_row_ids("chroma", "c", "t", reader_c, 10) == []
    finally:
        led.close()


def test_sqlite_reads_the_visibility_indexes_not_the_collection(tmp_path: Path) -> None:
    """Each branch of the statement is a range of its scope's partial index (migration 8), so its cost follows
    the rows admitted, not the collection's size: no branch scans the table."""
    from sidecar.ledger.dialect import SQLITE
    from sidecar.ledger.sql import visible_ids_query as _visible_ids_query

    led = SQLiteLedger(tmp_path / "l.db")
    try:
        for any_fleet in (False, True):
            sql, args = _visible_ids_query(SQLITE, "chroma", "c", "t", ("t/f/a", "f", any_fleet), 10)
            plan = [r[3] for r in led._db.execute("EXPLAIN QUERY PLAN " + sql, args)]  # noqa: SLF001
            used = {name for name in ("rows_visible_tenant", "rows_visible_agent", "rows_visible_fleet",
                                      "rows_visible_restricted") if any(name in line for line in plan)}
            assert len(used) == 4, plan
            assert not any(line.startswith("SCAN rows") for line in plan), plan
    finally:
        led.close()


@settings(max_examples=100, deadline=None)
@given(st.lists(rows, max_size=25), st.lists(st.tuples(principals, st.booleans()), min_size=1, max_size=8))
def test_planner_estimate_is_kept_per_principal_and_counts(batch: list[Row], asks: list[tuple[Principal, bool]]) -> None:
    """`QueryPlanner.admitted_rows` answers `admitted_count` of the kept counts for every principal, asked in any
    order and again (its memo keyed by what `admits` reads of a principal), and nothing before counts are kept."""
    from sidecar.planner import QueryPlanner

    counts: dict[tuple[Any, ...], int] = {}
    for r in batch:
        k = (r.scope, r.fleet, r.owner, r.readers, r.status)
        counts[k] = counts.get(k, 0) + 1
    flat = [(*k, n) for k, n in counts.items()]
    planner = QueryPlanner("auto", 2, 1000, lambda cid: flat)
    assert planner.admitted_rows(asks[0][0], "c") is None  # nothing kept, nothing read
    planner.warm("c", flat)
    for p, wide in asks + asks:
        assert planner.admitted_rows(p, "c", wide) == admitted_count(p, flat, wide)


def test_planner_estimate_tells_apart_what_admits_reads() -> None:
    """The same agent at another trust, fleet or kind, or in tenant mode, is not answered from another's memo."""
    from sidecar.planner import QueryPlanner

    flat = [("fleet", "g", "t/g/b", (), "active", 3), ("agent", "f", "t/f/a", (), "active", 2),
            ("restricted", "g", "t/g/b", ("t/f/a",), "active", 5), ("tenant", "g", "t/g/b", (), "deleted", 7)]
    planner = QueryPlanner("auto", 2, 1000, lambda cid: flat)
    planner.warm("c", flat)
    asks = [(Principal("agent", "k", "t", "f", "a", 1), False, 7), (Principal("agent", "k", "t", "f", "a", 2), False, 10),
            (Principal("agent", "k", "t", "f", "a", 1), True, 10), (Principal("agent", "k", "t", "g", "a", 1), False, 3),
            (Principal("admin", "k", "t"), False, 10)]
    for p, wide, n in asks + asks:
        assert planner.admitted_rows(p, "c", wide) == n == admitted_count(p, flat, wide)


@pytest.fixture(scope="module")
def pg_ledger(pg_url: str) -> Iterator[PostgresLedger]:  # noqa: F811
    led = PostgresLedger(pg_url, schema=fresh_schema(), min_size=0, max_size=2)
    yield led
    led.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rows, max_size=25, unique_by=lambda r: r.row_id), principals, st.booleans(), st.integers(0, 30),
       st.sampled_from(["none", "valid", "revoked", "unknown"]), st.booleans())
def test_visible_rows_is_the_list_and_its_rows_in_one_statement(pg_ledger: PostgresLedger, batch: list[Row],
                                                                 p: Principal, wide: bool, limit: int, key: str,
                                                                 asynchronous: bool) -> None:
    """`PostgresLedger.visible_rows` (and its asynchronous twin) answers what two statements answer: the ids of
    `visible_row_ids` (None exactly when it is None), the rows of `read_rows` for those ids, their owners as
    `read_rows` reads them, and the key re-check — valid, revoked, unknown or none asked."""
    import asyncio

    collection = store(pg_ledger, batch)
    owners = {r.owner for r in batch}
    with pg_ledger._tx() as db:  # noqa: SLF001
        for uid in sorted(owners)[:3]:  # some owners are known agents, the others are not
            t, f, a = uid.split("/", 2)
            db.execute("INSERT INTO agents (agent_uid, tenant, fleet, agent, trust, roles) VALUES (%s, %s, %s, %s, 1, "
                       "'[\"r\"]') ON CONFLICT DO NOTHING", (uid, t, f, a))
    key_id = None
    if key != "none":
        rec, _ = pg_ledger.create_key("agent", "t", "f", "kk", 1)
        key_id = rec.key_id if key != "unknown" else "nosuchkey"
        if key == "revoked":
            pg_ledger.revoke_key(rec.key_id)
    reader = visibility_reader(p, "tenant" if wide else "scope")
    want_ids = pg_ledger.visible_row_ids("chroma", collection, p.tenant, reader, limit)
    if asynchronous:
        async def both() -> Any:
            try:
                return await pg_ledger.visible_rows_async("chroma", collection, p.tenant, reader, limit, key_id)
            finally:
                await pg_ledger.aclose()
        got = asyncio.run(both())
    else:
        got = pg_ledger.visible_rows("chroma", collection, p.tenant, reader, limit, key_id)
    if want_ids is None:
        assert got is None
        return
    assert got is not None
    ids, got_rows, got_owners, key_ok = got
    assert sorted(ids) == sorted(want_ids) and len(ids) == len(set(ids))
    want_rows, want_owners, want_ok = pg_ledger.read_rows("chroma", collection, want_ids, key_id)
    assert got_rows == want_rows and set(got_rows) == set(ids)
    assert got_owners == want_owners
    assert key_ok == want_ok == (key in ("none", "valid"))
