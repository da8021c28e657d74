"""The answer path of `ChromaProfile.op_query` after the backend answers — splitting Chroma's answer per
query embedding (`ChromaProfile._query_rows`), the first `k` readable rows of each (`_first_readable`) and
the columnar response (`_query_result`) — against the code they replaced, kept here as the reference.

Same rows per query (keys in the same order, values of the same types), the same ``rows_malformed`` and
log lines, the same batches sent to the readability check (in the same order: each one is a Cedar call
and a ``tally`` of the planner), the same response (keys in order, ``repr`` equal: nan != nan) and the
same ``row_ids``, on generated answers: several query embeddings, include fields missing, ``None`` or not
lists, per-query items that are not lists, malformed rows, ids repeated across queries, rows withheld."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sidecar.backends.chroma import ChromaProfile, _query_result
from sidecar.exchange import Exchange

MAX_DEPTH = 3  # MEMWARDEN_MAX_JSON_DEPTH of the profile under test


def reference_first_readable(ranked: list[list[dict[str, Any]]], k: int, keep: Any) -> list[list[dict[str, Any]]]:
    decided: dict[str, bool] = {}
    taken: list[list[dict[str, Any]]] = [[] for _ in ranked]
    pos = [0] * len(ranked)
    while True:
        wanted: list[str] = []
        for j, rows in enumerate(ranked):
            while pos[j] < len(rows) and len(taken[j]) < k and rows[pos[j]]["ids"] in decided:
                if decided[rows[pos[j]]["ids"]]:
                    taken[j].append(rows[pos[j]])
                pos[j] += 1
            need = k - len(taken[j])
            if need > 0:
                wanted += [r["ids"] for r in rows[pos[j]:pos[j] + need] if r["ids"] not in decided]
        wanted = list(dict.fromkeys(wanted))
        if not wanted:
            return taken
        allowed = keep(wanted)
        decided.update({i: i in allowed for i in wanted})


def reference_query_rows(profile: Any, ex: Exchange, resp: dict[str, Any], m: int) -> list[list[dict[str, Any]]]:
    per_query: list[list[dict[str, Any]]] = []
    for j in range(m):
        sub = {key: v[j] for key, v in resp.items() if isinstance(v, list) and key != "included" and len(v) == m and isinstance(v[j], list)}
        per_query.append(ChromaProfile._rows(profile, ex, sub, len(resp["ids"][j])))
    return per_query


def reference_result(final: dict[int, list[dict[str, Any]]], m: int, include: Any, included: Any) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    keys = set()
    for rows in final.values():
        for r in rows:
            keys.update(r.keys())
    if include is None:
        include = ["metadatas", "documents", "distances"]
    for key in ("ids", "distances", "documents", "metadatas", "embeddings", "uris"):
        if key == "ids" or key in keys or key in include:
            out[key] = [[r.get(key) for r in final[i]] for i in range(m)]
        else:
            out[key] = None
    out["included"] = included if included is not None else include
    return out, [r["ids"] for i in range(m) for r in final[i]]


def new_result(final: dict[int, list[dict[str, Any]]], m: int, include: Any, included: Any) -> tuple[dict[str, Any], list[str]]:
    ranked = [final[i] for i in range(m)]  # as op_query does
    return _query_result(ranked, include, included), [r["ids"] for rows in ranked for r in rows]


scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.5, float("nan"), "a", "\ud800", ""])
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["k", "mw_owner", "mw_derived_from"]), inner, max_size=3), max_leaves=8)
row_ids = st.sampled_from(["r1", "r2", "r3", "r4", "r5", "", "\ud800x"]) | st.none() | st.integers(0, 2)
COLUMNS = ["documents", "metadatas", "distances", "embeddings", "uris", "included", "extra"]


@st.composite
def answers(draw: Any) -> tuple[dict[str, Any], int]:
    """A Chroma query answer for `m` query embeddings (``ids``: `m` lists, as op_query requires)."""
    m = draw(st.integers(1, 3))
    lengths = [draw(st.integers(0, 7)) for _ in range(m)]
    resp: dict[str, Any] = {}
    names = draw(st.lists(st.sampled_from(COLUMNS), unique=True))
    at = draw(st.integers(0, len(names)))
    for name in names[:at] + ["ids"] + names[at:]:  # ids anywhere in the answer's key order
        if name == "ids":
            resp["ids"] = [draw(st.lists(row_ids, min_size=n, max_size=n)) if draw(st.integers(0, 3)) == 0
                           else [f"r{draw(st.integers(1, 9))}" for _ in range(n)] for n in lengths]
            continue
        kind = draw(st.integers(0, 5))
        if kind == 0:
            resp[name] = None
        elif kind == 1:  # not one entry per query: not a column
            resp[name] = draw(st.lists(st.lists(values, max_size=3), max_size=m + 1))
        elif kind == 2:  # one entry per query, some not lists (that query lacks the column)
            resp[name] = [draw(st.lists(values, min_size=n, max_size=n) | scalars) for n in lengths]
        elif kind == 3:  # per query a list of another length
            resp[name] = [draw(st.lists(values, max_size=n + 2)) for n in lengths]
        else:
            resp[name] = [draw(st.lists(values, min_size=n, max_size=n)) for n in lengths]
    return resp, m


@settings(max_examples=500, deadline=None)
@given(answers(), st.integers(0, 6), st.sets(st.sampled_from(["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"])),
       st.none() | st.just(["documents"]) | st.just(["metadatas", "distances", "uris"]) | st.just([]) | st.just("embeddings"),
       st.none() | st.just(["documents", "metadatas"]))
def test_query_answer_path_agrees_with_the_reference(case: tuple[dict[str, Any], int], k: int, readable: set[str],
                                                     include: Any, included: Any) -> None:
    resp, m = case
    profile = SimpleNamespace(settings=SimpleNamespace(max_json_depth=MAX_DEPTH))
    profile._rows = lambda ex, sub, n, exact=False: ChromaProfile._rows(profile, ex, sub, n, exact)  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    for side in ("new", "old"):
        ex = Exchange("POST", "/", request_id="r")
        batches: list[list[str]] = []

        def keep(batch: list[str]) -> set[str]:
            batches.append(list(batch))
            return {i for i in batch if i in readable}

        with capture_logs() as logs:
            if side == "new":
                per_query = ChromaProfile._query_rows(profile, ex, resp, m)  # type: ignore[arg-type]
                taken = ChromaProfile._first_readable(profile, ex, None, per_query, k, keep)  # type: ignore[arg-type]
                final = {i: taken[i] for i in range(m)}
                result = new_result(final, m, include, included)
            else:
                per_query = reference_query_rows(profile, ex, resp, m)
                taken = reference_first_readable(per_query, k, keep)
                final = {i: taken[i] for i in range(m)}
                result = reference_result(final, m, include, included)
        out[side] = (repr([[list(r.items()) for r in rows] for rows in per_query]), ex.rows_malformed, logs, batches,
                     repr([[list(r.items()) for r in rows] for rows in taken]), repr(list(result[0].items())), result[1])
    assert out["new"] == out["old"]


def test_default_include_is_a_fresh_list_per_answer() -> None:
    first = _query_result([[{"ids": "r1"}]], None, None)
    first["included"].append("embeddings")  # a later stage changing one answer never changes another
    assert _query_result([[{"ids": "r1"}]], None, None)["included"] == ["metadatas", "documents", "distances"]
