"""Bearer JWTs on a real `memwarden serve` in front of a real `chroma run`, its keys served by a local JWKS server
written for the test (tests/jwtutil.py): agents authenticated by JWTs act with the scope their claims map to, beside
an agent with an API key; every hostile token is refused with 401, logged ``not_authenticated``, and nothing of it
reaches Chroma; a key rotated into the served JWKS is picked up without a restart."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import chromadb
import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES, admin_client, chroma_client, unit_vectors
from tests.integration.logutil import decision, file_sink
from tests.jwtutil import AUDIENCE, ISSUER, Issuer, JwksServer, SigningKey

pytestmark = pytest.mark.integration

CLAIMS = {"tenant": "org", "fleet": "team", "agent": "sub", "trust": "trust", "roles": "groups"}


class JwtStack:
    def __init__(self, chroma: Server, sidecar: Server, ledger: Path, log: Path, issuer: Issuer, jwks: JwksServer) -> None:
        self.chroma, self.sidecar, self.ledger_path, self.log, self.issuer, self.jwks = chroma, sidecar, ledger, log, issuer, jwks

    def token(self, tenant: str, fleet: str, agent: str, trust: int = 1, **claims: Any) -> str:
        return self.issuer.token(org=tenant, team=fleet, sub=agent, trust=trust, **claims)

    def tenant(self) -> tuple[str, str, str]:
        """(tenant, its admin API key, the collection id of its ``mem``), made through the sidecar."""
        name = f"jwt{uuid.uuid4().hex[:8]}"
        ledger = SQLiteLedger(self.ledger_path)
        try:
            admin = ledger.create_key("admin", name, None, None, 0)[1]
        finally:
            ledger.close()
        adm = admin_client(self.sidecar.port, {"X-API-Key": admin})
        adm.create_tenant(name)
        adm.create_database("default_database", tenant=name)
        cid = str(chroma_client(self.sidecar.port, name, {"X-API-Key": admin}).create_collection("mem").id)
        return name, admin, cid

    def coll(self, tenant: str, bearer: str) -> chromadb.api.models.Collection.Collection:
        return chroma_client(self.sidecar.port, tenant, {"Authorization": f"Bearer {bearer}"}).get_collection("mem")


@pytest.fixture(scope="module")
def jwt_stack(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[JwtStack]:
    tmp = tmp_path_factory.mktemp("jwt")
    issuer = Issuer([SigningKey.rsa("rsa-2026"), SigningKey.ec("ec-2026")])
    jwks = JwksServer(issuer)
    env = file_sink(tmp / "decisions.jsonl", MEMWARDEN_JWT_ISSUER=ISSUER, MEMWARDEN_JWT_AUDIENCE=AUDIENCE,
                    MEMWARDEN_JWT_JWKS_URL=jwks.url, MEMWARDEN_JWT_CLAIMS=json.dumps(CLAIMS),
                    MEMWARDEN_JWT_JWKS_MIN_INTERVAL_S="0.5", MEMWARDEN_JWT_LEEWAY_S="5")
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES, extra_env=env)
    yield JwtStack(chroma_server, side, tmp / "ledger.db", tmp / "decisions.jsonl", issuer, jwks)
    side.stop()
    jwks.close()


def test_jwt_agents_act_with_their_mapped_scope_beside_an_api_key_agent(jwt_stack: JwtStack) -> None:
    s = jwt_stack
    tenant, _, _ = s.tenant()
    ledger = SQLiteLedger(s.ledger_path)
    try:
        keyed = ledger.create_key("agent", tenant, "red", "keyed", 1)[1]
    finally:
        ledger.close()
    a1, a2, b1 = s.token(tenant, "red", "a1"), s.token(tenant, "red", "a2"), s.token(tenant, "blue", "b1")
    vec = unit_vectors(4, seed=7)
    s.coll(tenant, a1).add(ids=["mine", "ours"], embeddings=vec[:2], documents=["a1 private", "red fleet note"],
                           metadatas=[{"mw_scope": "agent"}, {"mw_scope": "fleet"}])
    assert sorted(s.coll(tenant, a1).get()["ids"]) == ["mine", "ours"]
    assert s.coll(tenant, a2).get()["ids"] == ["ours"]  # same fleet, not the agent-scoped row
    assert s.coll(tenant, b1).get()["ids"] == []  # another fleet, trust 1
    keyed_coll = chroma_client(s.sidecar.port, tenant, {"X-API-Key": keyed}).get_collection("mem")
    assert keyed_coll.get()["ids"] == ["ours"]  # an API-key agent of the fleet, in the same deployment
    # the row is stamped with the JWT principal as its owner
    row = s.coll(tenant, a1).get(ids=["mine"], include=["metadatas"])["metadatas"][0]
    assert row["mw_owner"] == f"{tenant}/red/a1", row
    # an ES256 token of the same agent is the same principal
    es = s.issuer.token(s.issuer.keys[1], org=tenant, team="red", sub="a1", trust=1)
    assert sorted(s.coll(tenant, es).get()["ids"]) == ["mine", "ours"]
    with httpx.Client(base_url=s.sidecar.url, trust_env=False, timeout=30) as http:
        r = http.get("/api/v2/auth/identity", headers={"Authorization": f"Bearer {a1}"})
        assert r.status_code == 200 and r.json()["user_id"] == f"{tenant}/red/a1"
        event = decision(s.log, r.headers["x-request-id"])
        assert event["decision"] == "allow" and event["principal"] == f"Agent::{tenant}/red/a1" and event["key_id"] == "jwt:a1"


def test_a_token_for_one_tenant_cannot_reach_another_tenants_collection(jwt_stack: JwtStack) -> None:
    s = jwt_stack
    tenant_a, _, cid_a = s.tenant()
    tenant_b, _, _ = s.tenant()
    s.coll(tenant_a, s.token(tenant_a, "red", "a1")).add(ids=["secret"], embeddings=[[1.0, 0.0]], documents=["A's"])
    b = s.token(tenant_b, "red", "a1", trust=3)
    with httpx.Client(base_url=s.sidecar.url, trust_env=False, timeout=30) as http:
        base = f"/api/v2/tenants/{tenant_a}/databases/default_database/collections/{cid_a}"
        r = http.post(base + "/get", json={}, headers={"Authorization": f"Bearer {b}"})
        assert r.status_code in (403, 404) and "secret" not in r.text
        # the collection id under B's own tenant path: still A's collection, still refused
        r = http.post(f"/api/v2/tenants/{tenant_b}/databases/default_database/collections/{cid_a}/get", json={},
                      headers={"Authorization": f"Bearer {b}"})
        assert r.status_code in (403, 404) and "secret" not in r.text


ATTACKS: list[tuple[str, Callable[[JwtStack, str], str], str]] = [
    ("expired", lambda s, t: s.token(t, "red", "a1", exp=int(time.time()) - 60), "expired"),
    ("not yet valid", lambda s, t: s.token(t, "red", "a1", nbf=int(time.time()) + 600), "not yet valid"),
    ("wrong aud", lambda s, t: s.token(t, "red", "a1", aud="chroma"), "audience"),
    ("wrong iss", lambda s, t: s.token(t, "red", "a1", iss="https://evil.example"), "issuer"),
    ("unknown kid", lambda s, t: s.issuer.token(SigningKey.rsa("forged"), org=t, team="red", sub="a1"), "unknown key"),
    ("alg none", lambda s, t: s.issuer.unsigned(org=t, team="red", sub="a1"), "'none'"),
    ("HS256 with the public key", lambda s, t: s.issuer.hs256_with_public_key(org=t, team="red", sub="a1"), "'HS256'"),
    ("tampered payload", lambda s, t: s.issuer.tampered(org=t, team="red", sub="a1", trust=3), "signature"),
    ("missing claim", lambda s, t: s.token(t, None, "a1"), "'team'"),  # type: ignore[arg-type]
    ("oversized", lambda s, t: s.token(t, "red", "a1", pad="x" * 9000), "longer than"),
]


@pytest.mark.parametrize("name, make, says", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_a_hostile_token_is_refused_and_nothing_is_forwarded(jwt_stack: JwtStack, name: str,
                                                              make: Callable[[JwtStack, str], str], says: str) -> None:
    s = jwt_stack
    tenant, _, cid = s.tenant()
    token = make(s, tenant)
    base = f"/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}"
    with httpx.Client(base_url=s.sidecar.url, trust_env=False, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as http:
        r = http.post(base + "/add", json={"ids": [f"x-{name}"], "embeddings": [[1.0, 0.0]], "documents": ["attack"]})
        assert r.status_code == 401 and says in r.json()["message"], r.text
        event = decision(s.log, r.headers["x-request-id"])
        assert (event["decision"], event["reason"], event["principal"]) == ("deny", "not_authenticated", None)
    # nothing reached Chroma: the row is not in the collection
    direct = chroma_client(s.chroma.port, tenant).get_collection("mem")
    assert direct.get(ids=[f"x-{name}"])["ids"] == []


def test_an_api_key_and_a_jwt_together_are_refused(jwt_stack: JwtStack) -> None:
    s = jwt_stack
    tenant, admin, _ = s.tenant()
    with httpx.Client(base_url=s.sidecar.url, trust_env=False, timeout=30) as http:
        r = http.get("/api/v2/auth/identity", headers={"X-API-Key": admin,
                                                         "Authorization": f"Bearer {s.token(tenant, 'red', 'a1')}"})
        assert r.status_code == 401 and "more than one credential" in r.json()["message"]


def test_a_key_rotated_into_the_jwks_is_picked_up(jwt_stack: JwtStack) -> None:
    s = jwt_stack
    tenant, _, _ = s.tenant()
    rotated = SigningKey.rsa(f"rsa-next-{uuid.uuid4().hex[:6]}")
    token = s.issuer.token(rotated, org=tenant, team="red", sub="a1", trust=1)
    with httpx.Client(base_url=s.sidecar.url, trust_env=False, timeout=30) as http:
        assert http.get("/api/v2/auth/identity", headers={"Authorization": f"Bearer {token}"}).status_code == 401
        s.issuer.keys.append(rotated)
        try:
            before = s.jwks.requests
            deadline = time.monotonic() + 30
            r = http.get("/api/v2/auth/identity", headers={"Authorization": f"Bearer {token}"})
            while r.status_code == 401 and time.monotonic() < deadline:  # the re-fetch interval (0.5 s) passing
                time.sleep(0.2)
                r = http.get("/api/v2/auth/identity", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200 and r.json()["user_id"] == f"{tenant}/red/a1"
            assert s.jwks.requests > before
        finally:
            s.issuer.keys.remove(rotated)
