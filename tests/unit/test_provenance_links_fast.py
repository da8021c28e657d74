"""`Provenance.links` returns at once when no link target is readable (the common read: rows that supersede
nothing): against the old code (`tests/unit/provenance_reference.py`) the same links, the same ledger and
readability calls, for rows with and without links, in this collection or another, read for the request or not."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.exchange import Exchange
from sidecar.governance import Row
from sidecar.provenance import Provenance
from tests.unit import provenance_reference

IDS = [f"r{i}" for i in range(8)]
pairs = st.none() | st.tuples(st.sampled_from(["c", "other"]), st.sampled_from(IDS))


class Calls:
    def __init__(self, rows: dict[str, Row], readable: set[str]) -> None:
        self.rows, self.allowed, self.log = rows, readable, []

    def get_rows(self, backend: str, collection: str, ids: list[str]) -> dict[str, Row]:
        self.log.append(("get_rows", backend, collection, list(ids)))
        return {i: self.rows[i] for i in ids if i in self.rows}

    def readable(self, ex: Any, backend: str, collection: str, ids: list[str], **kw: Any) -> set[str]:
        self.log.append(("readable", backend, collection, list(ids), kw))
        return {i for i in ids if i in self.allowed}


def provenance(calls: Calls) -> Provenance:
    prov = Provenance.__new__(Provenance)
    prov.backend, prov.ledger, prov.authz = "chroma", calls, calls
    return prov


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(IDS), pairs, pairs), max_size=8, unique_by=lambda t: t[0]),
       st.sets(st.sampled_from(IDS)), st.lists(st.sampled_from(IDS), max_size=8, unique=True), st.booleans())
def test_links_agree_with_the_reference(spec: list[tuple[str, Any, Any]], readable: set[str], asked: list[str],
                                        seen: bool) -> None:
    rows = {rid: Row("chroma", "c", rid, "t", "f", "t/f/a", "tenant", "t/f/a", 1, supersedes=sup, superseded_by=by)
            for rid, sup, by in spec}
    outs = []
    for fn in (Provenance.links, provenance_reference.links):
        calls = Calls(rows, readable)
        ex = Exchange(method="POST", raw_path="/")
        if seen:
            ex.ledger_rows.update((("chroma", "c", i), r) for i, r in rows.items())
        outs.append((fn(provenance(calls), ex, "c", asked), calls.log))
    assert outs[0] == outs[1]


# -- links and decorate against de70fd8 (one look-up per id, targets in one loop, no link pass without links) ----
metas = st.none() | st.just("not an object") | st.fixed_dictionaries(
    {}, optional={"k": st.sampled_from(["v", "\ud800", ""]), "mw_derived_from": st.sampled_from(["r1", "r1,r2", ",r3,", "", "rx"]),
                  "mw_supersedes_id": st.just("stale")})


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(IDS), pairs, pairs), max_size=8, unique_by=lambda t: t[0]),
       st.sets(st.sampled_from(IDS)), st.lists(st.tuples(st.sampled_from(IDS + ["ghost"]), metas), max_size=10),
       st.sets(st.sampled_from(IDS + ["ghost"])))
def test_decorate_agrees_with_de70fd8(spec: list[tuple[str, Any, Any]], readable: set[str],
                                      returned: list[tuple[str, Any]], seen: set[str]) -> None:
    """Rows with and without metadata objects, repeated ids, ids the ledger does not know, some or all of them
    read for the request (the rest from the ledger), links within and across collections, parents: the same
    rows (metadata objects replaced, not changed in place, as before), the same ledger and readability calls."""
    rows = {rid: Row("chroma", "c", rid, "t", "f", "t/f/a", "tenant", "t/f/a", 1, supersedes=sup, superseded_by=by)
            for rid, sup, by in spec}
    outs = []
    for decorate in (Provenance.decorate, provenance_reference.decorate_de70fd8):
        calls = Calls(rows, readable)
        ex = Exchange(method="POST", raw_path="/")
        ex.ledger_rows.update((("chroma", "c", i), r) for i, r in rows.items() if i in seen)
        ex.ledger_rows[("chroma", "other", "r1")] = rows.get("r1")  # another collection's row: never this one's
        originals = [dict(m) if isinstance(m, dict) else m for _, m in returned]
        answer = [{"ids": i, "metadatas": m, "documents": "d"} for (i, _), m in zip(returned, originals)]
        kept = [r["metadatas"] for r in answer]
        try:
            decorate(provenance(calls), ex, "c", answer, id_key="ids", meta_key="metadatas")
            raised = None
        except KeyError as exc:  # a repeated id whose copies disagree on mw_derived_from (as before: 500)
            raised = repr(exc)
        unchanged = [m == o for m, o in zip(kept, [m for _, m in returned])]  # metadata objects never edited in place
        outs.append((raised, answer, [r["metadatas"] is k for r, k in zip(answer, kept)], unchanged, calls.log))
    assert outs[0] == outs[1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(IDS), pairs, pairs), max_size=8, unique_by=lambda t: t[0]),
       st.sets(st.sampled_from(IDS)), st.lists(st.sampled_from(IDS + ["ghost"]), max_size=10), st.sets(st.sampled_from(IDS)))
def test_links_agree_with_de70fd8(spec: list[tuple[str, Any, Any]], readable: set[str], asked: list[str],
                                  seen: set[str]) -> None:
    rows = {rid: Row("chroma", "c", rid, "t", "f", "t/f/a", "tenant", "t/f/a", 1, supersedes=sup, superseded_by=by)
            for rid, sup, by in spec}
    outs = []
    for fn in (Provenance.links, provenance_reference.links_de70fd8):
        calls = Calls(rows, readable)
        ex = Exchange(method="POST", raw_path="/")
        ex.ledger_rows.update((("chroma", "c", i), r) for i, r in rows.items() if i in seen)
        got = fn(provenance(calls), ex, "c", asked)
        outs.append((got, list(got), calls.log))
    assert outs[0] == outs[1]
