"""The visibility filter sent as the ledger's id list (``ID_PUSHDOWN_MAX``, docs/design.md §2.7) against a real
Chroma: the ledger lists exactly the governed rows that Chroma's own evaluation of the metadata filter
(`visibility_where`) admits, for principals of every trust and a tenant admin; reads through a sidecar using
the id list answer exactly what a sidecar using the metadata filter answers (query at several k, get with and
without a client filter, limit and offset, count); and a query whose id list names a row Chroma no longer holds
(deleted straight in Chroma) is answered under the metadata filter instead of failing."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from sidecar.backends.chroma import visibility_reader, visibility_where
from sidecar.governance import Principal
from tests.integration.conftest import Stack, Tenant, unit_vectors

pytestmark = pytest.mark.integration

AGENTS = [("red", "r1", 1), ("red", "r0", 0), ("blue", "b2", 2), ("blue", "b3", 3), ("green", "g1", 1)]


def _ledger_calls(stack: Stack, method: str) -> float:
    assert stack.sidecar.metrics_url
    text = httpx.get(stack.sidecar.metrics_url, timeout=10, trust_env=False).text
    m = re.search(rf'^memwarden_ledger_call_duration_seconds_count\{{method="{method}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def world(stack: Stack) -> tuple[Tenant, list[str]]:
    t = stack.tenant("idp")
    for fleet, agent, trust in AGENTS:
        t.keys[agent] = stack.key(t.name, fleet, agent, trust)
    v = unit_vectors(122, dim=8, seed=21)
    ids: list[str] = []
    n = 0
    for fleet, agent, trust in AGENTS:
        if trust < 1:
            continue
        coll = stack.client(t.keys[agent], t.name).get_collection(t.collection)
        for scope in ("agent", "fleet", "tenant", "restricted"):
            for j in range(6):
                meta: dict[str, Any] = {"mw_scope": scope, "topic": "even" if j % 2 == 0 else "odd"}
                if scope == "restricted":
                    meta["mw_readers"] = "red/r0" if j % 3 == 0 else "blue/b2,green/g1"
                row_id = f"{agent}-{scope}-{j}"
                coll.add(ids=[row_id], embeddings=[v[n]], documents=[f"doc {row_id}"], metadatas=[meta])
                ids.append(row_id)
                n += 1
    # one of each writer's tenant rows deleted through the sidecar (tombstoned, gone from Chroma)
    for fleet, agent, trust in AGENTS:
        if trust >= 1:
            stack.client(t.keys[agent], t.name).get_collection(t.collection).delete(ids=[f"{agent}-tenant-5"])
            ids.remove(f"{agent}-tenant-5")
    # written straight to Chroma with forged governance metadata: admitted by the metadata filter, never governed
    stack.direct(t.name).get_collection(t.collection).add(
        ids=["forged"], embeddings=[v[120]], documents=["forged"],
        metadatas=[{"mw_tenant": t.name, "mw_scope": "tenant", "mw_fleet": "red", "mw_owner": "x", "topic": "even"}])
    t.keys["admin"] = t.admin_key
    return t, ids


def _principal(t: Tenant, who: str) -> Principal:
    if who == "admin":
        return Principal("admin", "k", t.name)
    fleet, agent, trust = next(a for a in AGENTS if a[1] == who)
    return Principal("agent", "k", t.name, fleet, agent, trust)


@pytest.mark.parametrize("who", [a for _, a, _ in AGENTS] + ["admin"])
@pytest.mark.parametrize("mode", ["scope", "tenant"])
def test_ledger_list_is_what_chroma_admits(stack: Stack, world: tuple[Tenant, list[str]], who: str, mode: str) -> None:
    t, ids = world
    p = _principal(t, who)
    direct = stack.direct(t.name).get_collection(t.collection)
    by_chroma = set(direct.get(where=visibility_where(p, mode), include=[])["ids"])
    assert "forged" in by_chroma  # Chroma reads metadata; the ledger knows no such row
    ledger = stack.ledger()
    try:
        listed = ledger.visible_row_ids("chroma", t.collection_id, t.name, visibility_reader(p, mode), 10_000)
    finally:
        ledger.close()
    assert listed is not None
    assert sorted(listed) == sorted(by_chroma - {"forged"})
    assert 0 < len(listed) <= len(ids)  # not degenerate: something admitted, and never a deleted row
    if mode == "scope" and who != "admin":
        assert len(listed) < len(ids)  # something withheld


@pytest.mark.parametrize("who", [a for _, a, _ in AGENTS] + ["admin"])
def test_reads_agree_with_the_metadata_filter(stack: Stack, pushdown_stack: Stack, where_pushdown_stack: Stack,
                                              world: tuple[Tenant, list[str]], who: str) -> None:
    t, _ = world
    before = _ledger_calls(pushdown_stack, "visible_row_ids")
    by_ids = pushdown_stack.client(t.keys[who], t.name).get_collection(t.collection)
    by_where = where_pushdown_stack.client(t.keys[who], t.name).get_collection(t.collection)
    default = stack.client(t.keys[who], t.name).get_collection(t.collection)
    queries = unit_vectors(3, dim=8, seed=22)
    for k in (1, 5, 40):
        a = by_ids.query(query_embeddings=queries, n_results=k, include=["distances", "metadatas"])
        b = by_where.query(query_embeddings=queries, n_results=k, include=["distances", "metadatas"])
        c = default.query(query_embeddings=queries, n_results=k, include=["distances", "metadatas"])
        assert a["ids"] == b["ids"] == c["ids"]
        assert a["distances"] == b["distances"] == c["distances"]
        assert a["metadatas"] == b["metadatas"]
    a_odd = by_ids.query(query_embeddings=queries, n_results=5, where={"topic": "odd"})
    assert a_odd["ids"] == by_where.query(query_embeddings=queries, n_results=5, where={"topic": "odd"})["ids"]
    assert all(i.endswith(("-1", "-3", "-5")) for row in a_odd["ids"] for i in row)
    everything = by_ids.get(include=["metadatas"])
    assert everything == by_where.get(include=["metadatas"])
    assert "forged" not in everything["ids"] and everything["ids"]
    assert by_ids.get(where={"topic": "even"})["ids"] == by_where.get(where={"topic": "even"})["ids"]
    assert by_ids.get(limit=4, offset=3)["ids"] == by_where.get(limit=4, offset=3)["ids"] == everything["ids"][3:7]
    assert by_ids.count() == by_where.count() == len(everything["ids"])
    # the id list was used (a query's pushdown, a get without ids and a count each list the rows)
    assert _ledger_calls(pushdown_stack, "visible_row_ids") >= before + 7


def test_row_missing_from_chroma_falls_back_to_the_metadata_filter(stack: Stack, pushdown_stack: Stack,
                                                                   where_pushdown_stack: Stack) -> None:
    t = stack.tenant("idmiss")
    writer = stack.key(t.name, "red", "w", 1)
    other = stack.key(t.name, "red", "o", 1)
    v = unit_vectors(41, dim=8, seed=23)
    stack.client(writer, t.name).get_collection(t.collection).add(
        ids=[f"m{i}" for i in range(10)], embeddings=v[:10], metadatas=[{"mw_scope": "agent"}] * 10)
    stack.client(other, t.name).get_collection(t.collection).add(
        ids=[f"o{i}" for i in range(30)], embeddings=v[10:40], metadatas=[{"mw_scope": "agent"}] * 30)
    stack.direct(t.name).get_collection(t.collection).delete(ids=["m3"])  # behind the sidecar's back
    by_ids = pushdown_stack.client(writer, t.name).get_collection(t.collection)
    by_where = where_pushdown_stack.client(writer, t.name).get_collection(t.collection)
    for _ in range(2):  # the failing id list, then the collection's back-off period
        got = by_ids.query(query_embeddings=[v[40]], n_results=4, include=["distances"])
        want = by_where.query(query_embeddings=[v[40]], n_results=4, include=["distances"])
        assert got["ids"] == want["ids"] and len(got["ids"][0]) == 4 and "m3" not in got["ids"][0]
    assert sorted(by_ids.get()["ids"]) == sorted(f"m{i}" for i in range(10) if i != 3)  # get ignores a missing id
    deadline = time.monotonic() + 10
    while "id_pushdown_failed" not in pushdown_stack.sidecar.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the fallback was not logged"
        time.sleep(0.1)
