"""Issue 34, finding 3: one agent's large rows broke other agents' reads. A trust-1 agent wrote large rows only it
may read; every other agent's Mem0 ``GET /memories`` (and the tenant admin's search) then answered 502, because the
list fetched that agent's memories before filtering and the answer was over the response cap, and Chroma queries
that include documents did too, because the unfiltered over-fetch pulled the unreadable rows' documents.

Real servers (the session's `chroma run` and Mem0 REST server) behind sidecars of their own whose response cap is
3 MiB (``BACKEND_MAX_RESPONSE_BYTES``; ``MAX_ROW_BYTES`` keeps its 1 MiB default): five rows of 900 kB, each under
the row limit, are 4.5 MB together. Every read below answered 502 before the fix."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest

from memwarden_eval.harness import Server, start_sidecar
from tests.integration.conftest import POLICIES, Stack
from tests.integration.mem0.conftest import Mem0Stack, World, sidecar_env

pytestmark = pytest.mark.integration

CAP = 3 * 1024 * 1024
CAPPED = {"MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES": str(CAP), "MEMWARDEN_METRICS_PORT": "0"}
BIG = 900_000  # bytes of each large row: under the 1 MiB row limit; five of them are over the 3 MiB cap
N_BIG = 5


def big_text(i: int) -> str:
    return f"zebra {i} " + "zebra " * (BIG // 6)


# -- Chroma -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chroma_capped(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[Stack]:
    """A sidecar with the 3 MiB cap whose queries always over-fetch unfiltered first (``postfilter-first``): the
    plan that pulled the unreadable rows' documents."""
    tmp = tmp_path_factory.mktemp("capped-chroma")
    sidecar = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES,
                            extra_env={**CAPPED, "MEMWARDEN_QUERY_PLAN": "postfilter-first"})
    yield Stack(chroma_server, sidecar, tmp / "ledger.db")
    sidecar.stop()


def test_chroma_reads_with_documents_are_not_broken_by_rows_the_caller_cannot_read(chroma_capped: Stack) -> None:
    stack = chroma_capped
    t = stack.tenant("big")
    big = stack.key(t.name, "f", "big", 1)
    me = stack.key(t.name, "f", "me", 1)
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    near = [1.0, 0.0, 0.0, 0.0]
    with stack.http(big) as h:  # only the writer may read these (agent scope)
        for i in range(N_BIG):
            r = h.post(f"{base}/add", json={"ids": [f"big{i}"], "embeddings": [[1.0, 0.001 * i, 0.0, 0.0]],
                                            "documents": [big_text(i)], "metadatas": [{"mw_scope": "agent"}]})
            assert r.status_code == 200, r.text
    mine = {f"mine{i}": f"my note {i}" for i in range(3)}
    with stack.http(me) as h:
        r = h.post(f"{base}/add", json={"ids": list(mine), "embeddings": [[0.5, 0.5, 0.1 * i, 0.0] for i in range(3)],
                                        "documents": list(mine.values())})
        assert r.status_code == 200, r.text
        # the over-fetch (2 x 3 rows, nearest first) holds the large rows: their documents are never fetched
        q = h.post(f"{base}/query", json={"query_embeddings": [near], "n_results": 3,
                                          "include": ["documents", "metadatas", "distances"]})
        assert q.status_code == 200, q.text[:300]
        assert sorted(q.json()["ids"][0]) == sorted(mine)
        assert sorted(q.json()["documents"][0]) == sorted(mine.values())
        # Chroma's default include (documents) too, and a get naming the large rows by id
        q = h.post(f"{base}/query", json={"query_embeddings": [near], "n_results": 2})
        assert q.status_code == 200 and set(q.json()["ids"][0]) <= set(mine), q.text[:300]
        g = h.post(f"{base}/get", json={"ids": [f"big{i}" for i in range(N_BIG)] + list(mine)})
        assert g.status_code == 200, g.text[:300]
        assert sorted(zip(g.json()["ids"], g.json()["documents"])) == sorted(mine.items())
    with stack.http(big) as h:  # the writer reads its own large rows, as many as fit in one answer
        q = h.post(f"{base}/query", json={"query_embeddings": [near], "n_results": 2, "include": ["documents"]})
        assert q.status_code == 200, q.text[:300]
        assert q.json()["ids"][0] == ["big0", "big1"] and q.json()["documents"][0] == [big_text(0), big_text(1)]
        g = h.post(f"{base}/get", json={"include": ["documents"]})  # more than one answer holds: fetched in parts
        assert g.status_code == 200, g.text[:300]
        assert sorted(g.json()["ids"]) == sorted([f"big{i}" for i in range(N_BIG)] + list(mine))  # mine: fleet rows


