"""The official chromadb.HttpClient works unchanged through the sidecar (only an auth header added)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Stack, unit_vectors

pytestmark = pytest.mark.integration


def test_full_lifecycle_through_sidecar(stack: Stack) -> None:
    t = stack.tenant("life")
    key = stack.key(t.name, "red", "writer", 1)
    client = stack.client(key, t.name)
    assert client.heartbeat() > 0
    assert isinstance(client.get_version(), str)

    admin = stack.client(t.admin_key, t.name)
    coll_admin = admin.create_collection("notes")
    assert {c.name for c in admin.list_collections()} == {"mem", "notes"}
    assert admin.count_collections() == 2

    coll = client.get_collection("notes")
    assert str(coll.id) == str(coll_admin.id)
    v = unit_vectors(4, seed=1)
    coll.add(ids=["a", "b", "c"], embeddings=v[:3], documents=["alpha", "beta", "gamma"],
             metadatas=[{"n": 1}, {"n": 2}, {"n": 3, "mw_scope": "agent"}])
    got = coll.get(ids=["a", "b", "c"], include=["documents", "metadatas", "embeddings"])
    assert got["ids"] == ["a", "b", "c"]
    assert got["documents"] == ["alpha", "beta", "gamma"]
    assert [m["n"] for m in got["metadatas"]] == [1, 2, 3]
    assert got["metadatas"][0]["mw_owner"] == f"{t.name}/red/writer"
    assert got["metadatas"][2]["mw_scope"] == "agent"
    assert len(got["embeddings"][0]) == 8

    q = coll.query(query_embeddings=[v[1]], n_results=2)
    assert q["ids"][0][0] == "b" and len(q["ids"][0]) == 2
    assert q["distances"][0][0] == pytest.approx(0.0, abs=1e-5)

    coll.update(ids=["a"], documents=["alpha v2"], embeddings=[v[3]], metadatas=[{"n": 10}])
    got = coll.get(ids=["a"])
    assert got["documents"] == ["alpha v2"] and got["metadatas"][0]["n"] == 10
    assert got["metadatas"][0]["mw_owner"] == f"{t.name}/red/writer"

    coll.upsert(ids=["b", "d"], embeddings=[v[1], v[3]], documents=["beta v2", "delta"], metadatas=[{"n": 20}, {"n": 4}])
    assert coll.get(ids=["b", "d"])["documents"] == ["beta v2", "delta"]
    assert coll.count() == 4

    assert coll.get(limit=2, offset=1)["ids"] == coll.get()["ids"][1:3]
    coll.delete(ids=["c"])
    assert coll.count() == 3
    assert coll.get(ids=["c"])["ids"] == []
    # A tombstoned id can never be written again.
    with pytest.raises(Exception):
        coll.add(ids=["c"], embeddings=[v[0]], documents=["again"])
    assert stack.direct(t.name).get_collection("notes").get(ids=["c"])["ids"] == []

    admin.delete_collection("notes")
    assert {c.name for c in admin.list_collections()} == {"mem"}


def test_direct_and_sidecar_agree_for_owner(stack: Stack) -> None:
    """For rows the caller may read, the sidecar returns what Chroma returns (same ids, order, distances)."""
    t = stack.tenant("agree")
    key = stack.key(t.name, "red", "w", 1)
    coll = stack.client(key, t.name).get_collection(t.collection)
    v = unit_vectors(30, seed=3)
    coll.add(ids=[f"r{i}" for i in range(30)], embeddings=v, documents=[f"d{i}" for i in range(30)])
    direct = stack.direct(t.name).get_collection(t.collection)
    a = coll.query(query_embeddings=[v[0], v[5]], n_results=7)
    b = direct.query(query_embeddings=[v[0], v[5]], n_results=7)
    assert a["ids"] == b["ids"]
    for da, db in zip(a["distances"], b["distances"]):
        assert da == pytest.approx(db)
    assert a["documents"] == b["documents"]
