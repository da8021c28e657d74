"""Collections through the sidecar with the official client: opening an existing collection is a read-level
decision (Cedar `list` on it), creating one is `create_collection` on the namespace, and a collection Chroma
holds that the ledger does not know is 409 "adopt it first" on every route that names it — never adopted."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from memwarden_eval.harness import Server, start_sidecar
from tests.integration.conftest import POLICIES, Stack, Tenant, admin_client, unit_vectors

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


def test_a_create_whose_registration_failed_is_completed_by_a_retry(chroma_server: Server, tmp_path: Path) -> None:
    """Creation is crash-safe: the create intent is in the ledger before Chroma is called and its nonce in the new
    collection's metadata. With the ledger registration failing after Chroma's create (failpoint), the collection
    Chroma made is registered on the next open — for its creator — and the creator's retry succeeds; a collection
    made around the sidecar under the same name, or carrying a nonce the ledger never recorded, stays 409."""
    side = start_sidecar(chroma_server.url, tmp_path / "ledger.db", POLICIES,
                         extra_env={"MEMWARDEN_FAILPOINTS": "register-collection"})
    try:
        stack = Stack(chroma_server, side, tmp_path / "ledger.db")
        tenant = f"crc{uuid.uuid4().hex[:10]}"
        admin = stack.key(tenant)
        adm = admin_client(side.port, {"X-API-Key": admin})
        adm.create_tenant(tenant)
        adm.create_database("default_database", tenant=tenant)
        client = stack.client(admin, tenant)
        agent = stack.client(stack.key(tenant, "red", "a1", 1), tenant)
        creator = f"{tenant}/admin/{admin.removeprefix('mwk_').split('.')[0]}"

        for name, retry in (("by-get-or-create", "get_or_create"), ("by-create", "create")):
            with pytest.raises(Exception, match="500|[Ii]nternal"):
                client.create_collection(name, metadata={"topic": "ops"})
            made = stack.direct(tenant).get_collection(name)  # Chroma made it; the ledger did not register it
            assert not _registered(stack, str(made.id))
            again = client.get_or_create_collection(name) if retry == "get_or_create" else client.create_collection(name)
            assert str(again.id) == str(made.id) and again.metadata == {"topic": "ops"}  # the nonce is not shown
            ledger = stack.ledger()
            try:
                rec = ledger.get_collection("chroma", str(made.id))
            finally:
                ledger.close()
            assert rec is not None and (rec.name, rec.created_by) == (name, creator)
            # usable as any collection: an agent opens it, writes and reads
            coll = agent.get_collection(name)
            coll.add(ids=["x"], embeddings=unit_vectors(1, seed=4), documents=["after the retry"])
            assert coll.get(ids=["x"])["documents"] == ["after the retry"]
            with pytest.raises(Exception, match="already exists|409"):
                client.create_collection(name)  # registered now: a plain create of it is Chroma's 409 again

        # A create that failed leaves its intent; a collection then made straight in Chroma under that name
        # carries no recorded nonce (or a forged one) and is never registered by it.
        with pytest.raises(Exception, match="500|[Ii]nternal"):
            client.create_collection("squatted")
        stack.direct(tenant).delete_collection("squatted")
        stack.direct(tenant).create_collection("squatted", metadata={"mw_create_intent": "0" * 32})
        for open_it in (lambda: client.get_or_create_collection("squatted"), lambda: agent.get_collection("squatted"),
                        lambda: client.create_collection("squatted")):
            with pytest.raises(Exception, match=ADOPT):
                open_it()
        assert not _registered(stack, str(stack.direct(tenant).get_collection("squatted").id))
        with pytest.raises(Exception, match="governed by memwarden|400"):
            client.create_collection("forged", metadata={"mw_create_intent": "1" * 32})  # clients cannot set it
    finally:
        side.stop()
