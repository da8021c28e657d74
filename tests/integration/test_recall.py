"""Recall: with 200 rows of which the caller may read 20, query returns exactly the true top-k among
readable rows (same ids and distances as Chroma over only those rows), under every query plan (``stack``
runs the default ``auto``), with the visibility filter sent as the ledger's id list (the default) or as Chroma's
metadata ``where`` (``where_pushdown_stack``), and with the tenant-only pushdown."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Stack, unit_vectors

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("plan", ["stack", "pushdown_stack", "where_pushdown_stack", "tenant_pushdown_stack",
                                  "postfilter_stack"])
def test_query_returns_true_top_k_of_readable_rows(request: pytest.FixtureRequest, plan: str) -> None:
    stack: Stack = request.getfixturevalue(plan)
    t = stack.tenant("recall")
    reader = stack.key(t.name, "red", "reader", 1)
    other = stack.key(t.name, "red", "other", 1)
    v = unit_vectors(201, dim=16, seed=11)
    mine = stack.client(reader, t.name).get_collection(t.collection)
    theirs = stack.client(other, t.name).get_collection(t.collection)
    # 20 rows the reader owns at agent scope; 180 agent-scoped rows of someone else.
    readable = [f"m{i}" for i in range(20)]
    mine.add(ids=readable, embeddings=v[:20], metadatas=[{"mw_scope": "agent", "k": "x"}] * 20)
    for start in range(0, 180, 60):
        ids = [f"o{i}" for i in range(start, start + 60)]
        theirs.add(ids=ids, embeddings=v[20 + start:80 + start], metadatas=[{"mw_scope": "agent", "k": "x"}] * 60)

    q = v[200]
    got = mine.query(query_embeddings=[q], n_results=10, where={"k": "x"}, include=["distances"])
    direct = stack.direct(t.name).get_collection(t.collection)
    truth = direct.query(query_embeddings=[q], n_results=10, ids=readable, include=["distances"])
    assert got["ids"][0] == truth["ids"][0]
    assert got["distances"][0] == pytest.approx(truth["distances"][0], rel=1e-5)
    assert len(got["ids"][0]) == 10
    # The backend really holds 200 rows; the caller sees its 20.
    assert direct.count() == 200
    assert mine.count() == 20
    # limit/offset apply to readable rows, in the backend's order
    everything = mine.get(where={"k": "x"})["ids"]
    assert sorted(everything) == sorted(readable)
    assert mine.get(where={"k": "x"}, limit=5, offset=15)["ids"] == everything[15:20]
    assert mine.get(where={"k": "x"}, limit=5, offset=18)["ids"] == everything[18:20]


@pytest.mark.parametrize("plan", ["stack", "pushdown_stack", "where_pushdown_stack", "postfilter_stack"])
def test_query_when_most_rows_are_readable(request: pytest.FixtureRequest, plan: str) -> None:
    """The other regime: 90 of 100 rows readable; several query vectors in one call."""
    stack: Stack = request.getfixturevalue(plan)
    t = stack.tenant("dense")
    reader = stack.key(t.name, "red", "reader", 1)
    other = stack.key(t.name, "red", "other", 1)
    v = unit_vectors(103, dim=16, seed=12)
    mine = stack.client(reader, t.name).get_collection(t.collection)
    mine.add(ids=[f"f{i}" for i in range(90)], embeddings=v[:90])  # fleet scope: readable
    stack.client(other, t.name).get_collection(t.collection).add(
        ids=[f"a{i}" for i in range(10)], embeddings=v[90:100], metadatas=[{"mw_scope": "agent"}] * 10)
    readable = [f"f{i}" for i in range(90)]
    direct = stack.direct(t.name).get_collection(t.collection)
    got = mine.query(query_embeddings=v[100:103], n_results=7, include=["distances"])
    truth = direct.query(query_embeddings=v[100:103], n_results=7, ids=readable, include=["distances"])
    assert got["ids"] == truth["ids"]
    for a, b in zip(got["distances"], truth["distances"]):
        assert a == pytest.approx(b, rel=1e-5)
