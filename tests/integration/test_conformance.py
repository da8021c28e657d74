"""Conformance: for each principal and action, the ids the sidecar returns or affects equal the ids the
Cedar engine (cedarpy, default policies) allows per seeded row. The engine is the oracle; the entity
store is built here, independently of the sidecar's code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy
import pytest

from tests.integration.conftest import POLICIES, Stack, Tenant, unit_vectors

pytestmark = pytest.mark.integration

SCHEMA = (POLICIES / "memwarden.cedarschema").read_text()
POLICY_SET = "\n".join(p.read_text() for p in sorted(Path(POLICIES).glob("*.cedar")))

# (fleet, agent, trust) of the tenant's agents; "admin" is the tenant admin.
AGENTS = [("red", "r0", 0), ("red", "r1", 1), ("red", "r2", 2), ("red", "r3", 3), ("blue", "b1", 1), ("blue", "b2", 2)]


@dataclass(frozen=True)
class Seed:
    row_id: str
    writer: str  # agent name
    scope: str
    fleet: str | None = None  # requested fleet (cross-fleet needs trust 3)
    readers: tuple[str, ...] = ()  # "fleet/agent"
    topic: str = "alpha"


SEEDS = [
    Seed("r1-agent", "r1", "agent"), Seed("r1-fleet", "r1", "fleet", topic="beta"),
    Seed("r1-tenant", "r1", "tenant"), Seed("r1-restricted", "r1", "restricted", readers=("red/r0", "blue/b2"), topic="beta"),
    Seed("r3-agent", "r3", "agent", topic="beta"), Seed("r3-blue-fleet", "r3", "fleet", fleet="blue"),
    Seed("r3-restricted", "r3", "restricted", readers=("red/r3",)),
    Seed("b1-agent", "b1", "agent"), Seed("b1-fleet", "b1", "fleet", topic="beta"), Seed("b1-tenant", "b1", "tenant"),
    Seed("b1-restricted", "b1", "restricted", readers=("red/r2",)),
]


def _uid(tenant: str, fleet: str, agent: str) -> dict[str, str]:
    return {"type": "Agent", "id": f"{tenant}/{fleet}/{agent}"}


def oracle(tenant: str, principal: str, action: str) -> set[str]:
    """Row ids of SEEDS for which cedarpy answers Allow for (principal, action, row)."""
    fleets = {a: (f, t) for f, a, t in AGENTS}
    ent = lambda t, i: {"__entity": {"type": t, "id": i}}  # noqa: E731
    entities: list[dict[str, Any]] = [{"uid": {"type": "Tenant", "id": tenant}, "attrs": {}, "parents": []}]
    for fleet in ("red", "blue"):
        entities.append({"uid": {"type": "Fleet", "id": f"{tenant}/{fleet}"}, "attrs": {"tenant": ent("Tenant", tenant)},
                         "parents": [{"type": "Tenant", "id": tenant}]})
    for fleet, agent, trust in AGENTS:
        entities.append({"uid": _uid(tenant, fleet, agent), "attrs": {
            "tenant": ent("Tenant", tenant), "fleet": ent("Fleet", f"{tenant}/{fleet}"), "trust": trust, "roles": []},
            "parents": [{"type": "Fleet", "id": f"{tenant}/{fleet}"}]})
    if principal == "admin":
        p = {"type": "TenantAdmin", "id": f"{tenant}/admin"}
        entities.append({"uid": p, "attrs": {"tenant": ent("Tenant", tenant)}, "parents": []})
    else:
        p = _uid(tenant, fleets[principal][0], principal)
    requests = []
    for s in SEEDS:
        home = fleets[s.writer][0]
        fleet = s.fleet or home
        entities.append({"uid": {"type": "Memory", "id": s.row_id}, "attrs": {
            "tenant": ent("Tenant", tenant), "fleet": ent("Fleet", f"{tenant}/{fleet}"),
            "owner": ent("Agent", f"{tenant}/{home}/{s.writer}"), "scope": s.scope, "status": "active",
            "readers": [ent("Agent", f"{tenant}/{r}") for r in s.readers], "labels": []},
            "parents": [{"type": "Fleet", "id": f"{tenant}/{fleet}"}]})
        requests.append({"principal": p, "action": {"type": "Action", "id": action},
                         "resource": {"type": "Memory", "id": s.row_id}, "context": {}})
    results = cedarpy.is_authorized_batch(requests, POLICY_SET, entities, SCHEMA)
    return {s.row_id for s, r in zip(SEEDS, results) if r.decision == cedarpy.Decision.Allow}


PRINCIPALS = [a for _, a, _ in AGENTS] + ["admin"]
EMB = dict(zip([s.row_id for s in SEEDS] + ["ungoverned"], unit_vectors(len(SEEDS) + 1, seed=7)))


def seed_collection(stack: Stack, t: Tenant, collection: str) -> None:
    """Write SEEDS through the sidecar with each writer's own key; add one ungoverned row directly."""
    for s in SEEDS:
        meta: dict[str, Any] = {"mw_scope": s.scope, "topic": s.topic}
        if s.fleet:
            meta["mw_fleet"] = s.fleet
        if s.readers:
            meta["mw_readers"] = ",".join(s.readers)
        coll = stack.client(t.keys[s.writer], t.name).get_collection(collection)
        coll.add(ids=[s.row_id], embeddings=[EMB[s.row_id]], documents=[f"doc {s.row_id} in {collection}"], metadatas=[meta])
    direct = stack.direct(t.name).get_collection(collection)
    # Written straight to the backend, with forged governance metadata: must never be served.
    direct.add(ids=["ungoverned"], embeddings=[EMB["ungoverned"]], documents=["forged"],
               metadatas=[{"mw_tenant": t.name, "mw_scope": "tenant", "mw_fleet": "red", "mw_owner": "x", "topic": "alpha"}])