# -- Mem0 -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mem0_capped(tmp_path_factory: pytest.TempPathFactory, mem0_server: Server) -> Iterator[Mem0Stack]:
    tmp = tmp_path_factory.mktemp("capped-mem0")
    sidecar = start_sidecar(mem0_server.url, tmp / "ledger.db", POLICIES, extra_env=sidecar_env(CAPPED))
    yield Mem0Stack(mem0_server, sidecar, tmp / "ledger.db")
    sidecar.stop()


@pytest.fixture(scope="module")
def mem0_world(mem0_capped: Mem0Stack) -> Iterator[tuple[World, dict[str, str], list[str]]]:
    """A tenant whose agent ``big`` wrote five large memories only it may read and one small tenant-wide one, and
    whose agent ``me`` wrote two of its own: (world, my memories by id → text, big's large memory ids)."""
    stack = mem0_capped
    w = stack.world([("f", "big", 1), ("f", "me", 1)], prefix=f"big{uuid.uuid4().hex[:4]}")
    large = [stack.add(w.keys["big"], big_text(i), metadata={"mw_scope": "agent"}) for i in range(N_BIG)]
    mine = {stack.add(w.keys["me"], text): text for text in ("my note about tea", "my note about coffee")}
    yield w, mine, large
    with stack.http(w.keys["big"]) as h:  # the shared Mem0 keeps no large rows for later tests
        for mid in large:
            h.delete(f"/memories/{mid}")


def memories(r: Any) -> dict[str, str]:
    assert r.status_code == 200, r.text[:300]
    return {m["id"]: m["memory"] for m in r.json()["results"]}


def test_mem0_another_agents_list_is_not_broken_by_rows_it_cannot_read(mem0_capped: Mem0Stack,
                                                                       mem0_world: tuple[World, dict[str, str], list[str]]) -> None:
    stack, (w, mine, large) = mem0_capped, mem0_world
    with stack.http(w.keys["me"]) as h:
        assert memories(h.get("/memories")) == mine
        assert memories(h.get("/memories", params={"agent_id": "big"})) == {}  # named: nothing of it may be read
        assert memories(h.get("/memories", params={"user_id": "nobody"})) == {}
    # big also owns a row the others may read: its list answer is over the cap, so it is made memory by memory
    # — of the rows the caller may read only
    shared = stack.add(w.keys["big"], "a note for the whole tenant", metadata={"mw_scope": "tenant"})
    with stack.http(w.keys["me"]) as h:
        assert memories(h.get("/memories")) == {**mine, shared: "a note for the whole tenant"}
        assert memories(h.get("/memories", params={"agent_id": "big"})) == {shared: "a note for the whole tenant"}
    with stack.http(w.keys["big"]) as h:  # the writer lists its own large memories, one answer at a time
        own = memories(h.get("/memories"))
        assert set(own) == {*large, shared, *mine} and own[large[0]] == big_text(0)  # mine: fleet rows


def test_mem0_the_admins_list_and_search_are_not_broken_by_large_rows(mem0_capped: Mem0Stack,
                                                                     mem0_world: tuple[World, dict[str, str], list[str]]) -> None:
    stack, (w, mine, large) = mem0_capped, mem0_world
    with stack.http(w.admin) as h:
        # the over-fetch (2 x top_k) of the nearest memories is over the cap: asked again for top_k
        found = memories(h.post("/search", json={"query": "zebra", "top_k": 2, "threshold": 0.0}))
        assert len(found) == 2 and set(found) <= set(large)
        listed = memories(h.get("/memories"))  # a tenant admin reads the whole tenant, the large rows too
        assert set(listed) >= {*large, *mine}
    with stack.http(w.keys["me"]) as h:
        found = memories(h.post("/search", json={"query": "zebra", "top_k": 5, "threshold": 0.0}))
        assert not set(found) & set(large) and set(mine) <= set(found)


def test_a_capped_answer_of_readable_rows_names_the_limit(mem0_capped: Mem0Stack,
                                                          mem0_world: tuple[World, dict[str, str], list[str]]) -> None:
    """Rows the caller may read can still be more than one answer holds: then the answer is 502 naming the
    setting, and only then."""
    stack, (w, _, _) = mem0_capped, mem0_world
    with stack.http(w.admin) as h:  # four of the large memories are the four nearest: over the cap in any answer
        r = h.post("/search", json={"query": "zebra", "top_k": 4, "threshold": 0.0})
    assert r.status_code == 502, r.text[:300]
    assert r.json()["error"] == "bad_gateway" and "MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES" in r.json()["message"]
    assert str(CAP) in r.json()["message"]
