"""Collections through the sidecar with the official client: opening an existing collection is a read-level
decision (Cedar `list` on it), creating one is `create_collection` on the namespace, and a collection Chroma
holds that the ledger does not know is 409 "adopt it first" on every route that names it — never adopted."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Stack, Tenant, unit_vectors

pytestmark = pytest.mark.integration

ADOPT = "adopt it first: memwarden adopt chroma"


@pytest.fixture(scope="module")
def world(stack: Stack) -> Tenant:
    t = stack.tenant("coll")
    t.keys["r0"] = stack.key(t.name, "red", "r0", 0)
    t.keys["r3"] = stack.key(t.name, "red", "r3", 3)
    return t


def _registered(stack: Stack, collection_id: str) -> bool:
    ledger = stack.ledger()
    try:
        return ledger.get_collection("chroma", collection_id) is not None
    finally:
        ledger.close()


def test_agents_open_an_existing_collection(stack: Stack, world: Tenant) -> None:
    for agent in ("r0", "r3"):  # trust 0 opens it too: opening is a read
        client = stack.client(world.keys[agent], world.name)
        assert str(client.get_or_create_collection(world.collection).id) == world.collection_id
        assert str(client.get_collection(world.collection).id) == world.collection_id
        with stack.http(world.keys[agent]) as http:
            r = http.get(f"/api/v2/tenants/{world.name}/databases/default_database/collections/by-id/{world.collection_id}")
        assert r.status_code == 200 and r.json()["id"] == world.collection_id


def test_get_or_create_of_an_existing_collection_changes_nothing(stack: Stack, world: Tenant) -> None:
    before = stack.direct(world.name).get_collection(world.collection).metadata
    stack.client(world.keys["r3"], world.name).get_or_create_collection(world.collection, metadata={"hnsw:space": "ip", "x": 1})
    assert stack.direct(world.name).get_collection(world.collection).metadata == before


def test_creating_a_collection_needs_create_collection(stack: Stack, world: Tenant) -> None:
    for agent in ("r0", "r3"):
        client = stack.client(world.keys[agent], world.name)
        with pytest.raises(Exception, match="not permitted|Forbidden|403"):
            client.get_or_create_collection(f"new-by-{agent}")
        with pytest.raises(Exception, match="not permitted|Forbidden|403"):
            client.create_collection(f"new-by-{agent}")
    names = {c.name for c in stack.direct(world.name).list_collections()}
    assert not names & {"new-by-r0", "new-by-r3"}  # nothing reached Chroma
    admin = stack.client(world.admin_key, world.name)
    made = admin.get_or_create_collection("made-by-admin")
    assert _registered(stack, str(made.id))
    assert str(stack.client(world.keys["r0"], world.name).get_collection("made-by-admin").id) == str(made.id)


@pytest.mark.parametrize("rows", [0, 3])
def test_a_collection_made_straight_in_chroma_is_409_until_adopted(stack: Stack, world: Tenant, rows: int) -> None:
    name = f"legacy-{rows}"
    direct = stack.direct(world.name).create_collection(name)
    if rows:  # Chroma 1.5.9 reports log_position 0 for this collection too: existence is asked by name
        direct.add(ids=[f"x{i}" for i in range(rows)], embeddings=unit_vectors(rows), documents=["d"] * rows)
    for who in (world.keys["r0"], world.keys["r3"], world.admin_key):
        client = stack.client(who, world.name)
        for open_it in (client.get_collection, client.get_or_create_collection):
            with pytest.raises(Exception, match=ADOPT):
                open_it(name)
    admin = stack.client(world.admin_key, world.name)
    with pytest.raises(Exception, match=ADOPT):
        admin.create_collection(name)
    base = f"/api/v2/tenants/{world.name}/databases/default_database/collections"
    with stack.http(world.admin_key) as http:
        assert http.get(f"{base}/by-id/{direct.id}").status_code == 409
        assert http.delete(f"{base}/{name}").status_code == 409
        assert http.post(f"{base}/{direct.id}/get", json={}).status_code == 404  # data routes: unknown UUID
    assert not _registered(stack, str(direct.id))
    assert direct.count() == rows
    assert name not in {c.name for c in admin.list_collections()}


def test_another_tenants_collection_is_404_not_409(stack: Stack, world: Tenant) -> None:
    other = stack.tenant("collother")
    foreign = stack.direct(other.name).create_collection("foreign-legacy")
    base = f"/api/v2/tenants/{world.name}/databases/default_database/collections"
    with stack.http(world.admin_key) as http:
        for cid in (foreign.id, other.collection_id):
            r = http.get(f"{base}/by-id/{cid}")
            assert r.status_code == 404, r.text
    with stack.http(world.admin_key) as http:  # the other tenant's path is denied before Chroma is asked
        r = http.get(f"/api/v2/tenants/{other.name}/databases/default_database/collections/foreign-legacy")
    assert r.status_code == 403
