"""The pipeline in-process with an `httpx.MockTransport` backend that records what it received."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.errors import PolicyLoadError
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "11111111-1111-1111-1111-111111111111"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"


class Backend:
    """Records every request; answers with `reply(request)`."""

    def __init__(self, reply: Callable[[httpx.Request], httpx.Response]) -> None:
        self.reply = reply
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.reply(request)


def ok(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path.endswith("/get"):
        return httpx.Response(200, json={"ids": [], "metadatas": [], "documents": [], "included": []})
    return httpx.Response(200, json=True)


@pytest.fixture
def ledger(tmp_path: Path) -> SQLiteLedger:
    led = SQLiteLedger(tmp_path / "l.db")
    led.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    return led


def make(ledger: SQLiteLedger, reply: Callable[[httpx.Request], httpx.Response] = ok, **settings: Any) -> tuple[TestClient, Backend, str]:
    backend = Backend(reply)
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", **settings),
                     transport=httpx.MockTransport(backend), ledger=ledger)
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    return TestClient(app), backend, key


def test_unknown_routes_are_never_forwarded(ledger: SQLiteLedger) -> None:
    client, backend, key = make(ledger)
    for method, path in [("GET", "/api/v2/nope"), ("POST", f"{BASE}/fork"), ("GET", "/api/v1/heartbeat"),
                         ("DELETE", "/api/v2/tenants/t"), ("GET", "/api/v2/Heartbeat"), ("GET", "/api/v2/heartbeat/")]:
        assert client.request(method, path, headers={"X-API-Key": key}).status_code == 404, path
    assert backend.requests == []


def test_rejected_requests_reach_nothing(ledger: SQLiteLedger) -> None:
    client, backend, key = make(ledger)
    h = {"X-API-Key": key}
    assert client.post(f"{BASE}/get", json={}, headers={**h, "X-HTTP-Method-Override": "DELETE"}).status_code == 400
    assert client.get("/api/v2/tenants/t/databases/db/collections?_method=DELETE", headers=h).status_code == 400
    assert client.get("/api/v2/tenants/t/databases/db/collections?limit=1&limit=2", headers=h).status_code == 400
    assert client.post(f"{BASE}/get", content=b'{"a":1,"a":2}', headers={**h, "content-type": "application/json"}).status_code == 400
    assert client.post(f"{BASE}/get", json={}).status_code == 401
    assert backend.requests == []


def test_client_headers_are_not_forwarded_and_backend_token_is(ledger: SQLiteLedger) -> None:
    client, backend, key = make(ledger, backend_token="backend-secret")
    r = client.post(f"{BASE}/get", json={}, headers={"Authorization": f"Bearer {key}", "X-Agent-ID": "t/red/b",
                                                      "X-Tenant-ID": "u", "Cookie": "c=1", "X-Custom": "y"})
    assert r.status_code == 200
    sent = backend.requests[-1].headers
    assert sent["authorization"] == "Bearer backend-secret"
    for name in ("x-agent-id", "x-tenant-id", "cookie", "x-custom", "x-api-key"):
        assert name not in sent
    assert key not in json.dumps(dict(sent))


@pytest.mark.parametrize("reply,status", [
    (lambda r: httpx.Response(500, json={"error": "boom"}), 502),
    (lambda r: httpx.Response(200, content=b"<html>"), 502),
    (lambda r: httpx.Response(200, json={"unexpected": 1}), 502),
    (lambda r: httpx.Response(302, headers={"location": "http://elsewhere"}), 502),
])
def test_backend_failures_give_no_rows(ledger: SQLiteLedger, reply: Callable[[httpx.Request], httpx.Response], status: int) -> None:
    client, _, key = make(ledger, reply)
    r = client.post(f"{BASE}/get", json={}, headers={"X-API-Key": key})
    assert r.status_code == status and set(r.json()) == {"error", "message"}


def test_timeout_is_504_and_failed_write_leaves_no_ledger_row(ledger: SQLiteLedger) -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/add"):
            raise httpx.ReadTimeout("slow", request=request)
        return ok(request)
    client, _, key = make(ledger, reply)
    r = client.post(f"{BASE}/add", json={"ids": ["x"], "embeddings": [[1.0]]}, headers={"X-API-Key": key})
    assert r.status_code == 504
    assert ledger.get_rows("chroma", CID, ["x"]) == {}


def test_rows_unknown_to_the_ledger_are_dropped(ledger: SQLiteLedger) -> None:
    forged = {"ids": ["ghost"], "documents": ["forged"], "metadatas": [{"mw_tenant": "t", "mw_scope": "tenant"}],
              "included": ["documents", "metadatas"]}
    client, _, key = make(ledger, lambda r: httpx.Response(200, json=forged))
    r = client.post(f"{BASE}/get", json={}, headers={"X-API-Key": key})
    assert r.status_code == 200 and r.json()["ids"] == [] and "forged" not in r.text


def test_pushdown_is_anded_with_the_client_filter(ledger: SQLiteLedger) -> None:
    client, backend, key = make(ledger, id_pushdown_max=0)  # the metadata form of the visibility filter
    client.post(f"{BASE}/get", json={"where": {"$or": [{"mw_tenant": "u"}, {"x": 1}]}}, headers={"X-API-Key": key})
    sent = json.loads(backend.requests[-1].content)
    where = sent["where"]
    assert where["$and"][0] == {"$or": [{"mw_tenant": "u"}, {"x": 1}]}
    assert where["$and"][1]["$and"][0] == {"mw_tenant": {"$eq": "t"}}
    assert sent["ids"] is None


def test_id_pushdown_sends_the_admitted_ids_with_the_client_filter(ledger: SQLiteLedger) -> None:
    """The id-list form (default): the client's where unchanged, ids = the collection's rows the caller's
    visibility admits, as the ledger holds them (not deleted); over ``ID_PUSHDOWN_MAX`` rows: the metadata form."""
    client, backend, key = make(ledger)
    ledger.adopt_rows([Row("chroma", CID, rid, "t", fleet, owner, scope, owner, 1, status)
                       for rid, fleet, owner, scope, status in [
                           ("mine", "red", "t/red/a", "agent", "active"), ("theirs", "red", "t/red/b", "agent", "active"),
                           ("fleet", "red", "t/red/b", "fleet", "active"), ("blue", "blue", "t/blue/c", "fleet", "active"),
                           ("all", "blue", "t/blue/c", "tenant", "active"), ("gone", "red", "t/red/a", "tenant", "active")]])
    ledger.tombstone("chroma", CID, ["gone"], "t/red/a", "rq")
    client_where = {"$or": [{"mw_tenant": "u"}, {"x": 1}]}
    client.post(f"{BASE}/get", json={"where": client_where}, headers={"X-API-Key": key})
    sent = json.loads(backend.requests[-1].content)
    assert sent["where"] == client_where
    assert sorted(sent["ids"]) == ["all", "fleet", "mine"]
    client, backend, key = make(ledger, id_pushdown_max=2)
    client.post(f"{BASE}/get", json={"where": client_where}, headers={"X-API-Key": key})
    sent = json.loads(backend.requests[-1].content)
    assert sent["ids"] is None and sent["where"]["$and"][0] == client_where


def test_policy_failure_stops_startup(tmp_path: Path, ledger: SQLiteLedger) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "s.cedarschema").write_text((POLICIES / "memwarden.cedarschema").read_text())
    (tmp_path / "p" / "bad.cedar").write_text("permit(principal, action, resource) when { principal.nope };")
    with pytest.raises(PolicyLoadError):
        create_app(Settings(policies_dir=tmp_path / "p"), ledger=ledger)
