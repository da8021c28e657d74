"""The PostgreSQL ledger's hot-path read (`PostgresLedger.read_rows` / `read_rows_async`: plain tuples read
by position through `_row_from_tuple`) against the reference — the same `_READ_ROWS` statement on a
``dict_row`` cursor, each row built by name through `_row_from_db` and each owner's roles parsed as JSON —
on a real PostgreSQL: rows with every field populated and empty, owners the ledger knows (with roles) and
does not, ids that are absent, and keys valid, revoked, unknown or not checked."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.governance import Row, agent_entity
from sidecar.ledger.postgres import _READ_ROWS, PostgresLedger
from sidecar.ledger.sql import N_ROW_COLUMNS as _N_ROW_COLUMNS, ROW_COLUMNS as _ROW_COLUMNS, row_from_db as _row_from_db, row_to_db as _row_to_db
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

# PostgreSQL text holds neither NUL nor lone surrogates
chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
text = st.text(chars, max_size=10)
opt_text = st.none() | text
names = st.lists(st.text(chars, min_size=1, max_size=6), max_size=3).map(tuple)
json_value = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | text,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                          max_leaves=6)
OWNERS = ["t/f/a", "t/f/b", "t/g/c", "u/f/a"]  # the first three are agents the ledger knows (below)
rows = st.builds(
    Row, backend=st.just("chroma"), collection=st.just("c"), row_id=text, tenant=text, fleet=text,
    owner=st.sampled_from(OWNERS), scope=st.sampled_from(["agent", "fleet", "tenant", "restricted"]), writer=text,
    created_at=st.integers(0, 2**62), status=st.sampled_from(["active", "pending", "superseded", "deleted"]),
    readers=names, labels=names, request_id=text, subject=opt_text, predicate=opt_text, object=opt_text,
    extra=st.dictionaries(text, json_value, max_size=3), source=text, single_valued=st.booleans(),
    supersedes=st.none() | st.tuples(text, text), superseded_by=st.none() | st.tuples(text, text),
    superseded_at=st.none() | st.integers(0, 2**62), content_hmac=opt_text)


@pytest.fixture(scope="module")
def ledger(pg_url: str) -> Iterator[PostgresLedger]:  # noqa: F811
    led = PostgresLedger(pg_url, schema=fresh_schema(), min_size=0, max_size=2)
    led.create_key("agent", "t", "f", "a", 1, roles=("reviewer", "x:y"))
    led.create_key("agent", "t", "f", "b", 2)
    led.create_key("agent", "t", "g", "c", 0, roles=("ops",))
    yield led
    led.close()


def reference(ledger: PostgresLedger, collection: str, ids: list[str], key_id: str | None
              ) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
    """`read_rows` as it was: `_READ_ROWS` on the connection's ``dict_row`` factory, rows by name."""
    with ledger._conn() as db:  # noqa: SLF001
        result = db.execute(_READ_ROWS, {"key": key_id, "backend": "chroma", "collection": collection,
                                         "ids": list(dict.fromkeys(ids))}).fetchall()
    out: dict[str, Row] = {}
    owners: dict[str, dict[str, Any]] = {}
    key_ok = bool(result[0]["key_ok"]) if result else key_id is None
    for r in result:
        if r["row_id"] is None:
            continue
        out[r["row_id"]] = _row_from_db(r)
        if r["a_tenant"] is not None:
            owners[r["owner"]] = agent_entity(r["a_tenant"], r["a_fleet"], r["a_agent"], r["a_trust"],
                                              tuple(json.loads(r["a_roles"])))
    return out, owners, key_ok


def same(got: tuple[dict[str, Row], dict[str, Any], bool], expected: tuple[dict[str, Row], dict[str, Any], bool]) -> None:
    assert list(got[0]) == list(expected[0])
    for row_id, row in got[0].items():
        for f in dataclasses.fields(Row):
            a, b = getattr(row, f.name), getattr(expected[0][row_id], f.name)
            assert a == b and type(a) is type(b), (f.name, a, b)
    assert got[1] == expected[1]
    assert got[2] is expected[2]


_collections = itertools.count()


