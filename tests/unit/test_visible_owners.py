"""`Ledger.visible_owners` and `Ledger.visible_row_ids_of` — which agents own a row a caller's visibility filter
admits, and which of one agent's rows it admits (the Mem0 list asks Mem0 only under those agents, issue 34 finding 3)
— on SQLite and on a real PostgreSQL, against the reference predicate of tests/unit/test_visible_row_ids.py."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.backends.chroma import visibility_reader
from sidecar.governance import Principal, Row
from tests.pgutil import pg_url  # noqa: F401  (fixture)
from tests.unit.test_visible_row_ids import UIDS, ledger, principals, reference, rows, store  # noqa: F401  (fixture)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rows, max_size=25, unique_by=lambda r: r.row_id), principals, st.booleans(), st.sampled_from(UIDS),
       st.integers(0, 30))
def test_visible_owners_and_rows_of_an_owner_are_the_reference_predicate(ledger: Any, batch: list[Row], p: Principal,  # noqa: F811
                                                                         wide: bool, owner: str, limit: int) -> None:
    collection = store(ledger, batch)
    reader = visibility_reader(p, "tenant" if wide else "scope")
    expected = reference(p, batch, wide)
    by_id = {r.row_id: r for r in batch}
    owners = ledger.visible_owners("chroma", collection, p.tenant, reader)
    assert owners == sorted({by_id[i].owner for i in expected})
    of_owner = {i for i in expected if by_id[i].owner == owner}
    got = ledger.visible_row_ids_of("chroma", collection, p.tenant, reader, owner, limit)
    if len(of_owner) > limit:
        assert got is None
    else:
        assert got is not None and sorted(got) == sorted(of_owner)
    assert ledger.visible_owners("mem0", collection, p.tenant, reader) == []
    assert ledger.visible_row_ids_of("chroma", collection + "x", p.tenant, reader, owner, 10**6) == []


def test_an_agent_with_only_rows_others_may_not_read_is_no_visible_owner(ledger: Any) -> None:  # noqa: F811
    """The shape of finding 3: a trust-1 agent's own agent-scoped rows make it an owner to itself and to a tenant
    admin, never to a peer; a tenant-scoped row of it makes it one to everybody in the tenant."""
    big = [Row("mem0", "d", f"big{i}", "t", "f", "t/f/big", "agent", "t/f/big", 1) for i in range(3)]
    mine = [Row("mem0", "d", "m1", "t", "f", "t/f/me", "fleet", "t/f/me", 1)]
    collection = store(ledger, big + mine)
    peer = visibility_reader(Principal("agent", "k", "t", "f", "me", 1), "scope")
    assert ledger.visible_owners("mem0", collection, "t", peer) == ["t/f/me"]
    assert ledger.visible_row_ids_of("mem0", collection, "t", peer, "t/f/big", 100) == []
    itself = visibility_reader(Principal("agent", "k", "t", "f", "big", 1), "scope")
    assert ledger.visible_owners("mem0", collection, "t", itself) == ["t/f/big", "t/f/me"]
    assert ledger.visible_owners("mem0", collection, "t", None) == ["t/f/big", "t/f/me"]  # a tenant admin
    assert sorted(ledger.visible_row_ids_of("mem0", collection, "t", None, "t/f/big", 3) or []) == ["big0", "big1", "big2"]
    assert ledger.visible_row_ids_of("mem0", collection, "t", None, "t/f/big", 2) is None
    shared = store(ledger, big + mine + [Row("mem0", "d", "pub", "t", "f", "t/f/big", "tenant", "t/f/big", 1)])
    assert ledger.visible_owners("mem0", shared, "t", peer) == ["t/f/big", "t/f/me"]
    assert ledger.visible_row_ids_of("mem0", shared, "t", peer, "t/f/big", 100) == ["pub"]
