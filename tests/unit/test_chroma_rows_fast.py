"""`ChromaProfile._rows` (columns to rows, malformed rows dropped) against the code it replaced, kept here
as the reference: per-row `well_formed_rows` over the old `_columns_to_rows`. Same rows (keys in the same
order), same ``rows_malformed`` and the same log line, on generated results: ids of every type, nesting
around the depth limit, non-finite floats, lone surrogates, columns of other lengths, ``included``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sidecar.backends.chroma import BACKEND, ChromaProfile, _columns_to_rows
from sidecar.exchange import Exchange
from sidecar.stages.authorize import well_formed_rows

MAX_DEPTH = 3  # MEMWARDEN_MAX_JSON_DEPTH of the profile under test: rows nest up to 4 levels


def reference_columns_to_rows(resp: dict[str, Any], n: int) -> list[dict[str, Any]]:
    cols = {k: v for k, v in resp.items() if isinstance(v, list) and len(v) == n and k != "included"}
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


def reference_rows(ex: Exchange, resp: dict[str, Any], n: int) -> list[dict[str, Any]]:
    return well_formed_rows(ex, BACKEND, reference_columns_to_rows(resp, n), lambda r: r.get("ids"), MAX_DEPTH + 1)


class Text(str):
    pass


scalars = (st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.5, float("nan"), float("inf"), -0.0])
           | st.sampled_from(["a", "é", "\ud800", ""]) | st.builds(Text, st.sampled_from(["t", "\udc00"])))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=10) | st.dictionaries(
    st.sampled_from(["k", "mw_x", "\ud801"]), inner, max_size=3), max_leaves=12)
ids = st.sampled_from(["r1", "r2", "", "\ud800x"]) | st.none() | st.integers(0, 2) | st.builds(Text, st.just("r3"))


@st.composite
def results(draw: Any) -> tuple[dict[str, Any], int]:
    n = draw(st.integers(0, 12))
    resp: dict[str, Any] = {}
    if draw(st.integers(0, 9)) > 0:
        resp["ids"] = draw(st.lists(ids, min_size=n, max_size=n)) if draw(st.booleans()) else \
            [f"r{i}" for i in range(n)]
    for name in draw(st.lists(st.sampled_from(["documents", "metadatas", "distances", "embeddings", "uris", "included"]),
                              unique=True)):
        kind = draw(st.integers(0, 4))
        if kind == 0:
            resp[name] = None
        elif kind == 1:
            resp[name] = draw(st.lists(values, max_size=n + 2))  # any length: only lists of length n are columns
        elif kind == 2:  # a long numeric column (the bulk float check), maybe with a non-finite number
            resp[name] = [[draw(st.sampled_from([0.1, 0.2, float("nan")])) for _ in range(draw(st.integers(0, 10)))]
                          for _ in range(n)]
        else:
            resp[name] = draw(st.lists(values, min_size=n, max_size=n))
    if draw(st.booleans()) and n:  # a deep value at exactly, or one past, the limit
        deep: Any = draw(scalars)
        for _ in range(draw(st.integers(MAX_DEPTH - 2, MAX_DEPTH + 1))):
            deep = {"k": deep} if draw(st.booleans()) else [deep]
        resp["metadatas"] = [deep if i == 0 else {} for i in range(n)]
    return resp, n


@settings(max_examples=400, deadline=None)
@given(results())
def test_rows_agree_with_the_reference(case: tuple[dict[str, Any], int]) -> None:
    resp, n = case
    profile = SimpleNamespace(settings=SimpleNamespace(max_json_depth=MAX_DEPTH))
    out = {}
    for side, fn in (("new", lambda ex: ChromaProfile._rows(profile, ex, resp, n)),  # type: ignore[arg-type]
                     ("old", lambda ex: reference_rows(ex, resp, n))):
        ex = Exchange("POST", "/", request_id="r")
        with capture_logs() as logs:
            rows = fn(ex)
        out[side] = ([list(r.items()) for r in rows], ex.rows_malformed, logs)
    assert repr(out["new"]) == repr(out["old"])  # repr: nan != nan, and the types of the values too
    assert [list(r.items()) for r in _columns_to_rows(resp, n)] == [list(r.items()) for r in reference_columns_to_rows(resp, n)] \
        or repr(_columns_to_rows(resp, n)) == repr(reference_columns_to_rows(resp, n))