def store(ledger: PostgresLedger, batch: list[Row]) -> str:
    collection = f"c{next(_collections)}"
    with ledger._tx() as db:  # noqa: SLF001
        for row in batch:
            values = list(_row_to_db(row, 7))
            values[1] = collection
            db.execute(f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join(['%s'] * _N_ROW_COLUMNS)}) "
                       "ON CONFLICT DO NOTHING", values)
    return collection


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rows, min_size=1, max_size=6), st.sampled_from(["valid", "revoked", "unknown", None]))
def test_read_rows_agrees_with_the_name_based_read(ledger: PostgresLedger, batch: list[Row], key: str | None) -> None:
    key_id = {"valid": ledger.create_key("agent", "t", "f", "k", 1)[0].key_id, "unknown": "0123456789abcdef",
              None: None}.get(key) if key != "revoked" else None
    if key == "revoked":
        key_id = ledger.create_key("agent", "t", "f", "k", 1)[0].key_id
        ledger.revoke_key(key_id)
    collection = store(ledger, batch)
    ids = [r.row_id for r in batch] + ["absent", batch[0].row_id]
    expected = reference(ledger, collection, ids, key_id)
    assert expected[2] is (key in ("valid", None))
    same(ledger.read_rows("chroma", collection, ids, key_id), expected)
    same(ledger.read_rows("chroma", collection, ["absent"], key_id), reference(ledger, collection, ["absent"], key_id))


def test_read_rows_async_agrees(ledger: PostgresLedger) -> None:
    """The coroutine (psycopg's asynchronous pool) reads the same tuples the same way."""
    full = Row("chroma", "c", "full", "t", "f", "t/f/a", "restricted", "t/f/w", 11, "superseded",
               readers=("t/f/b", "t/f/c"), labels=("pii", "x:y"), request_id="rq", subject="s", predicate="p",
               object="o", extra={"cedar": {"user_id": "u"}, "n": [1, None]}, source="src", single_valued=True,
               supersedes=("c0", "r0"), superseded_by=("c2", "r2"), superseded_at=12, content_hmac="ab" * 32)
    empty = Row("chroma", "c", "empty", "t", "f", "u/f/a", "agent", "t/f/a", 0)
    collection = store(ledger, [full, empty])
    key_id = ledger.create_key("agent", "t", "f", "k", 1)[0].key_id
    ids = ["full", "empty", "absent"]

    async def both() -> tuple[Any, Any]:
        try:
            return (await ledger.read_rows_async("chroma", collection, ids, key_id),
                    await ledger.read_rows_async("chroma", collection, [], None))
        finally:
            await ledger.aclose()

    got, nothing = asyncio.run(both())
    expected = reference(ledger, collection, ids, key_id)
    same(got, expected)
    assert set(got[1]) == {"t/f/a"} and got[1]["t/f/a"]["attrs"]["roles"] == ["reviewer", "x:y"]
    assert nothing == ({}, {}, True)


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the reference's exception class is the answer
        return type(exc)


@pytest.mark.parametrize("extra_ids", [[], ['a"b', "{x}", "NULL", "null", "", " s ", "a,b", "\\", "é😀", "\u2028"],
                                       ["a\x00b"], [5], ["x", 5], [None], ["\ud800"], [["nested"]]])
def test_ids_sent_in_binary_or_as_before(ledger: PostgresLedger, extra_ids: list[Any]) -> None:
    """`read_rows` sends exact ``str`` ids without NUL as a binary ``text[]`` and reads the result in binary: the
    same rows as the reference (text parameters and results, by name), for ids the text array dumper quotes or
    escapes; ids that are not exact ``str`` or hold NUL fail with the same exception class as before."""
    odd = Row("chroma", "c", 'a"b', "t", "f", "t/f/a", "agent", "t/f/a", 2**62, readers=("t/f/b",))
    plain = Row("chroma", "c", "NULL", "t", "f", "t/f/b", "agent", "t/f/a", 0, superseded_at=-(2**62))
    collection = store(ledger, [odd, plain, Row("chroma", "c", "{x}", "t", "f", "t/g/c", "tenant", "t/g/c", 1)])
    key_id = ledger.create_key("agent", "t", "f", "k", 1)[0].key_id
    ids = ["absent", 'a"b', "NULL", "{x}", *extra_ids]
    expected = _outcome(lambda: reference(ledger, collection, ids, key_id))
    got = _outcome(lambda: ledger.read_rows("chroma", collection, ids, key_id))
    if isinstance(expected, type):
        assert got is expected
    else:
        same(got, expected)

    async def run() -> Any:
        try:
            return await ledger.read_rows_async("chroma", collection, ids, key_id)
        finally:
            await ledger.aclose()

    got_async = _outcome(lambda: asyncio.run(run()))
    if isinstance(expected, type):
        assert got_async is expected
    else:
        same(got_async, expected)
