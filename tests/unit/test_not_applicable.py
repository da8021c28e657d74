"""Issue 34 (finding 5): ``memwarden_cedar_evaluation_errors_total`` is the alarm for a policy that errors at
runtime (an erroring forbid lets a request through), so it counts only that. A request the schema makes not
applicable — an operator key on a tenant route, the forgotten-content rule's ``reassert`` (no such action in the
default schema) — is an expected refusal: denied without asking Cedar, reason ``not_applicable``, counted in
``memwarden_cedar_not_applicable_total{action,principal_type}``, never logged as an evaluation error. On main
each of them counted an evaluation error (policy ``?``) and logged ``cedar_evaluation_error``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import cedarpy
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.ledger import CollectionRecord, SQLiteLedger
from sidecar.policy import CedarRequest, PolicyEngine

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
CID = "11111111-1111-1111-1111-111111111111"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"
TYPES = ("Agent", "TenantAdmin", "Operator", "Memory", "Collection", "Namespace", "Deployment", "Tenant", "Fleet")
ACTIONS = ("read", "write", "update", "delete", "supersede", "redistribute", "search", "delete_bulk", "list", "admin",
           "create_collection", "configure", "reset", "manage_tenants", "reassert", "nonsense")


def test_the_pre_check_agrees_with_cedar_on_every_type_pair() -> None:
    """Not applicable by `PolicyEngine.applies` ⇔ Cedar refuses to build the request against the schema (asked
    through cedarpy's public `is_authorized_batch`, one request at a time, no entities)."""
    engine = PolicyEngine.load(POLICIES)
    assert engine.applies_to is not None
    schema = cedarpy.Schema.from_str(engine.schema_text)
    policies = cedarpy.PolicySet.from_str(engine.policies_text)
    checked = 0
    for p, action, r in itertools.product(TYPES, ACTIONS, TYPES):
        request = CedarRequest((p, "x"), action, (r, "y"), {} if action != "redistribute" else None)
        if action == "redistribute":
            continue  # needs a context of entities: checked with the others' types below
        [answer] = cedarpy.is_authorized_batch([request.to_json()], policies, "[]", schema)
        refused = any("failed to build request" in e for e in answer.diagnostics.errors)
        assert engine.applies(request) == (not refused), (p, action, r, answer.diagnostics.errors)
        checked += 1
    assert checked == len(TYPES) ** 2 * (len(ACTIONS) - 1)
    for p, r in itertools.product(TYPES, TYPES):
        request = CedarRequest((p, "x"), "redistribute", (r, "y"))
        assert engine.applies(request) == (p in ("Agent", "TenantAdmin") and r == "Memory")


def test_not_applicable_requests_are_denied_without_an_error() -> None:
    engine = PolicyEngine.load(POLICIES)
    op = {"uid": {"type": "Operator", "id": "k1"}, "attrs": {}, "parents": []}
    dep = {"uid": {"type": "Deployment", "id": "chroma"}, "attrs": {}, "parents": []}
    read, configure, reassert = engine.decide([CedarRequest(("Operator", "k1"), "read", ("Memory", "chroma:c:x")),
                                               CedarRequest(("Operator", "k1"), "configure", ("Deployment", "chroma")),
                                               CedarRequest(("Operator", "k1"), "reassert", ("Memory", "chroma:c:x"))],
                                              [op, dep])
    for d in (read, reassert):
        assert (d.allowed, d.reason, d.errors, d.error_policies) == (False, "not_applicable", (), ())
    assert configure.allowed and configure.policies == ("operator-deployment",)  # the rest of the batch is Cedar's


def _metric(client: TestClient, name: str, **labels: str) -> float:
    text = client.app.state.services.metrics.render().decode()  # type: ignore[attr-defined]
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += float(s.value)
    return total


@pytest.fixture
def stack(tmp_path: Path) -> tuple[TestClient, SQLiteLedger]:
    ledger = SQLiteLedger(tmp_path / "l.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    stored: dict[str, Any] = {}

    def backend(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content or b"{}") if request.content else {}
        if path.endswith("/add"):
            for i, doc in zip(body["ids"], body.get("documents") or [None] * len(body["ids"])):
                stored[i] = doc
            return httpx.Response(200, json=True)
        if path.endswith("/get"):
            ids = [i for i in body.get("ids") or stored if i in stored]
            return httpx.Response(200, json={"ids": ids, "documents": [stored[i] for i in ids], "metadatas": [{} for _ in ids],
                                             "included": ["documents", "metadatas"]})
        if path.endswith("/delete"):
            for i in body.get("ids") or []:
                stored.pop(i, None)
            return httpx.Response(200, json=None)
        return httpx.Response(200, json=True)

    client = TestClient(create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", policy_watch_interval_s=0),
                                   transport=httpx.MockTransport(backend), ledger=ledger))
    return client, ledger


def test_an_operator_on_a_tenant_route_is_not_an_evaluation_error(stack: tuple[TestClient, SQLiteLedger],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    client, ledger = stack
    _, operator = ledger.create_key("operator", None, None, None, 0)
    capsys.readouterr()
    for _ in range(3):
        r = client.get("/api/v2/tenants/t/databases/db/collections", headers={"X-API-Key": operator})
        assert r.status_code == 403
    assert _metric(client, "memwarden_cedar_evaluation_errors_total") == 0
    assert _metric(client, "memwarden_cedar_not_applicable_total", action="list", principal_type="Operator") == 3
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert not [e for e in events if e.get("event") == "cedar_evaluation_error"]
    decisions = [e for e in events if e.get("event") == "decision"]
    assert decisions and all((e["decision"], e["reason"], e["evaluation_errors"], e["deny_action"]) ==
                             ("deny", "not_applicable", None, "list") for e in decisions)


def test_forgotten_content_is_not_an_evaluation_error(stack: tuple[TestClient, SQLiteLedger],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    client, ledger = stack
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    h = {"X-API-Key": key}
    add = {"ids": ["m1"], "embeddings": [[0.1, 0.2]], "documents": ["the deploy password is hunter2"]}
    assert client.post(f"{BASE}/add", json=add, headers=h).status_code == 200
    assert client.post(f"{BASE}/delete", json={"ids": ["m1"]}, headers=h).json() == {"deleted": 1}
    capsys.readouterr()
    r = client.post(f"{BASE}/add", json={**add, "ids": ["m2"]}, headers=h)
    assert r.status_code == 409  # the forgotten-content rule: deleted text may not come back
    assert _metric(client, "memwarden_cedar_evaluation_errors_total") == 0
    assert _metric(client, "memwarden_cedar_not_applicable_total", action="reassert", principal_type="Agent") == 1
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert not [e for e in events if e.get("event") == "cedar_evaluation_error"]
    [event] = [e for e in events if e.get("event") == "decision"]
    assert (event["status"], event["evaluation_errors"], event["action"]) == (409, None, "write")
    assert event["actions"] == ["list", "write", "read", "reassert"]
