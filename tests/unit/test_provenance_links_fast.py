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


def narrowed(meta: dict[str, Any], links: dict[str, str], visible: set[str]) -> dict[str, Any]:
    """The metadata a row shows (the rule, independent of either implementation): its links added, and its
    own ``mw_derived_from`` narrowed to the readable parents (dropped when none is)."""
    out = {**meta, **links}
    if "mw_derived_from" in meta:
        shown = [x for x in str(meta["mw_derived_from"]).split(",") if x and x in visible]
        if shown:
            out["mw_derived_from"] = ",".join(shown)
        else:
            del out["mw_derived_from"]
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(IDS), pairs, pairs), max_size=8, unique_by=lambda t: t[0]),
       st.sets(st.sampled_from(IDS)), st.lists(st.tuples(st.sampled_from(IDS + ["ghost"]), metas), max_size=10),
       st.sets(st.sampled_from(IDS + ["ghost"])))
def test_decorate_agrees_with_de70fd8(spec: list[tuple[str, Any, Any]], readable: set[str],
                                      returned: list[tuple[str, Any]], seen: set[str]) -> None:
    """Rows with and without metadata objects, repeated ids, ids the ledger does not know, some or all of them
    read for the request (the rest from the ledger), links within and across collections, parents: the same
    rows (metadata objects replaced, not changed in place, as before), the same ledger and readability calls.
    Where an id repeats among the rows with metadata objects, de70fd8 keyed parents by id (a 500, KeyError,
    when only some copies named parents; else every copy narrowed from one copy's list): each row now shows
    its own metadata narrowed (`narrowed`), never an unreadable parent, and is never a 500."""
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
        except KeyError as exc:  # de70fd8 only: a repeated id whose copies disagree on mw_derived_from
            raised = repr(exc)
        unchanged = [m == o for m, o in zip(kept, [m for _, m in returned])]  # metadata objects never edited in place
        outs.append((raised, answer, [r["metadatas"] is k for r, k in zip(answer, kept)], unchanged, calls.log))
    with_meta = [i for i, m in returned if isinstance(m, dict)]
    if len(set(with_meta)) == len(with_meta):
        assert outs[0] == outs[1]
        return
    raised, answer, _, unchanged, log = outs[0]
    assert raised is None and all(unchanged)
    calls = Calls(rows, readable)  # the links part of the calls: as before
    ex = Exchange(method="POST", raw_path="/")
    ex.ledger_rows.update((("chroma", "c", i), r) for i, r in rows.items() if i in seen)
    links = provenance_reference.links_de70fd8(provenance(calls), ex, "c", with_meta)
    wanted = sorted({x for _, m in returned if isinstance(m, dict) and "mw_derived_from" in m
                     for x in str(m["mw_derived_from"]).split(",") if x})
    parents_call = [("readable", "chroma", "c", wanted, {"include_superseded": True, "count": False})]
    assert log == calls.log + (parents_call if any(isinstance(m, dict) and "mw_derived_from" in m for _, m in returned) else [])
    for r, (i, m) in zip(answer, returned):
        if isinstance(m, dict):
            assert r["metadatas"] == narrowed(m, links.get(i, {}), readable)
            assert not {x for x in str(r["metadatas"].get("mw_derived_from", "")).split(",") if x} - readable
        else:
            assert r["metadatas"] == m


def test_repeated_id_each_copy_its_own_parents() -> None:
    """An answer repeating id r1, one copy naming parents and one not (de70fd8: KeyError, a 500, when no parent
    was readable; else the other copy shown the first's parents): each copy keeps its own metadata, narrowed."""
    rows = {i: Row("chroma", "c", i, "t", "f", "t/f/a", "tenant", "t/f/a", 1) for i in ("r1", "r2", "r3")}
    for readable, shown in (({"r2"}, "r2"), (set(), None)):
        answer = [{"ids": "r1", "metadatas": {"mw_derived_from": "r2,r3"}}, {"ids": "r1", "metadatas": {"k": "v"}},
                  {"ids": "r1", "metadatas": {"mw_derived_from": "r3"}}]
        Provenance.decorate(provenance(Calls(rows, readable)), Exchange(method="POST", raw_path="/"), "c", answer,
                            id_key="ids", meta_key="metadatas")
        assert answer[0]["metadatas"] == ({"mw_derived_from": shown} if shown else {})
        assert answer[1]["metadatas"] == {"k": "v"}
        assert answer[2]["metadatas"] == {}


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
