"""`SQLiteLedger.get_rows` (one statement over a JSON array of ids, each row one JSON array) against the
reference: `get_rows` as of fe121ba (`tests/unit/ledger_rows_reference.py`: one ``IN`` statement per 500 ids, 25
columns per row) on the same connection. Rows are stored as raw column values, past `_row_to_db`: any text
(NUL, control characters, astral planes, quotes and backslashes), BLOBs, REALs, infinities and text in the
integer columns, integers at the 64-bit limits, JSON written other than as the ledger writes it and malformed
JSON; ids asked for are stored, absent, of another backend or collection (withheld), repeated, not ``str``,
holding NUL, and more than 500. Same rows, same keys in the same order, every field equal and of the same type,
or the same exception."""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.governance import Row
from sidecar.ledger.sqlite import SQLiteLedger
from sidecar.ledger.sql import N_ROW_COLUMNS as _N_ROW_COLUMNS, ROW_COLUMNS as _ROW_COLUMNS
from tests.unit import ledger_rows_reference as reference

COLUMNS = [c.strip() for c in _ROW_COLUMNS.split(",")]
chars = st.characters(blacklist_categories=("Cs",))  # sqlite3 cannot store a lone surrogate
text = st.text(chars, max_size=12)
big = st.integers(-(2**63), 2**63 - 1)
odd = (st.binary(max_size=4) | st.floats(allow_nan=False) | st.just(float("inf")) | big
       | st.sampled_from(["", "0", "1.5", " 7", "x", "null"]))
names_json = st.sampled_from(["[]", "[ ]", '["a"]', '["t/f/b", "t/f/c"]', '["\\u00e9", "x\\u0000y"]', "[1]", "[",
                              "{}", "null", '"s"', "[[]]"])
extra_json = st.sampled_from(["{}", "{ }", '{"cedar": {"user_id": "u"}}', '{"n": [1, 2.5, null, NaN]}', '{"a": 1, "a": 2}',
                              "[]", "{", "1e400", '{"x": "\\ud800"}'])
ROW_IDS = ["r0", "r1", "r\x00nul", "é", "😀", "0", "5", 'q"\\', "a" * 300, ""]


def _value(column: str, corrupt: bool) -> st.SearchStrategy[Any]:
    """Column values as the ledger may hold them; with `corrupt`, also what only a damaged or hand-edited file
    holds (BLOBs, REALs and text in the integer columns, malformed JSON, ...)."""
    if column in ("backend", "collection_id", "row_id"):
        raise AssertionError(column)
    if column in ("readers", "labels"):
        return names_json | text | st.binary(max_size=3) if corrupt else names_json
    if column == "extra":
        return extra_json | text | st.binary(max_size=3) if corrupt else extra_json
    if column in ("created_at", "updated_at"):
        return big | odd if corrupt else big
    if column == "single_valued":
        return st.integers(-2, 2) | odd if corrupt else st.integers(-2, 2)
    if column in ("superseded_at",):
        return st.none() | big | odd if corrupt else st.none() | big
    if column in ("subject", "predicate", "object", "supersedes_collection", "supersedes_id",
                  "superseded_by_collection", "superseded_by", "content_hmac", "fact_partition"):
        return st.none() | text | odd if corrupt else st.none() | text
    return text | odd if corrupt else text  # NOT NULL text: tenant, fleet, owner, scope, status, writer, request_id, source


def _placed(corrupt: bool) -> st.SearchStrategy[Any]:
    values = st.fixed_dictionaries({c: _value(c, corrupt) for c in COLUMNS if c not in ("backend", "collection_id", "row_id")})
    return st.tuples(st.sampled_from([("chroma", "c"), ("chroma", "c2"), ("mem0", "c")]), st.sampled_from(ROW_IDS) | text, values)