@pytest.fixture(scope="module")
def world(stack: Stack) -> Tenant:
    t = stack.tenant("conf")
    for fleet, agent, trust in AGENTS:
        t.keys[agent] = stack.key(t.name, fleet, agent, trust)
    t.keys["admin"] = t.admin_key
    seed_collection(stack, t, t.collection)
    return t


ALL_IDS = [s.row_id for s in SEEDS] + ["ungoverned"]


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_reads_match_cedar(stack: Stack, world: Tenant, principal: str) -> None:
    expected = oracle(world.name, principal, "read")
    assert expected and expected != set(ALL_IDS), "degenerate oracle"
    coll = stack.client(world.keys[principal], world.name).get_collection(world.collection)

    assert set(coll.get(ids=ALL_IDS)["ids"]) == expected
    assert set(coll.get()["ids"]) == expected
    alpha = {s.row_id for s in SEEDS if s.topic == "alpha"}
    assert set(coll.get(where={"topic": "alpha"})["ids"]) == expected & alpha
    got = coll.query(query_embeddings=[EMB["r1-agent"]], n_results=len(ALL_IDS))
    assert set(got["ids"][0]) == expected
    assert coll.count() == len(expected)


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_delete_matches_cedar(stack: Stack, world: Tenant, principal: str) -> None:
    name = f"del-{principal}"
    stack.client(world.admin_key, world.name).create_collection(name)
    seed_collection(stack, world, name)
    expected = oracle(world.name, principal, "delete")
    direct = stack.direct(world.name).get_collection(name)
    before = set(direct.get()["ids"])
    assert before == set(ALL_IDS)

    coll = stack.client(world.keys[principal], world.name).get_collection(name)
    coll.delete(ids=ALL_IDS)
    deleted = before - set(direct.get()["ids"])
    assert deleted == expected
    assert "ungoverned" not in deleted
    # Tombstoned ids are never served again, not even to the tenant admin.
    admin = stack.client(world.admin_key, world.name).get_collection(name)
    assert not (set(admin.get()["ids"]) & expected)


def test_bulk_delete_by_where_matches_cedar(stack: Stack, world: Tenant) -> None:
    stack.client(world.admin_key, world.name).create_collection("del-where")
    seed_collection(stack, world, "del-where")
    direct = stack.direct(world.name).get_collection("del-where")
    coll = stack.client(world.keys["r1"], world.name).get_collection("del-where")
    coll.delete(where={"topic": "beta"})
    deleted = set(ALL_IDS) - set(direct.get()["ids"])
    beta = {s.row_id for s in SEEDS if s.topic == "beta"}
    expected = oracle(world.name, "r1", "delete") & beta
    assert expected and deleted == expected


def test_trust_zero_cannot_bulk_delete(stack: Stack, world: Tenant) -> None:
    with stack.http(world.keys["r0"]) as http:
        r = http.post(f"/api/v2/tenants/{world.name}/databases/default_database/collections/{world.collection_id}/delete",
                      json={"where": {"topic": "alpha"}})
    assert r.status_code == 403
