"""Deletion closure (`Ledger.tombstone`) and lineage (`Ledger.lineage`) read the lineage graph in one statement
(``WITH RECURSIVE``) on both ledgers, and answer exactly what the node-by-node walk they replaced answered: the
same nodes in the same (breadth-first) order, the same parents, the same rows — on a deep chain of 200
derivations, a wide fan-out with diamonds, cycles, and random graphs. The number of statements a call runs does
not grow with the graph (a connection trace: sqlite3's trace callback, libpq's protocol trace)."""

from __future__ import annotations

import random
import tempfile
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from sidecar.governance import Row
from sidecar.ledger import SQLiteLedger, open_ledger
from sidecar.ledger.sql import ROW_COLUMNS, row_from_db
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

Key = tuple[str, str]


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        led: Any = SQLiteLedger(tmp_path / "l.db")
    else:  # one connection: the trace below is on the connection every call uses
        led = open_ledger(request.getfixturevalue("pg_url"), schema=fresh_schema(), min_size=1, max_size=1)
    yield led
    led.close()


def _row(collection: str, row_id: str, parents: tuple[Key, ...] = (), content: str | None = None) -> Row:
    return Row("chroma", collection, row_id, "t", "red", "t/red/a", "fleet", "t/red/a", 1, derived_from=parents,
               content_hmac=content)


def _add(ledger: Any, *rows: Row) -> None:
    for row in rows:  # one at a time: a row may name a parent written later (a cycle)
        assert ledger.reserve_rows([row]) == []
        ledger.activate_rows(row.backend, row.collection, [row.row_id])


def _query(ledger: Any) -> Callable[[str, tuple[Any, ...]], list[Any]]:
    """Run a read on the ledger's own connection (rows by column name)."""
    def q(sql: str, args: tuple[Any, ...]) -> list[Any]:
        with ledger._conn() as db:  # noqa: SLF001
            return list(db.execute(sql, args).fetchall())
    return q


def reference_closure(ledger: Any, backend: str, seeds: list[Key]) -> list[Key]:
    """The closure the ledger computed before, one node at a time: breadth first from `seeds`, the rows derived
    from each node read by their own statement (in collection and id order)."""
    q, p = _query(ledger), ledger.dialect.ph
    order: list[Key] = []
    seen: set[Key] = set()
    queue = deque(seeds)
    while queue:
        key = queue.popleft()
        if key in seen:
            continue
        seen.add(key)
        order.append(key)
        queue += [(r["collection_id"], r["row_id"]) for r in q(
            f"SELECT collection_id, row_id FROM lineage WHERE backend = {p} AND parent_collection_id = {p} "
            f"AND parent_row_id = {p} ORDER BY collection_id, row_id", (backend, *key))]
    return order


def reference_lineage(ledger: Any, backend: str, collection_id: str, row_id: str,
                      max_nodes: int) -> list[tuple[int, Row | None, Key, list[Key]]]:
    """`Ledger.lineage` as it was (`_walk_lineage`): two statements per node."""
    q, p = _query(ledger), ledger.dialect.ph
    out: list[tuple[int, Row | None, Key, list[Key]]] = []
    seen: set[Key] = set()
    frontier: deque[tuple[int, Key]] = deque([(0, (collection_id, row_id))])
    while frontier and len(out) < max_nodes:
        depth, key = frontier.popleft()
        if key in seen:
            continue
        seen.add(key)
        found = q(f"SELECT {ROW_COLUMNS} FROM rows WHERE backend = {p} AND collection_id = {p} AND row_id = {p}",
                  (backend, *key))
        parents = [(r["parent_collection_id"], r["parent_row_id"]) for r in q(
            f"SELECT parent_collection_id, parent_row_id FROM lineage WHERE backend = {p} AND collection_id = {p} "
            f"AND row_id = {p} ORDER BY parent_collection_id, parent_row_id", (backend, *key))]
        out.append((depth, row_from_db(found[0]) if found else None, key, parents))
        frontier += [(depth + 1, p) for p in parents]
    return out