# Mostly batches the JSON form carries (answered in one statement), some with a damaged row (read by columns).
batches = st.lists(_placed(False), max_size=8) | st.lists(_placed(False) | _placed(True), max_size=6)
asked = st.lists(st.sampled_from(ROW_IDS) | text | st.integers(0, 9) | st.just(None) | st.just(b"r0"), max_size=12)


def _insert(ledger: SQLiteLedger, rows: list[tuple[tuple[str, str], Any, dict[str, Any]]]) -> None:
    with ledger._tx() as db:  # noqa: SLF001
        for (backend, collection), row_id, values in rows:
            row = {**values, "backend": backend, "collection_id": collection, "row_id": row_id}
            db.execute(f"INSERT OR REPLACE INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * _N_ROW_COLUMNS)})",
                       tuple(row[c] for c in COLUMNS))


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict | list | tuple):
        return repr(a) == repr(b)  # NaN inside extra: equal text, unequal objects
    return bool(a == b)


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the reference's exception, whatever it is, is the answer
        return type(exc)


def _compare(ledger: SQLiteLedger, backend: Any, collection: Any, ids: list[Any]) -> None:
    ref = _outcome(lambda: reference.get_rows(ledger._db, backend, collection, ids))  # noqa: SLF001
    new = _outcome(lambda: ledger.get_rows(backend, collection, ids))
    if isinstance(ref, type):
        assert new is ref, (ref, new)
        return
    assert isinstance(new, dict), new
    assert list(new) == list(ref)
    for row_id, row in new.items():
        for f in dataclasses.fields(Row):
            a, b = getattr(row, f.name), getattr(ref[row_id], f.name)
            assert _same(a, b), (row_id, f.name, a, b)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches, asked, st.booleans())
def test_get_rows_agrees_with_reference(stored: list[Any], ids: list[Any], with_stored: bool) -> None:
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, stored)
        wanted = ids + ([row_id for _, row_id, _ in stored] if with_stored else [])
        for backend, collection in (("chroma", "c"), ("chroma", "c2"), ("mem0", "c"), ("other", "c")):
            _compare(ledger, backend, collection, wanted)
    finally:
        ledger.close()


def _plain(row_id: str, created_at: int = 1) -> tuple[tuple[str, str], str, dict[str, Any]]:
    values = {c: "x" for c in COLUMNS}
    values.update(readers="[]", labels="[]", extra="{}", created_at=created_at, updated_at=0, single_valued=0,
                  superseded_at=None, subject=None, supersedes_id=None, superseded_by=None)
    return ("chroma", "c"), row_id, {c: v for c, v in values.items() if c not in ("backend", "collection_id", "row_id")}


def test_more_than_500_ids_keep_the_order_of_each_run_of_500() -> None:
    """1,300 distinct ids asked in descending order (with repeats and absent ones): rows come ascending within
    each run of 500 distinct ids, run after run, as the reference's one statement per 500 ids returned them."""
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, [_plain(f"id{i:05d}") for i in range(1200)])
        ids = [f"id{i:05d}" for i in range(1299, -1, -1)] + ["id00001", "id00700"]
        got = ledger.get_rows("chroma", "c", ids)
        assert len(got) == 1200
        _compare(ledger, "chroma", "c", ids)
        _compare(ledger, "chroma", "c", ids[:500])
        _compare(ledger, "chroma", "c", ids[:501])
    finally:
        ledger.close()


@pytest.mark.parametrize("ids", [["r0", "r\x00nul"], ["r0", 5], [10, 9], [5], [1.5], ["r0", "\ud800"], ["r0", None], ["r0", b"r0"]])
def test_ids_the_json_form_cannot_carry(ids: list[Any]) -> None:
    """Ids with NUL, not ``str``, or with a lone surrogate: the same answer, or the same error, as the reference."""
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, [_plain("r0"), _plain("r\x00nul"), _plain("5"), _plain("9"), _plain("10"), _plain("1.5")])
        _compare(ledger, "chroma", "c", ids)
    finally:
        ledger.close()


