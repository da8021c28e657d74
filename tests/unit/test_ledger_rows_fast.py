"""The SQLite ledger's positional row construction (`_row_from_tuple`; `SQLiteLedger.get_rows` and its column path)
against the reference: the name-based `_row_from_db` over ``sqlite3.Row`` of the same stored rows, for rows
with every field populated and empty (readers, labels, extra, supersession pairs, content HMAC, NULLs)."""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.governance import Row
from sidecar.ledger.sqlite import SQLiteLedger
from sidecar.ledger.sql import ROW_COLUMNS as _ROW_COLUMNS, N_ROW_COLUMNS as _N_ROW_COLUMNS, row_from_db as _row_from_db, row_from_tuple as _row_from_tuple, row_to_db as _row_to_db

text = st.text(max_size=12)
opt_text = st.none() | text
names = st.lists(st.text(min_size=1, max_size=8), max_size=4).map(tuple)
json_value = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=6),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                          max_leaves=6)
extras = st.dictionaries(st.text(max_size=6), json_value, max_size=3)
pairs = st.none() | st.tuples(text, text)
rows = st.builds(
    Row, backend=st.sampled_from(["chroma", "mem0"]), collection=st.just("c"), row_id=text, tenant=text, fleet=text,
    owner=text, scope=st.sampled_from(["agent", "fleet", "tenant", "restricted"]), writer=text,
    created_at=st.integers(0, 2**62), status=st.sampled_from(["active", "pending", "superseded", "deleted"]),
    readers=names, labels=names, request_id=text, subject=opt_text, predicate=opt_text, object=opt_text, extra=extras,
    source=text, single_valued=st.booleans(), supersedes=pairs, superseded_by=pairs,
    superseded_at=st.none() | st.integers(0, 2**62), content_hmac=opt_text)


def _reference(db: sqlite3.Connection, backend: str, ids: list[str]) -> dict[str, Row]:
    """`get_rows` as it was: ``sqlite3.Row`` read by name through `_row_from_db`."""
    db.row_factory = sqlite3.Row
    q = f"SELECT {_ROW_COLUMNS} FROM rows WHERE backend = ? AND collection_id = 'c' AND row_id IN ({','.join('?' * len(ids))})"
    return {r["row_id"]: _row_from_db(r) for r in db.execute(q, (backend, *ids))}


def _insert(ledger: SQLiteLedger, values: list[tuple[Any, ...]]) -> None:
    with ledger._tx() as db:
        for v in values:
            db.execute(f"INSERT OR REPLACE INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * _N_ROW_COLUMNS)})", v)


def _compare(ledger: SQLiteLedger, backend: str, ids: list[str]) -> None:
    new = ledger.get_rows(backend, "c", ids)
    ref = _reference(ledger._db, backend, ids)
    assert list(new) == list(ref)
    for row_id, row in new.items():
        expected = ref[row_id]
        for f in dataclasses.fields(Row):
            a, b = getattr(row, f.name), getattr(expected, f.name)
            assert a == b and type(a) is type(b), (f.name, a, b)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rows, min_size=1, max_size=6))
def test_get_rows_agrees_with_name_based_construction(batch: list[Row]) -> None:
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, [_row_to_db(r, 7) for r in batch])
        for backend in ("chroma", "mem0"):
            _compare(ledger, backend, [r.row_id for r in batch] + ["absent"])
    finally:
        ledger.close()


def test_every_field_populated_and_empty_and_null() -> None:
    """Hand-written extremes, stored as raw column values: empty JSON, populated JSON, NULLs in every nullable
    column, a supersession pair with a NULL collection half, non-string ids (``str`` as before)."""
    ledger = SQLiteLedger(":memory:")
    try:
        full = _row_to_db(Row("chroma", "c", "full", "t", "f", "t/f/a", "restricted", "t/f/w", 11, "superseded",
                              readers=("t/f/b", "t/f/c"), labels=("pii", "x:y"), request_id="rq", subject="s",
                              predicate="p", object="o", extra={"cedar": {"user_id": "u"}, "n": [1, 2.5, None]},
                              source="src", single_valued=True, supersedes=("c0", "r0"), superseded_by=("c2", "r2"),
                              superseded_at=12, content_hmac="ab" * 32), 13)
        empty = _row_to_db(Row("chroma", "c", "empty", "t", "f", "t/f/a", "agent", "t/f/a", 0), 0)
        half = list(empty)
        half[2], half[20], half[21], half[22], half[23] = "half", None, 5, None, "r9"  # ids with NULL collection halves
        spaced = list(empty)
        spaced[2], spaced[7], spaced[8], spaced[17] = "spaced", "[ ]", '["a"]', '{ }'  # JSON not as we write it
        _insert(ledger, [full, empty, tuple(half), tuple(spaced)])
        _compare(ledger, "chroma", ["full", "empty", "half", "spaced", "full"])
        got = ledger.get_rows("chroma", "c", ["full", "empty"])
        assert got["full"].readers == ("t/f/b", "t/f/c") and got["full"].supersedes == ("c0", "r0")
        assert got["empty"].readers == () and got["empty"].extra == {} and got["empty"].supersedes is None
        a, b = ledger.get_rows("chroma", "c", ["empty"])["empty"], ledger.get_rows("chroma", "c", ["empty"])["empty"]
        assert a.extra is not b.extra  # a fresh dict per row: a caller may change its row's extra
        assert _row_from_tuple(tuple(full)) == _row_from_db(dict(zip([c.strip() for c in _ROW_COLUMNS.split(",")], full)))
    finally:
        ledger.close()


def test_the_connection_keeps_named_rows() -> None:
    """`get_rows` reads tuples on a cursor of its own; every other statement still gets ``sqlite3.Row``."""
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, [_row_to_db(Row("chroma", "c", "r", "t", "f", "t/f/a", "agent", "t/f/a", 0), 0)])
        ledger.get_rows("chroma", "c", ["r"])
        assert ledger.active_fact("chroma", "t", "s", "p") is None
        assert isinstance(ledger._db.execute("SELECT 1 AS one").fetchone(), sqlite3.Row)
    finally:
        ledger.close()
