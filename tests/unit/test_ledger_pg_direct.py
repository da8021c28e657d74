"""`PostgresLedger.read_rows` through libpq's prepared statements on the connection's ``pgconn`` (h25p,
`sidecar.ledger.pg_direct`) and through the public path that ``MEMWARDEN_LEDGER_PG_DIRECT=off`` selects
(``Cursor.execute(..., prepare=True)``), each against the cursor read the direct path replaced
(`tests.unit.postgres_direct_reference`), on a real PostgreSQL: over generated ids, keys, backends and collection
ids (absent, duplicated, empty, non-ASCII, quotes, braces, backslashes, NUL, lone surrogates, long, not ``str``)
the same rows, owners and key answer, or the same exception class, with the setting on and off; the direct
statements prepared once per connection and prepared again when the session lost them (``DEALLOCATE ALL``, sent by
psycopg after a rollback when it has prepared statements of its own); with the setting off, none of them and
psycopg's own prepared from the first read; a closed connection fails as the cursor does
(`psycopg.OperationalError`); a psycopg without the internals used (at import, found before the first statement,
or failing in the first read) makes the ledger fall back to the public path, logged once, with the same answers."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import importlib.util
import sys

from structlog.testing import capture_logs

from sidecar.governance import Row
from sidecar.ledger import pg_direct, postgres
from sidecar.ledger.pg_direct import text_array as _text_array
from sidecar.ledger.postgres import PostgresLedger
from sidecar.ledger.sql import N_ROW_COLUMNS as _N_ROW_COLUMNS, ROW_COLUMNS as _ROW_COLUMNS, row_to_db as _row_to_db
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)
from tests.unit.postgres_direct_reference import reference_read_rows

STORED = ["r0", "r1", 'a"b', "{x}", "NULL", "", "é😀", "a,b", "\\", " s ", "x" * 300]
ODD = st.sampled_from(STORED + ["absent", "a\x00b", "\ud800", "\u2028", "ǅ", "ß"])
IDS = st.lists(ODD | st.text(max_size=8) | st.sampled_from([5, None, b"r0", ["r0"]]), max_size=8)
KEYS = st.sampled_from(["valid", "revoked", "unknown", None, "nul", "surrogate", "int"])
NAMES = st.sampled_from(["c", "chroma"]) | st.text(max_size=4) | st.sampled_from(["a\x00", "\udfff", 3])


_direct_params = postgres._DIRECT_SHAPE.params  # noqa: SLF001
_MW_STATEMENTS = {"mw_read_one_row", "mw_read_rows"}


@pytest.fixture(scope="module", params=[True, False], ids=["pg_direct=on", "pg_direct=off"])
def ledger(pg_url: str, request: pytest.FixtureRequest) -> Iterator[PostgresLedger]:  # noqa: F811
    led = PostgresLedger(pg_url, schema=fresh_schema(), min_size=0, max_size=2, direct=request.param)
    assert (led._direct is not None) is request.param  # noqa: SLF001
    led.create_key("agent", "t", "f", "a", 1, roles=("reviewer",))
    with led._tx() as db:  # noqa: SLF001
        for i, row_id in enumerate(STORED):
            row = Row("chroma", "c", row_id, "t", "f", "t/f/a" if i % 2 else "u/f/z", "agent", "t/f/a", i,
                      readers=("t/f/b",), extra={"n": i})
            db.execute(f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join(['%s'] * _N_ROW_COLUMNS)})",
                       list(_row_to_db(row, 7)))
    valid = led.create_key("agent", "t", "f", "k", 1)[0].key_id
    revoked = led.create_key("agent", "t", "f", "r", 1)[0].key_id
    led.revoke_key(revoked)
    led.test_keys = {"valid": valid, "revoked": revoked, "unknown": "0123456789abcdef", None: None,  # type: ignore[attr-defined]
                     "nul": "01234\x00", "surrogate": "\ud800", "int": 7}
    yield led
    led.close()


def _outcome(fn: Any) -> Any:
    try:
        rows, owners, key_ok = fn()
    except Exception as exc:  # noqa: BLE001 - the reference's exception class is the answer
        return type(exc)
    return ({k: dataclasses.astuple(v) + tuple(type(x) for x in dataclasses.astuple(v)) for k, v in rows.items()},
            owners, key_ok, type(key_ok))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=IDS, key=KEYS, backend=NAMES, collection=NAMES)
@example(ids=[], key="valid", backend="chroma", collection="c")
@example(ids=["r0"], key=None, backend="chroma", collection="c")
@example(ids=STORED + STORED, key="revoked", backend="chroma", collection="c")
@example(ids=["r0", "a\x00b"], key="valid", backend="chroma", collection="c")
@example(ids=["\ud800"], key="valid", backend="chroma", collection="c")
@example(ids=["r1"], key="nul", backend="chroma", collection="c")
@example(ids=["r1"], key="valid", backend="chroma", collection="a\x00")
def test_direct_read_answers_as_the_cursor(ledger: PostgresLedger, ids: list[Any], key: Any, backend: Any,
                                           collection: Any) -> None:
    key_id = ledger.test_keys[key]  # type: ignore[attr-defined]
    if backend in ("c", "chroma") and collection in ("c", "chroma"):
        backend, collection = "chroma", "c"  # most examples read stored rows
    expected = _outcome(lambda: reference_read_rows(ledger, backend, collection, ids, key_id))
    assert _outcome(lambda: ledger.read_rows(backend, collection, ids, key_id)) == expected


def test_odd_arguments_take_the_cursor() -> None:
    assert _direct_params("k", "chroma", "c", ["a"]) is not None
    assert _direct_params(None, "chroma", "c", []) is not None
    for args in [("k\x00", "chroma", "c", ["a"]), ("k", "chroma", "c\x00", ["a"]), ("k", "chroma", "c", ["a\x00"]),
                 (5, "chroma", "c", ["a"]), ("k", "chroma", "c", [5]), ("k", "chroma", "c", ["\ud800"]),
                 ("\ud800", "chroma", "c", ["a"]), ("k", b"chroma", "c", ["a"]), ("k", "chroma", "c", [None])]:
        assert _direct_params(*args) is None, args


@given(st.lists(st.text(max_size=6).filter(lambda s: "\x00" not in s).map(lambda s: s.encode("utf-8", "surrogatepass")),
                max_size=6))
def test_text_array_is_psycopgs_binary_array(items: list[bytes]) -> None:
    """The binary ``text[]`` is what psycopg's binary list dumper makes of the same strings (one dimension, no
    NULLs, lower bound 1), and an empty array carries the ``text`` element type (the prepared parameter's)."""
    if not items:
        assert _text_array([]) == b"\x00\x00\x00\x00" b"\x00\x00\x00\x00" b"\x00\x00\x00\x19"
        return
    strings = [b.decode("utf-8", "surrogatepass") for b in items]
    if any(0xD800 <= ord(c) <= 0xDFFF for s in strings for c in s):
        return
    tx = psycopg.adapt.Transformer()
    dumper = tx.get_dumper(strings, psycopg.adapt.PyFormat.BINARY)
    assert bytes(dumper.dump(strings)) == _text_array(items)


def _session_statements(ledger: PostgresLedger, conn: Any) -> set[str]:
    return {r["name"] for r in conn.execute("SELECT name FROM pg_prepared_statements").fetchall()}


def test_prepared_once_and_again_after_deallocate_all(ledger: PostgresLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    if ledger._direct is None:  # noqa: SLF001
        pytest.skip("the direct path's own prepared statements (pg_direct=on)")
    prepares: list[tuple[int, bytes]] = []  # (connection, statement name): once per connection
    real = pg_direct._rows

    def counting(conn: Any, statement: Any, params: Any) -> Any:
        before = set(conn.direct_prepared or ())
        try:
            return real(conn, statement, params)
        finally:
            prepares.extend((id(conn), name) for name in sorted(set(conn.direct_prepared or ()) - before))
    monkeypatch.setattr(pg_direct, "_rows", counting)
    pool = ledger._pool  # noqa: SLF001
    key_id = ledger.test_keys["valid"]  # type: ignore[attr-defined]
    expected_one = reference_read_rows(ledger, "chroma", "c", ["r1"], key_id)
    expected_many = reference_read_rows(ledger, "chroma", "c", ["r1", "r0", "absent"], key_id)
    for _ in range(3):
        assert ledger.read_rows("chroma", "c", ["r1"], key_id) == expected_one
        assert ledger.read_rows("chroma", "c", ["r1", "r0", "absent"], key_id) == expected_many
    assert sorted(prepares) == sorted(set(prepares)) and len(prepares) <= 2 * pool.max_size
    # every pooled connection loses its prepared statements, as psycopg's DEALLOCATE ALL does
    conns = [pool.getconn() for _ in range(pool.max_size)]
    try:
        for conn in conns:
            if conn.direct_prepared:
                assert {"mw_read_one_row", "mw_read_rows"} & _session_statements(ledger, conn)
            conn.execute("DEALLOCATE ALL")
            assert not {"mw_read_one_row", "mw_read_rows"} & _session_statements(ledger, conn)
    finally:
        for conn in conns:
            pool.putconn(conn)
    prepares.clear()
    for _ in range(2 * pool.max_size):
        assert ledger.read_rows("chroma", "c", ["r1"], key_id) == expected_one
        assert ledger.read_rows("chroma", "c", ["r1", "r0", "absent"], key_id) == expected_many
    # prepared again where they were lost (asked of the server, whatever the connections' bookkeeping held before:
    # an earlier test may have left every pooled connection prepared), and the reads answered
    conns = [pool.getconn() for _ in range(pool.max_size)]
    try:
        assert any({"mw_read_one_row", "mw_read_rows"} & _session_statements(ledger, conn) for conn in conns)
    finally:
        for conn in conns:
            pool.putconn(conn)


def test_psycopgs_own_rollback_deallocates_and_the_read_recovers(ledger: PostgresLedger) -> None:
    """psycopg prepares a statement after 5 uses; a rollback then sends ``DEALLOCATE ALL`` (ours go too)."""
    pool = ledger._pool  # noqa: SLF001
    key_id = ledger.test_keys["valid"]  # type: ignore[attr-defined]
    expected = reference_read_rows(ledger, "chroma", "c", ["r1"], key_id)
    conns = [pool.getconn() for _ in range(pool.max_size)]
    try:
        for conn in conns:
            for _ in range(7):
                conn.execute("SELECT 1 WHERE %s::text IS NOT NULL", ("x",))  # prepared by psycopg
            conn.autocommit = False
            conn.execute("SELECT 1")
            conn.rollback()
            conn.autocommit = True
    finally:
        for conn in conns:
            pool.putconn(conn)
    for _ in range(2 * pool.max_size):
        assert ledger.read_rows("chroma", "c", ["r1"], key_id) == expected


def test_a_closed_connection_fails_as_the_cursor_does(ledger: PostgresLedger) -> None:
    if ledger._direct is None:  # noqa: SLF001
        pytest.skip("the direct read on a closed connection (pg_direct=on)")
    pool = ledger._pool  # noqa: SLF001
    conn = pool.getconn()
    try:
        conn.pgconn.finish()  # the server went away under a checked-out connection
        with pytest.raises(psycopg.OperationalError):
            ledger._direct.rows(conn, *_direct_params(None, "chroma", "c", ["r1"]))  # type: ignore[misc]  # noqa: SLF001
    finally:
        pool.putconn(conn)
    assert ledger.read_rows("chroma", "c", ["r1"], None)[0]  # the pool replaced it


def test_off_prepares_psycopgs_statements_from_the_first_read_and_none_of_ours(ledger: PostgresLedger) -> None:
    """With the setting off, a read of exact ``str`` arguments is prepared by psycopg from its first use (the
    server-side plan reuse the direct path has), under psycopg's names; the direct path's names never appear."""
    if ledger._direct is not None:  # noqa: SLF001
        pytest.skip("pg_direct=off")
    pool = ledger._pool  # noqa: SLF001
    key_id = ledger.test_keys["valid"]  # type: ignore[attr-defined]
    conns = [pool.getconn() for _ in range(pool.max_size)]
    try:
        for conn in conns:
            conn.execute("DEALLOCATE ALL")
            conn._prepared.clear()  # noqa: SLF001 - psycopg forgets them too (as after its own DEALLOCATE ALL)
    finally:
        for conn in conns:
            pool.putconn(conn)
    expected = reference_read_rows(ledger, "chroma", "c", ["r1"], key_id)
    assert ledger.read_rows("chroma", "c", ["r1"], key_id) == expected  # first use: prepared
    conns = [pool.getconn() for _ in range(pool.max_size)]
    try:
        names = set().union(*(_session_statements(ledger, conn) for conn in conns))
    finally:
        for conn in conns:
            pool.putconn(conn)
    assert names and not names & _MW_STATEMENTS


def test_setting_on_and_off_read_the_same(ledger: PostgresLedger, pg_url: str) -> None:  # noqa: F811
    """Two ledgers on the same tables, one per setting: the same answers for the same reads."""
    other = PostgresLedger(pg_url, schema=ledger.schema, min_size=0, max_size=1, direct=ledger._direct is None)  # noqa: SLF001
    try:
        keys = ledger.test_keys  # type: ignore[attr-defined]
        for ids in ([], ["r1"], ["r0", "r1", "absent", "r0"], STORED, ["a\x00b"], ["\ud800"], [5]):
            for key in (keys["valid"], keys["revoked"], None, keys["nul"]):
                for collection in ("c", "other", "c\x00"):
                    got = _outcome(lambda: ledger.read_rows("chroma", collection, ids, key))
                    assert _outcome(lambda: other.read_rows("chroma", collection, ids, key)) == got, (ids, key)
    finally:
        other.close()


@pytest.fixture()
def direct_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """`pg_direct`'s process-wide state restored after the test; the warnings it logs, captured."""
    monkeypatch.setattr(pg_direct, "_unavailable", None)
    monkeypatch.setattr(pg_direct, "_logged", False)
    with capture_logs() as logs:
        yield logs


def _fallback_reads(ledger: PostgresLedger, fresh: PostgresLedger, logs: list[dict[str, Any]]) -> None:
    key_id = ledger.test_keys["valid"]  # type: ignore[attr-defined]
    for ids in (["r1"], ["r0", "r1", "absent"], ["r1"], []):
        assert fresh.read_rows("chroma", "c", ids, key_id) == reference_read_rows(ledger, "chroma", "c", ids, key_id)
    assert fresh._direct is None  # noqa: SLF001
    assert pg_direct.unavailable()
    warnings = [e for e in logs if e["event"] == "psycopg_direct_unavailable"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning", logs
    # a later ledger of the process starts on the public path, and nothing more is logged
    later = PostgresLedger(fresh._url, schema=ledger.schema, min_size=0, max_size=1)  # noqa: SLF001
    try:
        assert later._direct is None  # noqa: SLF001
        assert later.read_rows("chroma", "c", ["r1"], key_id) == reference_read_rows(ledger, "chroma", "c", ["r1"], key_id)
    finally:
        later.close()
    assert len([e for e in logs if e["event"] == "psycopg_direct_unavailable"]) == 1


def test_a_missing_internal_found_before_the_first_read_falls_back(
        ledger: PostgresLedger, pg_url: str, direct_state: list[dict[str, Any]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection without an attribute the direct read uses (as a psycopg that renamed ``Connection.wait``
    would have): found before anything is sent; the read and every later one take the public path."""
    monkeypatch.setattr(pg_direct, "_CONN_ATTRS", (*pg_direct._CONN_ATTRS, "wait_renamed"))  # noqa: SLF001
    fresh = PostgresLedger(pg_url, schema=ledger.schema, min_size=0, max_size=1)
    try:
        assert fresh._direct is not None  # noqa: SLF001
        _fallback_reads(ledger, fresh, direct_state)
        assert "wait_renamed" in (pg_direct.unavailable() or "")
    finally:
        fresh.close()


def test_an_attribute_error_in_the_first_direct_read_falls_back(
        ledger: PostgresLedger, pg_url: str, direct_state: list[dict[str, Any]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first direct read failing with ``AttributeError`` (an internal changed shape): that read is answered on
    the public path, on a connection of the pool (the one left mid-statement is discarded by the pool)."""
    def changed(pgconn: Any) -> Any:
        raise AttributeError("'PGconn' object has no attribute 'get_result_renamed'")
    monkeypatch.setattr(pg_direct, "_pq_execute", changed)
    fresh = PostgresLedger(pg_url, schema=ledger.schema, min_size=0, max_size=1)
    try:
        _fallback_reads(ledger, fresh, direct_state)
        assert "AttributeError" in (pg_direct.unavailable() or "")
        assert fresh.read_rows("chroma", "c", ["r0"], None)[0]  # the pool still serves
    finally:
        fresh.close()


def test_a_psycopg_without_the_internal_modules_is_found_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """``psycopg.generators`` missing (a copy of the module imported with it hidden): the import succeeds, and the
    module says the direct path is unavailable, naming the ImportError."""
    monkeypatch.setitem(sys.modules, "psycopg.generators", None)
    spec = importlib.util.spec_from_file_location("pg_direct_without_generators", pg_direct.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert "ImportError" in (copy.unavailable() or "") or "ModuleNotFoundError" in (copy.unavailable() or "")
    assert copy.DirectReads("SELECT %(key)s, %(backend)s, %(collection)s, %(ids)s", "SELECT %(ids)b, %(key)s, "
                            "%(backend)s, %(collection)s").params(None, "b", "c", ["x"]) is not None
