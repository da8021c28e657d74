"""``GET /_memwarden/memories/{id}/lineage`` through the real sidecar in front of a real Chroma server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from tests.integration.conftest import POLICIES, Stack, Tenant, unit_vectors

pytestmark = pytest.mark.integration
V = unit_vectors(8, seed=33)


def data(t: Tenant, op: str) -> str:
    return f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}/{op}"


def lineage(http: httpx.Client, t: Tenant, row_id: str, **params: str) -> httpx.Response:
    return http.get(f"/_memwarden/memories/{row_id}/lineage", params={"collection": t.collection_id, **params})


def add(http: httpx.Client, t: Tenant, row_id: str, text: str, i: int, **meta: str) -> None:
    body: dict[str, Any] = {"ids": [row_id], "embeddings": [V[i]], "documents": [text], "metadatas": [meta or {"mw_scope": "fleet"}]}
    r = http.post(data(t, "add"), json=body)
    assert r.status_code == 200, r.text


def by_id(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in body["nodes"] if "id" in n}


@pytest.fixture(scope="module")
def chain(stack: Stack) -> Tenant:
    """root (fleet) ← mid ← leaf, and leaf ← private (w's agent scope): all written by w of fleet red."""
    t = stack.tenant("lin")
    for name, fleet, trust in (("w", "red", 1), ("peer", "red", 1), ("blue", "blue", 1)):
        t.keys[name] = stack.key(t.name, fleet, name, trust)
    with stack.http(t.keys["w"]) as http:
        add(http, t, "root", "the incident began at 09:00", 0)
        add(http, t, "mid", "the outage followed the 09:00 deploy", 1, mw_derived_from="root")
        add(http, t, "private", "w's private hunch: the cache is to blame", 2, mw_scope="agent")
        add(http, t, "leaf", "postmortem: cache config in the 09:00 deploy", 3, mw_derived_from="mid,private")
    return t


def test_owner_sees_the_whole_chain_with_writer_and_time(stack: Stack, chain: Tenant) -> None:
    with stack.http(chain.keys["w"]) as http:
        r = lineage(http, chain, "leaf")
        got = http.post(data(chain, "get"), json={"ids": ["root", "mid", "private", "leaf"]}).json()
    meta = dict(zip(got["ids"], got["metadatas"]))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["memory"] == "leaf" and body["truncated"] is False
    nodes = by_id(body)
    assert set(nodes) == {"leaf", "mid", "private", "root"} and len(body["nodes"]) == 4
    assert {n: nodes[n]["depth"] for n in nodes} == {"leaf": 0, "mid": 1, "private": 1, "root": 2}
    number = {n: nodes[n]["node"] for n in nodes}
    assert sorted(nodes["leaf"]["parents"]) == sorted([number["mid"], number["private"]])
    assert nodes["mid"]["parents"] == [number["root"]] and nodes["root"]["parents"] == []
    for row_id, node in nodes.items():  # writer and time are the ones stamped at write time
        assert node["writer"] == f"{chain.name}/red/w" and node["collection"] == chain.collection_id
        assert node["created_at_us"] == meta[row_id]["mw_created_at"] and node["created_at"].endswith("Z")
        assert node["source"] == meta[row_id]["mw_source"] and node["status"] == "active"


def test_an_unreadable_ancestor_is_a_placeholder_without_id_or_content(stack: Stack, chain: Tenant) -> None:
    with stack.http(chain.keys["peer"]) as http:  # same fleet, cannot read w's agent-scoped row
        r = lineage(http, chain, "leaf")
    assert r.status_code == 200
    body = r.json()
    assert set(by_id(body)) == {"leaf", "mid", "root"}
    placeholders = [n for n in body["nodes"] if "id" not in n]
    assert placeholders == [{"node": placeholders[0]["node"], "depth": 1, "redacted": True, "parents": []}]
    assert "private" not in r.text and "hunch" not in r.text


def test_placeholder_position_does_not_reveal_how_its_id_sorts(stack: Stack, chain: Tenant) -> None:
    orders = []
    for secret in ("a-secret", "m-secret", "zz-secret"):  # sorts before, between and after the readable parents
        with stack.http(chain.keys["w"]) as http:
            add(http, chain, f"b-{secret}", "public parent b", 0)
            add(http, chain, f"y-{secret}", "public parent y", 1)
            add(http, chain, secret, "w's private parent", 2, mw_scope="agent")
            add(http, chain, f"kid-{secret}", "the child", 3, mw_derived_from=f"y-{secret},{secret},b-{secret}")
        with stack.http(chain.keys["peer"]) as http:
            body = lineage(http, chain, f"kid-{secret}").json()
        orders.append([n.get("id", "?").replace(secret, "S") for n in body["nodes"]])
        assert body["nodes"][0]["parents"] == [1, 2, 3]
    assert orders == [["kid-S", "b-S", "y-S", "?"]] * 3


def test_returned_metadata_names_only_readable_parents(stack: Stack, chain: Tenant) -> None:
    def derived_from(key: str) -> list[str | None]:
        with stack.http(key) as http:
            got = http.post(data(chain, "get"), json={"ids": ["leaf", "mid"]}).json()
            q = http.post(data(chain, "query"), json={"query_embeddings": [V[3]], "n_results": 2, "include": ["metadatas"]}).json()
        shown = dict(zip(got["ids"], got["metadatas"]))
        assert dict(zip(q["ids"][0], q["metadatas"][0]))["leaf"].get("mw_derived_from") == shown["leaf"].get("mw_derived_from")
        return [shown[i].get("mw_derived_from") for i in ("leaf", "mid")]
    assert derived_from(chain.keys["w"]) == ["mid,private", "root"]
    assert derived_from(chain.keys["peer"]) == ["mid", "root"]  # w's agent-scoped parent is not named


@pytest.mark.parametrize("where", [
    {"mw_derived_from": "mid,private"},
    {"mw_derived_from": {"$in": ["mid,private", "mid,guess"]}},
    {"$and": [{"mw_scope": "fleet"}, {"$or": [{"mw_derived_from": {"$ne": "mid"}}, {"x": 1}]}]},
    {"mw_superseded_by": "x"},
    {"mw_unknown": "x"},
])
def test_filters_on_governed_keys_that_name_unreadable_rows_are_refused(stack: Stack, chain: Tenant,
                                                                      where: dict[str, Any]) -> None:
    """Before, ``where {"mw_derived_from": "mid,private"}`` returned leaf to peer, confirming that w's
    private row is one of its parents although metadata and lineage hide it (also by ``$in`` over guesses)."""
    with stack.http(chain.keys["peer"]) as http:
        for op, extra in (("get", {}), ("query", {"query_embeddings": [V[3]], "n_results": 2}), ("delete", {})):
            r = http.post(data(chain, op), json={"where": where, **extra})
            assert r.status_code == 400 and "may not filter on" in r.json()["message"], (op, r.text)
        # governed keys whose stored value is what a reader sees stay filterable
        ok = http.post(data(chain, "get"), json={"where": {"mw_owner": f"{chain.name}/red/w"}, "include": []})
        assert ok.status_code == 200 and "leaf" in ok.json()["ids"]


def test_unreadable_missing_and_foreign_starts_answer_the_same_404(stack: Stack, chain: Tenant) -> None:
    other = stack.tenant("lin-other")
    other_key = stack.key(other.name, "red", "w", 3)
    answers = []
    with stack.http(chain.keys["blue"]) as http:  # another fleet: cannot read leaf
        answers.append(lineage(http, chain, "leaf"))
        answers.append(lineage(http, chain, "never-existed"))
    with stack.http(other_key) as http:  # another tenant naming this tenant's collection
        foreign = lineage(http, chain, "leaf")
    assert [(a.status_code, a.json()) for a in answers] == [(404, {"error": "not_found", "message": "memory not found"})] * 2
    assert foreign.status_code == 404 and "leaf" not in foreign.text


def test_bad_requests_are_refused_before_any_lookup(stack: Stack, chain: Tenant) -> None:
    with stack.http(chain.keys["w"]) as http:
        assert http.get("/_memwarden/memories/leaf/lineage").status_code == 400  # no collection
        assert lineage(http, chain, "leaf", include_superseded="yes").status_code == 400
        assert lineage(http, chain, "leaf", max_nodes="0").status_code == 400
        assert lineage(http, chain, "leaf", depth="3").status_code == 400  # unknown parameter
        assert http.post(f"/_memwarden/memories/leaf/lineage?collection={chain.collection_id}").status_code == 404
        assert http.get("/_memwarden/memories/leaf").status_code == 404
        assert http.get("/_memwarden/memories/leaf/lineage/x").status_code == 404
    with stack.http() as http:
        assert lineage(http, chain, "leaf").status_code == 401
    with stack.http("mw_bogus.key") as http:
        assert lineage(http, chain, "leaf").status_code == 401


def test_max_nodes_truncates_breadth_first(stack: Stack, chain: Tenant) -> None:
    with stack.http(chain.keys["w"]) as http:
        body = lineage(http, chain, "leaf", max_nodes="2").json()
    assert body["truncated"] is True and len(body["nodes"]) == 2 and body["nodes"][0]["id"] == "leaf"
    assert all(p < 2 for n in body["nodes"] for p in n["parents"])


def test_superseded_start_needs_include_superseded_and_deleted_start_is_gone(stack: Stack, chain: Tenant) -> None:
    with stack.http(chain.keys["w"]) as http:
        add(http, chain, "v1", "api status paused", 4, mw_subject="lin-api", mw_predicate="status", mw_object="paused")
        add(http, chain, "v2", "api status running", 5, mw_subject="lin-api", mw_predicate="status", mw_object="running",
            mw_derived_from="v1")
        assert lineage(http, chain, "v1").status_code == 404
        shown = lineage(http, chain, "v1", include_superseded="true")
        assert shown.status_code == 200 and shown.json()["nodes"][0]["status"] == "superseded"
        # a superseded ancestor is part of the history and shown when readable
        assert by_id(lineage(http, chain, "v2").json())["v1"]["status"] == "superseded"
        add(http, chain, "gone", "to be forgotten", 6)
        add(http, chain, "gone-child", "derived from the forgotten", 7, mw_derived_from="gone")
        assert http.post(data(chain, "delete"), json={"ids": ["gone"]}).json() == {"deleted": 1}
        deleted = [lineage(http, chain, i) for i in ("gone", "gone-child", "never-existed")]
    assert {(r.status_code, r.text) for r in deleted} == {(404, deleted[2].text)}


def test_redact_closure_keeps_the_child_and_hides_the_deleted_parent(chroma_server: Server, tmp_path: Path) -> None:
    side = start_sidecar(chroma_server.url, tmp_path / "ledger.db", POLICIES, extra_env={"MEMWARDEN_DELETION_CLOSURE": "redact"})
    try:
        stack = Stack(chroma_server, side, tmp_path / "ledger.db")
        t = stack.tenant("redact")
        w = stack.key(t.name, "red", "w", 1)
        with stack.http(w) as http:
            add(http, t, "p", "the deleted parent's words", 0)
            add(http, t, "q", "a private parent", 1, mw_scope="agent")
            add(http, t, "c", "the child", 2, mw_derived_from="p,q")
            assert http.post(data(t, "delete"), json={"ids": ["p"]}).json() == {"deleted": 1}
            assert http.post(data(t, "get"), json={"ids": ["c"]}).json()["ids"] == ["c"]  # redact keeps the child
            owner_view = lineage(http, t, "c").json()
        with stack.http(stack.key(t.name, "red", "peer", 1)) as http:
            peer_view = lineage(http, t, "c").json()
        # the deleted parent is a placeholder for everyone, shaped like an unreadable one
        assert set(by_id(owner_view)) == {"c", "q"}
        assert set(by_id(peer_view)) == {"c"}
        strip = [{k: v for k, v in n.items() if k != "node"} for n in peer_view["nodes"] if "id" not in n]
        assert strip == [{"depth": 1, "redacted": True, "parents": []}] * 2
        assert "words" not in json.dumps(owner_view) and '"p"' not in json.dumps(owner_view)
    finally:
        side.stop()
