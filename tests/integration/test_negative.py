"""Negative paths through the real sidecar and Chroma: every one denies and changes nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import Stack, Tenant, unit_vectors

pytestmark = pytest.mark.integration

V = unit_vectors(4, seed=5)


@pytest.fixture(scope="module")
def two(stack: Stack) -> tuple[Tenant, Tenant]:
    a, b = stack.tenant("nega"), stack.tenant("negb")
    for t in (a, b):
        t.keys["w"] = stack.key(t.name, "red", "w", 1)
        t.keys["peer"] = stack.key(t.name, "red", "peer", 1)
        t.keys["ro"] = stack.key(t.name, "red", "ro", 0)
        t.keys["blue"] = stack.key(t.name, "blue", "x", 1)
        t.keys["boss"] = stack.key(t.name, "red", "boss", 3)
        coll = stack.client(t.keys["w"], t.name).get_collection(t.collection)
        coll.add(ids=["secret", "shared"], embeddings=V[:2], documents=[f"secret of {t.name}", "shared"],
                 metadatas=[{"mw_scope": "agent"}, {"mw_scope": "fleet"}])
    return a, b


def base(t: Tenant, tenant: str | None = None) -> str:
    return f"/api/v2/tenants/{tenant or t.name}/databases/default_database"


DATA_ROUTES = [("post", "add"), ("post", "upsert"), ("post", "update"), ("post", "get"), ("post", "query"),
               ("post", "delete"), ("get", "count"), ("get", "indexing_status")]


def test_unknown_routes_are_404(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    with stack.http(a.keys["w"]) as http:
        for method, path in [("get", "/api/v1/heartbeat"), ("get", "/api/v2/heartbeat/"), ("get", "/API/v2/heartbeat"),
                             ("post", f"{base(a)}/collections/{a.collection_id}/fork"),
                             ("post", f"{base(a)}/collections/{a.collection_id}/search"), ("get", "/")]:
            r = getattr(http, method)(path)
            assert r.status_code == 404, (method, path, r.text)


@pytest.mark.parametrize("method,op", DATA_ROUTES)
def test_foreign_collection_uuid_under_own_tenant_path_is_404(stack: Stack, two: tuple[Tenant, Tenant], method: str, op: str) -> None:
    a, b = two
    body = {"ids": ["secret"], "embeddings": [V[0]], "query_embeddings": [V[0]], "n_results": 5}
    with stack.http(a.keys["w"]) as http:
        for tenant_path in (a.name, b.name):
            url = f"{base(a, tenant_path)}/collections/{b.collection_id}/{op}"
            r = http.request(method.upper(), url, json=body if method == "post" else None)
            assert r.status_code == 404, (tenant_path, op, r.text)
            assert "secret of" not in r.text
    # b's rows are untouched
    assert stack.direct(b.name).get_collection(b.collection).count() == 2


def test_foreign_collection_by_id_and_modify_are_404(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, b = two
    with stack.http(a.admin_key) as http:
        assert http.get(f"{base(a)}/collections/by-id/{b.collection_id}").status_code == 404
        assert http.put(f"{base(a)}/collections/{b.collection_id}", json={"new_name": "pwned"}).status_code == 404
        assert http.get(f"{base(a, b.name)}/collections/{b.collection}").status_code in (403, 404)
        assert http.delete(f"{base(a, b.name)}/collections/{b.collection}").status_code in (403, 404)
    assert stack.direct(b.name).get_collection(b.collection).name == b.collection


def test_other_tenant_in_path_is_denied(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, b = two
    with stack.http(a.admin_key) as http:
        assert http.get(f"/api/v2/tenants/{b.name}").status_code == 403
        assert http.get(f"/api/v2/tenants/{b.name}/databases").status_code == 403
        assert http.get(f"{base(a, b.name)}/collections").status_code == 403
        assert http.post(f"/api/v2/tenants/{b.name}/databases", json={"name": "evil"}).status_code == 403
        assert http.post("/api/v2/tenants", json={"name": b.name}).status_code == 403


def test_spoofed_identity_headers_are_ignored(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, b = two
    spoof = {"X-Agent-ID": "w", "X-Tenant-ID": b.name, "X-User-Id": "w", "X-Forwarded-For": "127.0.0.1",
             "X-Memwarden-Scope": "tenant"}
    with stack.http(a.keys["peer"], **spoof) as http:
        r = http.post(f"{base(a)}/collections/{a.collection_id}/get", json={})
    with stack.http(a.keys["peer"]) as http:
        plain = http.post(f"{base(a)}/collections/{a.collection_id}/get", json={})
    assert r.status_code == plain.status_code == 200
    # peer sees the fleet row, never w's agent-scoped secret (other tests of this module may add fleet rows)
    assert "shared" in r.json()["ids"] and "secret" not in r.json()["ids"]
    assert sorted(r.json()["ids"]) == sorted(plain.json()["ids"])  # the headers changed nothing
    with stack.http(**{"X-Agent-ID": f"{a.name}/red/w", "X-Tenant-ID": a.name}) as http:
        assert http.post(f"{base(a)}/collections/{a.collection_id}/get", json={}).status_code == 401


def test_missing_unknown_malformed_and_revoked_keys_are_401(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    url = f"{base(a)}/collections/{a.collection_id}/get"
    with stack.http() as http:
        assert http.post(url, json={}).status_code == 401
        assert http.post(url, json={}, headers={"X-API-Key": "mwk_0000.nope"}).status_code == 401
        assert http.post(url, json={}, headers={"Authorization": "Basic Zm9vOmJhcg=="}).status_code == 401
        assert http.post(url, json={}, headers={"Authorization": f"Bearer {a.keys['w']}", "X-API-Key": a.keys["peer"]}).status_code == 401
    key = stack.key(a.name, "red", "temp", 1)
    with stack.http(key) as http:
        assert http.post(url, json={}).status_code == 200
        key_id = key.split("_", 1)[1].split(".", 1)[0]
        out = subprocess.run([sys.executable, "-m", "sidecar.cli", "keys", "revoke", key_id, "--ledger", str(stack.ledger_path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        r = http.post(url, json={})
        assert r.status_code == 401 and "ids" not in r.json()


def test_client_set_governed_metadata_is_400_and_writes_nothing(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    url = f"{base(a)}/collections/{a.collection_id}/add"
    direct = stack.direct(a.name).get_collection(a.collection)
    before = direct.count()
    with stack.http(a.keys["w"]) as http:
        for meta in ({"mw_owner": f"{a.name}/red/peer"}, {"mw_tenant": "other"}, {"mw_created_at": 1},
                     {"mw_writer": "x"}, {"mw_r:x": True}, {"mw_scope": "galaxy"}, {"mw_readers": "nobody"}):
            r = http.post(url, json={"ids": ["forged"], "embeddings": [V[2]], "metadatas": [meta]})
            assert r.status_code == 400, (meta, r.text)
        r = http.post(url, json={"ids": ["ok1", "forged"], "embeddings": [V[2], V[3]],
                                 "metadatas": [{"a": 1}, {"mw_owner": "x"}]})
        assert r.status_code == 400
    assert direct.count() == before
    ledger = stack.ledger()
    try:
        assert ledger.get_rows("chroma", a.collection_id, ["forged", "ok1"]) == {}
    finally:
        ledger.close()


def test_trust_ladder_on_writes(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    url = f"{base(a)}/collections/{a.collection_id}/add"
    def add(key: str, row_id: str, meta: dict[str, str]) -> int:
        with stack.http(key) as http:
            return http.post(url, json={"ids": [row_id], "embeddings": [V[3]], "metadatas": [meta]}).status_code
    assert add(a.keys["ro"], "t0", {}) == 403                       # trust 0 is read-only
    assert add(a.keys["w"], "t1-blue", {"mw_fleet": "blue"}) == 403  # cross-fleet needs trust 3
    assert add(a.admin_key, "adm", {}) == 403                        # admins do not own rows
    assert add(a.keys["boss"], "t3-blue", {"mw_fleet": "blue"}) == 200
    blue = stack.client(a.keys["blue"], a.name).get_collection(a.collection)
    assert "t3-blue" in blue.get()["ids"]
    assert stack.direct(a.name).get_collection(a.collection).get(ids=["t0", "t1-blue", "adm"])["ids"] == []
    # Re-homing an existing row: trust 3 may move its row to another fleet of its tenant (the target
    # fleet is judged with its tenant: forbid-redistribute-out-of-tenant), trust 1 may not.
    assert add(a.keys["boss"], "t3-red", {}) == 200 and add(a.keys["w"], "t1-red", {}) == 200
    with stack.http(a.keys["boss"]) as http:
        assert http.post(url.replace("/add", "/update"), json={"ids": ["t3-red"], "metadatas": [{"mw_fleet": "blue"}]}).status_code == 200
    with stack.http(a.keys["w"]) as http:
        assert http.post(url.replace("/add", "/update"), json={"ids": ["t1-red"], "metadatas": [{"mw_fleet": "blue"}]}).status_code == 403
    assert "t3-red" in blue.get()["ids"] and "t1-red" not in blue.get()["ids"]


def test_collisions_with_foreign_and_ungoverned_ids(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    peer = stack.client(a.keys["peer"], a.name).get_collection(a.collection)
    with pytest.raises(Exception):
        peer.add(ids=["secret"], embeddings=[V[3]], documents=["overwrite"])          # 409
    with pytest.raises(Exception):
        peer.upsert(ids=["secret"], embeddings=[V[3]], documents=["overwrite"])       # not visible: 404
    with pytest.raises(Exception):
        peer.update(ids=["secret"], documents=["overwrite"], embeddings=[V[3]])       # not visible: 404
    with pytest.raises(Exception):
        peer.update(ids=["shared"], documents=["overwrite"], embeddings=[V[3]])       # visible, not owner: 403
    stack.direct(a.name).get_collection(a.collection).add(ids=["raw"], embeddings=[V[0]], documents=["raw"])
    with pytest.raises(Exception):
        peer.upsert(ids=["raw"], embeddings=[V[3]], documents=["adopt me"])           # ungoverned: 409
    docs = stack.direct(a.name).get_collection(a.collection).get(ids=["secret", "shared", "raw"])["documents"]
    assert sorted(docs) == sorted([f"secret of {a.name}", "shared", "raw"])


def test_agents_cannot_manage_collections_or_reset(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    with stack.http(a.keys["boss"]) as http:
        assert http.post(f"{base(a)}/collections", json={"name": "mine"}).status_code == 403
        assert http.delete(f"{base(a)}/collections/{a.collection}").status_code == 403
        assert http.post("/api/v2/reset").status_code == 403
    with stack.http(a.admin_key) as http:
        assert http.post("/api/v2/reset").status_code == 403


def test_bad_bodies(stack: Stack, two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    url = f"{base(a)}/collections/{a.collection_id}/get"
    with stack.http(a.keys["w"]) as http:
        h = {"content-type": "application/json"}
        assert http.post(url, content=b"{not json", headers=h).status_code == 400
        assert http.post(url, content=b'{"limit": 1, "limit": 2}', headers=h).status_code == 400
        assert http.post(url, content=b'{"where": {"a": 1, "a": 2}}', headers=h).status_code == 400
        assert http.post(url, content=b"[1, 2]", headers=h).status_code == 400
        assert http.post(url, content=b"x" * (8 * 1024 * 1024 + 1), headers=h).status_code == 413


def test_backend_down_is_502_with_no_rows(private_stack: Stack) -> None:
    t = private_stack.tenant("down")
    key = private_stack.key(t.name, "red", "w", 1)
    coll = private_stack.client(key, t.name).get_collection(t.collection)
    coll.add(ids=["a"], embeddings=[V[0]], documents=["alive"])
    private_stack.chroma.stop()
    url = f"{base(t)}/collections/{t.collection_id}"
    with private_stack.http(key) as http:
        for method, op, body in [("POST", "get", {}), ("POST", "query", {"query_embeddings": [V[0]], "n_results": 1}),
                                 ("GET", "count", None), ("POST", "add", {"ids": ["b"], "embeddings": [V[1]]}),
                                 ("POST", "delete", {"ids": ["a"]})]:
            r = http.request(method, f"{url}/{op}", json=body)
            assert r.status_code == 502, (op, r.text)
            assert set(r.json()) == {"error", "message"} and "alive" not in r.text
        assert http.get("/_memwarden/readyz").status_code == 503
    ledger = private_stack.ledger()
    try:
        rows = ledger.get_rows("chroma", t.collection_id, ["a", "b"])
        assert set(rows) == {"a"}  # the failed add wrote nothing to the ledger
        # the failed delete left a durable tombstone; the row is never served again
        assert rows["a"].status == "deleted"
        assert ledger.pending_tombstones("chroma") == [(t.collection_id, "a")]
    finally:
        ledger.close()
