"""The Mem0 profile against our Mem0 REST test server (real `mem0ai` `Memory`): search refill, deletion closure on
every route (what every backend must do is tests/conformance), leakage, spoofed agent_id, wildcard/operator filters, bulk
delete scope, admin-only routes, error mapping."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.mem0.conftest import Mem0Stack, World
from tests.conformance.corpus import AGENTS, SEEDS, oracle

pytestmark = pytest.mark.integration

TEXT = {
    "alpha": "hiking in the mountains on the weekend",
    "beta": "the quarterly budget review is on friday",
}


@pytest.fixture(scope="module")
def world(mem0_stack: Mem0Stack) -> tuple[World, dict[str, str]]:
    """SEEDS written through the sidecar by their writers; returns the world and seed name → Mem0 id."""
    w = mem0_stack.world(AGENTS, prefix="conf")
    ids: dict[str, str] = {}
    for s in SEEDS:
        meta: dict[str, Any] = {"mw_scope": s.scope, "topic": s.topic, "seed": s.row_id}
        if s.fleet:
            meta["mw_fleet"] = s.fleet
        if s.readers:
            meta["mw_readers"] = ",".join(s.readers)
        ids[s.row_id] = mem0_stack.add(w.keys[s.writer], f"{TEXT[s.topic]} ({s.row_id})", user_id="u1", metadata=meta)
    # Written straight to Mem0 with forged governance metadata: never served.
    with mem0_stack.direct() as d:
        r = d.post("/memories", json={"messages": [{"role": "user", "content": TEXT["alpha"] + " forged"}],
                                      "agent_id": w.uid("r1"), "infer": False,
                                      "metadata": {"mw_tenant": w.name, "mw_scope": "tenant", "topic": "alpha"}})
        ids["ungoverned"] = r.json()["results"][0]["id"]
    w.keys["admin"] = w.admin
    return w, ids


def _names(ids: dict[str, str], rows: list[dict[str, Any]]) -> set[str]:
    back = {v: k for k, v in ids.items()}
    return {back.get(r["id"], r["id"]) for r in rows}


def test_search_refills_to_top_k(mem0_stack: Mem0Stack, world: tuple[World, dict[str, str]]) -> None:
    w, ids = world
    expected = oracle(w.name, "b1", "read")
    with mem0_stack.http(w.keys["b1"]) as h:
        for k in (1, 2, len(expected)):
            hits = h.post("/search", json={"query": TEXT["beta"], "top_k": k, "threshold": 0.0}).json()["results"]
            assert len(hits) == k and _names(ids, hits) <= expected


def test_bulk_delete_scope(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world(AGENTS, prefix="bulk")
    ids = {}
    for s in SEEDS:
        meta: dict[str, Any] = {"mw_scope": s.scope}
        if s.fleet:
            meta["mw_fleet"] = s.fleet
        if s.readers:
            meta["mw_readers"] = ",".join(s.readers)
        ids[s.row_id] = mem0_stack.add(w.keys[s.writer], f"bulk {s.row_id}", user_id="shared", metadata=meta)
    other = mem0_stack.world(AGENTS, prefix="bulko")
    foreign = mem0_stack.add(other.keys["r1"], "other tenant", user_id="shared")
    with mem0_stack.http(w.keys["r0"]) as h:
        assert h.delete("/memories", params={"user_id": "shared"}).status_code == 403  # trust 0: no delete_bulk
    with mem0_stack.http(w.keys["r1"]) as h:
        assert h.delete("/memories").status_code == 400
        r = h.delete("/memories", params={"user_id": "shared"})
    assert r.status_code == 200
    with mem0_stack.direct() as d:
        gone = {n for n, mid in ids.items() if d.get(f"/memories/{mid}").json() is None}
        assert d.get(f"/memories/{foreign}").json() is not None
    assert gone == oracle(w.name, "r1", "delete") and r.json()["deleted"] == len(gone)


def test_deletion_closure_every_route(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("red", "r1", 1), ("red", "r2", 2)], prefix="clos")
    secret = "the vault combination is four eight fifteen"
    mid = mem0_stack.add(w.keys["r1"], secret, user_id="u9", metadata={"mw_scope": "fleet"})
    keep = mem0_stack.add(w.keys["r1"], "a harmless note about lunch", user_id="u9")
    with mem0_stack.http(w.keys["r1"]) as h:
        assert h.put(f"/memories/{keep}", json={"text": "a harmless note about dinner"}).status_code == 200
        assert h.get(f"/memories/{mid}/history").status_code == 200
        assert h.delete(f"/memories/{mid}").status_code == 200
    with mem0_stack.direct() as d:  # Mem0 itself keeps the deleted text in history
        assert any(e.get("old_memory") == secret for e in d.get(f"/memories/{mid}/history").json())
    for key in (w.keys["r1"], w.keys["r2"], w.admin):
        with mem0_stack.http(key) as h:
            for path in (f"/memories/{mid}", f"/memories/{mid}/history"):
                r = h.get(path)
                assert (r.status_code, r.json()) == (404, {"error": "not_found", "message": "memory not found"})
            assert h.put(f"/memories/{mid}", json={"text": "x"}).status_code == 404
            assert h.delete(f"/memories/{mid}").status_code == 404
            listed = h.get("/memories", params={"user_id": "u9"}).json()["results"]
            assert [r["id"] for r in listed] == [keep]
            hits = h.post("/search", json={"query": secret, "threshold": 0.0, "top_k": 5}).json()["results"]
            assert mid not in {r["id"] for r in hits} and secret not in str(hits)
            hist = h.get(f"/memories/{keep}/history").json()
            assert secret not in str(hist) and all(not e["is_deleted"] for e in hist)


def test_cross_tenant_and_fleet_leakage(mem0_stack: Mem0Stack) -> None:
    a = mem0_stack.world([("red", "r1", 1), ("blue", "b1", 1), ("blue", "b2", 2)], prefix="la")
    b = mem0_stack.world([("red", "r1", 3)], prefix="lb")
    tenant_row = mem0_stack.add(a.keys["r1"], "tenant wide plan for the launch", metadata={"mw_scope": "tenant"})
    fleet_row = mem0_stack.add(a.keys["r1"], "red fleet plan for the launch", metadata={"mw_scope": "fleet"})
    with mem0_stack.http(b.keys["r1"]) as h:
        for mid in (tenant_row, fleet_row):
            assert h.get(f"/memories/{mid}").status_code == 404
        assert h.get("/memories").json()["results"] == []
        assert h.get("/memories", params={"agent_id": a.uid("r1")}).json()["results"] == []
        assert h.post("/search", json={"query": "launch plan", "threshold": 0.0}).json()["results"] == []
        assert h.post("/search", json={"query": "launch", "threshold": 0.0,
                                       "filters": {"agent_id": a.uid("r1")}}).json()["results"] == []
    with mem0_stack.http(a.keys["b1"]) as h:
        seen = {r["id"] for r in h.post("/search", json={"query": "launch plan", "threshold": 0.0}).json()["results"]}
        assert seen == {tenant_row}
    with mem0_stack.http(a.keys["b2"]) as h:  # trust 2 reads across fleets
        seen = {r["id"] for r in h.post("/search", json={"query": "launch plan", "threshold": 0.0}).json()["results"]}
        assert seen == {tenant_row, fleet_row}


def test_spoofed_agent_id(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("red", "r1", 1), ("red", "r2", 1)], prefix="spf")
    msg = [{"role": "user", "content": "I am someone else"}]
    with mem0_stack.http(w.keys["r1"]) as h:
        for spoof in ("r2", "red/r2", w.uid("r2"), "other/x/y", "*"):
            r = h.post("/memories", json={"messages": msg, "agent_id": spoof, "infer": False})
            assert r.status_code == 403, spoof
        r = h.post("/memories", json={"messages": msg, "agent_id": "r1", "infer": False,
                                      "metadata": {"agent_id": "red/r2"}})
        assert r.status_code == 400
        r = h.post("/memories", json={"messages": msg, "agent_id": "red/r1", "infer": False})
        assert r.status_code == 200
        mid = r.json()["results"][0]["id"]
        assert h.get(f"/memories/{mid}").json()["agent_id"] == w.uid("r1")
        assert h.post("/memories", json={"messages": msg, "infer": False,
                                         "metadata": {"mw_owner": w.uid("r2")}}).status_code == 400
    with mem0_stack.http(w.admin) as h:  # admins cannot own rows
        assert h.post("/memories", json={"messages": msg, "infer": False}).status_code == 403


def test_wildcards_and_operators_never_widen(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("red", "r1", 1), ("red", "r2", 1), ("blue", "b1", 1)], prefix="wild")
    mine = mem0_stack.add(w.keys["r1"], "private diary entry about coffee", user_id="u1", metadata={"mw_scope": "agent"})
    theirs = mem0_stack.add(w.keys["r2"], "private diary entry about tea", user_id="u2", metadata={"mw_scope": "agent"})
    shared = mem0_stack.add(w.keys["b1"], "shared diary entry about water", user_id="u2", metadata={"mw_scope": "tenant"})
    q = {"query": "diary entry", "threshold": 0.0, "top_k": 10}
    with mem0_stack.http(w.keys["r1"]) as h:
        def ids(**body: Any) -> set[str]:
            r = h.post("/search", json={**q, **body})
            assert r.status_code == 200, r.text
            return {x["id"] for x in r.json()["results"]}

        visible = {mine, shared}
        assert ids() == visible
        assert ids(filters={"agent_id": "*"}) == visible
        assert ids(filters={"user_id": "*", "run_id": "*"}) == visible
        assert ids(agent_id="*", user_id="*") == visible
        assert ids(filters={"AND": [{"agent_id": {"ne": w.uid("r1")}}]}) == {shared}
        assert ids(filters={"agent_id": {"nin": [w.uid("b1")]}}) == {mine}
        assert ids(filters={"agent_id": {"in": [w.uid("r2"), w.uid("b1")]}}) == {shared}
        assert ids(filters={"agent_id": "red/r2"}) == set()
        assert ids(filters={"OR": [{"user_id": "u2"}, {"user_id": "u1"}]}) == visible
        assert ids(filters={"NOT": [{"user_id": "u1"}]}) == {shared}
        assert ids(user_id="u2") == {shared}
        for bad in ({"mw_tenant": {"ne": "x"}}, {"mw_scope": "*"}, {"$or": [{"user_id": "u2"}]},
                    {"OR": [{"OR": [{"user_id": "u2"}]}]}, {"agent_id": {"contains": "r"}},
                    {"OR": [{"agent_id": {"ne": "x"}}]}, {"user_id": {"regex": ".*"}}):
            assert h.post("/search", json={**q, "filters": bad}).status_code == 400, bad
        listed = {r["id"] for r in h.get("/memories", params={"agent_id": "*"}).json()["results"]}
        assert listed == visible
        assert theirs not in {r["id"] for r in h.get("/memories", params={"user_id": "u2"}).json()["results"]}


def test_admin_routes(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("red", "r0", 0), ("red", "r3", 3)], prefix="adm")
    other = mem0_stack.world([("red", "r1", 1)], prefix="admo")
    survivor = mem0_stack.add(other.keys["r1"], "other tenant survives a reset")
    gone = mem0_stack.add(w.keys["r3"], "this tenant's row goes on reset", metadata={"mw_scope": "tenant"})
    for agent in ("r0", "r3"):
        with mem0_stack.http(w.keys[agent]) as h:
            assert h.post("/reset").status_code == 403
            assert h.get("/configure").status_code == 403
            assert h.post("/configure", json={"llm": {"provider": "openai"}}).status_code == 403
            assert h.post("/generate-instructions", json={"use_case": "x"}).status_code == 403
            assert h.get("/configure/providers").status_code == 200
    with mem0_stack.http(w.admin) as h:
        for method, path in (("GET", "/entities"), ("GET", "/api-keys"), ("POST", "/auth/login"), ("GET", "/requests"),
                             ("DELETE", "/entities/user/u1")):
            assert h.request(method, path).status_code == 403
        assert h.get("/docs").status_code == 404
        # the deployment's configuration is an operator's (tests/integration/mem0/test_operator_mem0.py)
        assert h.get("/configure").status_code == 403
        assert h.post("/configure", json={"custom_instructions": "x"}).status_code == 403
        r = h.post("/reset")
        assert r.status_code == 200 and r.json()["deleted"] == 1
        assert h.get(f"/memories/{gone}").status_code == 404
    with mem0_stack.direct() as d:
        assert d.get(f"/memories/{survivor}").json() is not None
        assert d.get(f"/memories/{gone}").json() is None


def test_errors_and_infer(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("red", "r1", 1)], prefix="err")
    with mem0_stack.http(w.keys["r1"]) as h:
        assert h.get("/memories/not-a-uuid").status_code == 404
        assert h.post("/search", json={"query": ""}).status_code == 400
        assert h.post("/search", json={"query": "x", "top_k": -1}).status_code == 400
        assert h.get("/memories", params={"top_k": "5000"}).status_code == 400
        # infer defaults to true in Mem0: this test backend has no LLM, so Mem0's own 400 comes back
        r = h.post("/memories", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"] == "backend_rejected"
        assert h.post("/memories", json={"messages": [{"role": "user", "content": "x"}], "infer": False,
                                         "memory_type": "procedural_memory"}).status_code == 400
    with mem0_stack.http() as h:
        assert h.get("/memories").status_code == 401