@contextmanager
def statements(ledger: Any) -> Iterator[list[str]]:
    """The statements the ledger runs inside the block, in order: SQLite's trace callback (each statement's text);
    on PostgreSQL libpq's protocol trace of the ledger's one pooled connection (a ``CommandComplete`` per statement,
    and the text of each statement parsed)."""
    out: list[str] = []
    if isinstance(ledger, SQLiteLedger):
        ledger._db.set_trace_callback(out.append)  # noqa: SLF001
        try:
            yield out
        finally:
            ledger._db.set_trace_callback(None)  # noqa: SLF001
        return
    with tempfile.TemporaryFile() as f:
        with ledger._pool.connection() as conn:  # noqa: SLF001  (max_size 1: the connection the ledger uses)
            conn.pgconn.trace(f.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            yield out
        finally:
            with ledger._pool.connection() as conn:  # noqa: SLF001
                conn.pgconn.untrace()
        f.seek(0)
        lines = f.read().decode("utf-8", "replace").splitlines()
    texts = [line.split("\t", 3)[3] for line in lines if line.startswith("F\t") and line.split("\t")[2] in ("Parse", "Query")]
    done = [line for line in lines if line.startswith("B\t") and line.split("\t")[2] == "CommandComplete"]
    # The trace block itself took the connection twice (no statement); each statement completes once.
    out += texts if len(texts) == len(done) else texts + ["<prepared>"] * (len(done) - len(texts))


def _chain(n: int, collection: str = "c1") -> list[Row]:
    rows = [_row(collection, "r0", content="h0")]
    rows += [_row(collection, f"r{i}", ((collection, f"r{i - 1}"),), content=f"h{i}") for i in range(1, n)]
    return rows


def test_a_chain_of_200_derivations_in_one_statement(ledger: Any) -> None:
    _add(ledger, *_chain(200), _row("c1", "other"))
    expected = reference_lineage(ledger, "chroma", "c1", "r199", 1000)
    with statements(ledger) as walk:
        got = ledger.lineage("chroma", "c1", "r199")
    assert got == expected and len(got) == 200
    assert [(d, k) for d, _, k, _ in got[:3]] == [(0, ("c1", "r199")), (1, ("c1", "r198")), (2, ("c1", "r197"))]
    assert got[-1][3] == [] and got[-1][1] is not None and got[-1][1].row_id == "r0"
    assert len(walk) == 1 and "WITH RECURSIVE" in walk[0]
    assert ledger.lineage("chroma", "c1", "r199", max_nodes=50) == reference_lineage(ledger, "chroma", "c1", "r199", 50)

    order = reference_closure(ledger, "chroma", [("c1", "r0")])
    with statements(ledger) as deleting:
        closed = ledger.tombstone("chroma", "c1", ["r0"], "t/red/a", "req")
    assert closed == order and len(closed) == 200
    # One statement reads the graph; three write the tombstones, the statuses and the forgotten content.
    assert sum("lineage" in s for s in deleting) == 1 and len(deleting) == _tombstone_statements(ledger)
    rows = ledger.get_rows("chroma", "c1", [f"r{i}" for i in range(200)] + ["other"])
    assert {r.status for k, r in rows.items() if k != "other"} == {"deleted"} and rows["other"].status == "active"
    assert set(ledger.pending_tombstones("chroma")) == set(order)
    assert ledger.forgotten("t", [f"h{i}" for i in range(200)] + ["h-none"]) == {f"h{i}" for i in range(200)}


def _tombstone_statements(ledger: Any) -> int:
    """Statements of one `tombstone` with cascade: BEGIN, the walk, three writes, COMMIT."""
    return 6


def test_a_wide_fan_out_with_diamonds(ledger: Any) -> None:
    root = _row("c1", "root", content="h-root")
    children = [_row("c1" if i % 2 else "c2", f"k{i:03d}", (("c1", "root"),)) for i in range(300)]
    grandchildren = [_row("c3", f"g{i:03d}", ((children[i].collection, children[i].row_id),
                                              (children[(i + 1) % 300].collection, children[(i + 1) % 300].row_id)))
                     for i in range(300)]
    _add(ledger, root, *children, *grandchildren)
    expected = reference_closure(ledger, "chroma", [("c1", "root")])
    with statements(ledger) as deleting:
        closed = ledger.tombstone("chroma", "c1", ["root"], "t/red/a", "req")
    assert closed == expected and len(closed) == 601 and closed[0] == ("c1", "root")
    assert sum("lineage" in s for s in deleting) == 1 and len(deleting) == _tombstone_statements(ledger)
    for key in (("c3", "g007"), ("c2", "k000")):
        assert ledger.lineage("chroma", *key) == reference_lineage(ledger, "chroma", *key, 1000)
    lineage = ledger.lineage("chroma", "c3", "g007")
    assert [k for _, _, k, _ in lineage] == [("c3", "g007"), ("c1", "k007"), ("c2", "k008"), ("c1", "root")]


def test_a_single_row_takes_as_many_statements_as_a_graph(ledger: Any) -> None:
    _add(ledger, _row("c1", "alone", content="h"))
    with statements(ledger) as one:
        assert ledger.tombstone("chroma", "c1", ["alone"], "t/red/a", "req") == [("c1", "alone")]
    assert len(one) == _tombstone_statements(ledger)
    with statements(ledger) as walk:
        [(depth, row, key, parents)] = ledger.lineage("chroma", "c1", "alone")
    assert (depth, key, parents) == (0, ("c1", "alone"), []) and row is not None and row.status == "deleted"
    assert len(walk) == 1


def test_cycles_end(ledger: Any) -> None:
    """The schema does not forbid a cycle (a row may name a parent written after it); both walks end, each node
    once."""
    _add(ledger, _row("c1", "a", (("c1", "b"),)), _row("c1", "b", (("c1", "a"),)),
         _row("c1", "self", (("c1", "self"),)), _row("c1", "tail", (("c1", "b"),)))
    for key in (("c1", "a"), ("c1", "b"), ("c1", "self"), ("c1", "tail")):
        assert ledger.lineage("chroma", *key) == reference_lineage(ledger, "chroma", *key, 1000)
    assert [k for _, _, k, _ in ledger.lineage("chroma", "c1", "a")] == [("c1", "a"), ("c1", "b")]
    assert [p for _, _, _, p in ledger.lineage("chroma", "c1", "self")] == [[("c1", "self")]]
    expected = reference_closure(ledger, "chroma", [("c1", "a")])
    assert ledger.tombstone("chroma", "c1", ["a"], "t/red/a", "req") == expected == [("c1", "a"), ("c1", "b"), ("c1", "tail")]
    assert ledger.tombstone("chroma", "c1", ["self"], "t/red/a", "req") == [("c1", "self")]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_graphs_agree_with_the_node_by_node_walk(ledger: Any, seed: int) -> None:
    """Random graphs of 80 nodes in three collections (cycles and missing parents included), several seeds and
    `also` rows: the same closure and lineage as the walk one node at a time."""
    rnd = random.Random(seed)
    keys = [(rnd.choice(["c1", "c2", "c3"]), f"n{i:02d}") for i in range(80)]
    rows = []
    for key in keys:
        parents = {rnd.choice(keys) for _ in range(rnd.choice([0, 1, 1, 2, 3]))}
        if rnd.random() < 0.1:
            parents.add(("c9", f"missing{rnd.randrange(5)}"))
        rows.append(_row(*key, tuple(sorted(parents)), content=f"h{rnd.randrange(30)}"))
    _add(ledger, *rows)
    for key in rnd.sample(keys, 10):
        for limit in (1000, 7):
            assert ledger.lineage("chroma", *key, max_nodes=limit) == reference_lineage(ledger, "chroma", *key, limit)
    seeds = rnd.sample(keys, 3)
    collection = seeds[0][0]
    named = [k[1] for k in seeds if k[0] == collection]
    also = [k for k in seeds if k[0] != collection] + [("c9", "missing0")]
    expected = reference_closure(ledger, "chroma", list(dict.fromkeys([(collection, i) for i in named] + also)))
    closed = ledger.tombstone("chroma", collection, named, "t/red/a", "req", also=also)
    assert closed == expected
    deleted = {k for k in keys if ledger.get_rows("chroma", k[0], [k[1]])[k[1]].status == "deleted"}
    assert deleted == {k for k in expected if k in set(keys)}
    assert ledger.forgotten("t", [f"h{i}" for i in range(30)]) == {r.content_hmac for r in rows
                                                                   if (r.collection, r.row_id) in deleted}


def test_odd_ids_are_tombstoned_exactly(ledger: Any) -> None:
    """Ids JSON would not carry exactly (NUL, on SQLite; PostgreSQL text holds none) and ids that need escaping:
    each one tombstoned, its derived row too; a lone surrogate raises and tombstones nothing, as before."""
    odd = ["é😀", 'q"\\x', "[1]"] + (["a\x00b"] if isinstance(ledger, SQLiteLedger) else [])
    _add(ledger, *[_row("c1", i, content=f"h{n}") for n, i in enumerate(odd)],
         *[_row("c2", f"d{n}", (("c1", i),)) for n, i in enumerate(odd)])
    for n, i in enumerate(odd):
        for closure in ("redact", "cascade"):
            expected = reference_closure(ledger, "chroma", [("c1", i)]) if closure == "cascade" else [("c1", i)]
            assert ledger.tombstone("chroma", "c1", [i], "t/red/a", "req", closure=closure) == expected
        assert ledger.get_rows("chroma", "c1", [i])[i].status == "deleted"
        assert ledger.get_rows("chroma", "c2", [f"d{n}"])[f"d{n}"].status == "deleted"
    assert ledger.forgotten("t", [f"h{n}" for n in range(len(odd))]) == {f"h{n}" for n in range(len(odd))}
    with pytest.raises(UnicodeEncodeError):
        ledger.tombstone("chroma", "c1", ["\ud800"], "t/red/a", "req", closure="redact")
