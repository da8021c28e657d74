"""Rows of a backend answer orjson decoded (`sidecar.stages.forward.decode_exact`) are checked for nesting only
(`sidecar.stages.canonicalize.nests_within`): against the full check they replace (`well_formed`, unchanged, the
reference) on generated JSON values decoded by orjson, at every depth limit around their nesting; `ChromaProfile._rows`
with ``exact`` against the per-row reference of test_chroma_rows_fast; and `Upstream.call` reports ``exact`` only
for a body orjson decoded (a backend's ``NaN`` is decoded by the standard library and still checked in full)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sidecar.backends.chroma import ChromaProfile
from sidecar.exchange import Exchange
from sidecar.stages.canonicalize import nests_within, well_formed
from sidecar.stages.forward import Upstream, decode, decode_exact
from tests.unit.test_chroma_rows_fast import MAX_DEPTH, reference_rows

# JSON values only (what a backend's valid JSON decodes to): strings with brackets and escapes, long lists of
# scalars and of containers (the bulk skip), big and small numbers.
scalars = (st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from(["a", "é", "[{", "\\u0000", "\ud83d\ude00", ""]) | st.text(max_size=4))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=12) | st.dictionaries(
    st.sampled_from(["k", "mw_x", "[", "é"]), inner, max_size=4), max_leaves=30)


def nested(value: Any, levels: int, as_list: bool) -> Any:
    for _ in range(levels):
        value = [value] * 9 if as_list else {"d": value}
    return value


@settings(max_examples=500, deadline=None)
@given(values, st.integers(0, 4), st.booleans())
def test_nests_within_is_well_formed_for_orjson_values(value: Any, extra: int, as_list: bool) -> None:
    decoded = orjson.loads(json.dumps(nested(value, extra, as_list)))
    for limit in range(0, 10):
        assert nests_within(decoded, limit) is well_formed(decoded, limit), limit


def test_nests_within_counts_every_level() -> None:
    assert nests_within(1, 0) and nests_within("x", 0) and not nests_within([], 0) and nests_within([], 1)
    for levels in range(1, 6):
        for shape in ([1.0] * 20, {"a": 1}, [[]], [{} for _ in range(12)]):
            value = nested(shape, levels, True)
            depth = levels + (2 if shape == [[]] else 1) + (1 if isinstance(shape, list) and shape and isinstance(shape[0], dict) else 0)
            assert nests_within(value, depth) and not nests_within(value, depth - 1)
            assert well_formed(value, depth) and not well_formed(value, depth - 1)


ids = st.sampled_from(["r1", "r2", "", "x"]) | st.none() | st.integers(0, 2)


@st.composite
def results(draw: Any) -> tuple[dict[str, Any], int]:
    n = draw(st.integers(0, 12))
    resp: dict[str, Any] = {}
    if draw(st.integers(0, 9)) > 0:
        resp["ids"] = draw(st.lists(ids, min_size=n, max_size=n)) if draw(st.booleans()) else [f"r{i}" for i in range(n)]
    for name in draw(st.lists(st.sampled_from(["documents", "metadatas", "distances", "embeddings", "uris", "included"]),
                              unique=True)):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            resp[name] = None
        elif kind == 1:
            resp[name] = draw(st.lists(values, max_size=n + 2))
        elif kind == 2:
            resp[name] = [[draw(st.sampled_from([0.1, 0.2, 1e300])) for _ in range(draw(st.integers(0, 12)))] for _ in range(n)]
        else:
            resp[name] = draw(st.lists(values, min_size=n, max_size=n))
    if draw(st.booleans()) and n:  # a deep value at exactly, or past, the limit, in one row
        deep: Any = draw(scalars)
        for _ in range(draw(st.integers(MAX_DEPTH - 2, MAX_DEPTH + 2))):
            deep = {"k": deep} if draw(st.booleans()) else [deep] * draw(st.sampled_from([1, 10]))
        at = draw(st.integers(0, n - 1))
        resp["metadatas"] = [deep if i == at else {"mw_scope": "tenant", "mw_fleet": "red"} for i in range(n)]
    return orjson.loads(json.dumps(resp)), n


@settings(max_examples=500, deadline=None)
@given(results())
def test_exact_rows_agree_with_the_reference(case: tuple[dict[str, Any], int]) -> None:
    resp, n = case
    profile = SimpleNamespace(settings=SimpleNamespace(max_json_depth=MAX_DEPTH))
    out = {}
    for side, fn in (("new", lambda ex: ChromaProfile._rows(profile, ex, resp, n, True)),  # type: ignore[arg-type]
                     ("old", lambda ex: reference_rows(ex, resp, n))):
        ex = Exchange("POST", "/", request_id="r")
        with capture_logs() as logs:
            rows = fn(ex)
        out[side] = ([list(r.items()) for r in rows], ex.rows_malformed, logs)
    assert repr(out["new"]) == repr(out["old"])


@pytest.mark.parametrize("body, exact", [(b'{"a": [1.5, "x"]}', True), (b'{"a": NaN}', False), (b'[1e999]', False),
                                         (b'["\\ud800"]', False), (b'123456789012345678901234567890', True)])
def test_decode_exact_reports_orjson(body: bytes, exact: bool) -> None:
    value, by_orjson = decode_exact(body)
    assert by_orjson is exact
    assert repr(value) == repr(decode(body)) == repr(json.loads(body)) or exact


def test_upstream_call_appends_exact_only_for_an_orjson_answer() -> None:
    answers = {"/ok": (200, b'{"ids": ["a"]}'), "/nan": (200, b'{"ids": [NaN]}'), "/empty": (200, b""),
               "/bad": (500, b'{}'), "/client": (404, b'{"error": "x"}'), "/junk": (200, b"{")}

    def reply(request: httpx.Request) -> httpx.Response:
        status, content = answers[request.url.path]
        return httpx.Response(status, content=content)

    async def main() -> dict[str, Any]:
        up = Upstream("http://backend:9", timeout_s=5, max_connections=1, transport=httpx.MockTransport(reply))
        seen: dict[str, Any] = {}
        for path in answers:
            exact: list[bool] = []
            try:
                value = await up.call("POST", [path[1:]], json_body={}, exact=exact)
                seen[path] = (repr(value), exact)
            except Exception as exc:  # noqa: BLE001 - the error type is what is compared
                seen[path] = (type(exc).__name__, exact)
        return seen
    assert asyncio.run(main()) == {
        "/ok": ("{'ids': ['a']}", [True]), "/nan": ("{'ids': [nan]}", [False]), "/empty": ("None", []),
        "/bad": ("BackendServerError", []), "/client": ("BackendClientError", []), "/junk": ("UpstreamError", [])}


@pytest.mark.parametrize("bad", ["NaN", "Infinity", '"\\ud800"'])
def test_a_row_orjson_refuses_is_still_dropped_alone(tmp_path: Any, bad: str) -> None:
    """A backend answer orjson refuses (one row's ``NaN``, ``Infinity`` or lone surrogate, and no other reason to
    check rows one by one) is decoded by the standard library and checked in full: that row alone is dropped,
    on get and on query."""
    from tests.unit.test_malformed_rows import CID, app, governed, malformed_count

    ids = ["ok1", "bad", "ok2"]
    metas = '[{"mw_scope": "tenant", "mw_fleet": "red"}, {"x": %s}, {"mw_scope": "tenant", "mw_fleet": "red"}]' % bad

    def reply(request: httpx.Request) -> httpx.Response:
        asked = json.loads(request.content)
        if request.url.path.endswith("/get") and "documents" in (asked.get("include") or []):
            # the content of the rows a read serves (its second phase), by their ids: those rows, as Chroma answers
            body = json.dumps({"ids": asked["ids"], "documents": ["doc"] * len(asked["ids"]),
                               "metadatas": [{"mw_scope": "tenant", "mw_fleet": "red"}] * len(asked["ids"])})
        elif request.url.path.endswith("/get"):
            body = '{"ids": %s, "metadatas": %s, "documents": ["a", "b", "c"], "included": ["metadatas"]}' % (
                json.dumps(ids), metas)
        else:
            body = '{"ids": [%s], "metadatas": [%s], "distances": [[0.1, 0.2, 0.3]], "documents": [["a", "b", "c"]], ' \
                   '"included": ["metadatas", "distances"]}' % (json.dumps(ids), metas)
        return httpx.Response(200, content=body.encode(), headers={"content-type": "application/json"})

    client, ledger, key, metrics = app(tmp_path, "chroma", reply)
    governed(ledger, "chroma", CID, ids)
    base = f"/api/v2/tenants/t/databases/db/collections/{CID}"
    got = client.post(f"{base}/get", json={}, headers={"X-API-Key": key})
    assert got.status_code == 200, got.text
    assert got.json()["ids"] == ["ok1", "ok2"]
    queried = client.post(f"{base}/query", json={"query_embeddings": [[0.1]], "n_results": 5}, headers={"X-API-Key": key})
    assert queried.status_code == 200, queried.text
    assert queried.json()["ids"] == [["ok1", "ok2"]]
    assert malformed_count(metrics) == 2
