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