@pytest.mark.parametrize("created_at", [1.5, 2.0**70, float("inf"), float("-inf"), -0.0, b"\x00", "soon"])
def test_time_columns_the_json_form_cannot_carry(created_at: Any) -> None:
    """A REAL (JSON keeps 15 digits), an infinity, a BLOB or text where a time belongs: the same `Row` or error."""
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, [_plain("r0"), _plain("r1", created_at)])
        _compare(ledger, "chroma", "c", ["r0", "r1"])
        got = ledger.get_rows("chroma", "c", ["r1"])
        assert repr(got["r1"].created_at) == repr(reference.get_rows(ledger._db, "chroma", "c", ["r1"])["r1"].created_at)  # noqa: SLF001
    finally:
        ledger.close()


def test_rows_are_read_now(tmp_path: Any) -> None:
    """Each call reads the ledger as committed now (another connection's change is seen at once), and leaves no
    read transaction open: the connection's ``PRAGMA data_version`` (`cache_version`) still moves."""
    path = tmp_path / "ledger.db"
    ledger = SQLiteLedger(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        _insert(ledger, [_plain("r0")])
        assert ledger.get_rows("chroma", "c", ["r0"])["r0"].status == "x"
        before = ledger.cache_version()
        other.execute("UPDATE rows SET status = 'deleted', scope = 'agent', readers = '[\"t/f/z\"]' WHERE row_id = 'r0'")
        assert ledger.cache_version() != before
        row = ledger.get_rows("chroma", "c", ["r0", "r0"])["r0"]
        assert (row.status, row.scope, row.readers) == ("deleted", "agent", ("t/f/z",))
        other.execute("DELETE FROM rows")
        assert ledger.get_rows("chroma", "c", ["r0"]) == {}
    finally:
        other.close()
        ledger.close()


def test_ledger_rows_take_one_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows as the ledger writes them (every field populated or empty, any text) never take the column path."""
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, [_plain("r0")])
        full = _plain("full")[2] | {
            "tenant": "t\x01\u2028", "readers": '["t/f/b", "é"]', "labels": '["pii"]', "extra": '{"cedar": {"user_id": "u"}}',
            "created_at": -(2**63), "superseded_at": 2**63 - 1, "single_valued": 1, "subject": "s\x00", "supersedes_id": "r9",
            "supersedes_collection": None, "superseded_by": "r8", "superseded_by_collection": "c2", "content_hmac": "ab" * 32}
        _insert(ledger, [(("chroma", "c"), "full", full)])
        expected = reference.get_rows(ledger._db, "chroma", "c", ["full", "r0", "absent"])  # noqa: SLF001
        monkeypatch.setattr(SQLiteLedger, "_get_rows_by_columns", lambda *a: pytest.fail("read by columns"))
        got = ledger.get_rows("chroma", "c", ["full", "r0", "absent", "full"])
        assert list(got) == list(expected) == ["full", "r0"]
        for row_id, row in got.items():
            for f in dataclasses.fields(Row):
                assert _same(getattr(row, f.name), getattr(expected[row_id], f.name)), f.name
    finally:
        ledger.close()


def test_a_batch_longer_than_the_length_limit_is_read_by_columns() -> None:
    """When the one JSON value of a batch is longer than SQLite's length limit (``SQLITE_LIMIT_LENGTH``, 1e9
    bytes by default; lowered here) while each column fits, the rows are read column by column: the same rows
    as the reference, not an error."""
    ledger = SQLiteLedger(":memory:")
    try:
        _insert(ledger, [_plain(f"id{i:03d}") for i in range(60)])
        ids = [f"id{i:03d}" for i in range(60)]
        ledger._db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 2000)  # noqa: SLF001 - one row's JSON ~100 bytes, 60 rows more
        got = ledger.get_rows("chroma", "c", ids)
        assert list(got) == ids
        _compare(ledger, "chroma", "c", ids)
    finally:
        ledger.close()
