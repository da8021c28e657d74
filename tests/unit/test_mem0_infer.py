"""The Mem0 profile's infer=true confinement and error mapping, in-process against an `httpx.MockTransport` Mem0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.governance import Row
from sidecar.ledger import SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
ME = "t/red/a"


def _row(row_id: str, owner: str = ME) -> Row:
    return Row("mem0", "default", row_id, "t", "red", owner, "fleet", owner, 1)


class FakeMem0:
    def __init__(self, listed: list[str], events: list[dict[str, Any]], status: int = 200) -> None:
        self.listed, self.events, self.status = listed, events, status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "GET" and request.url.path == "/memories":
            return httpx.Response(200, json={"results": [{"id": i, "memory": "m", "agent_id": ME} for i in self.listed]})
        if request.method == "POST" and request.url.path == "/memories":
            return httpx.Response(self.status, json={"results": self.events} if self.status == 200 else {"detail": "boom"})
        return httpx.Response(404, json={"detail": "not found"})


def make(tmp_path: Path, fake: FakeMem0, **settings: Any) -> tuple[TestClient, SQLiteLedger, str]:
    ledger = SQLiteLedger(tmp_path / "l.db")
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://mem0:9", backend="mem0", **settings),
                     transport=httpx.MockTransport(fake), ledger=ledger)
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    for rid in ("e1", "e2"):
        ledger.reserve_rows([_row(rid)])
        ledger.activate_rows("mem0", "default", [rid])
    return TestClient(app), ledger, key


ADD = {"messages": [{"role": "user", "content": "I moved to Berlin"}], "user_id": "alice"}


def test_infer_events_are_recorded(tmp_path: Path) -> None:
    fake = FakeMem0(["e1", "e2"], [{"id": "n1", "memory": "Lives in Berlin", "event": "ADD"},
                                   {"id": "e1", "memory": "Moved", "event": "UPDATE"},
                                   {"id": "e2", "memory": "Lives in Paris", "event": "DELETE"}])
    client, ledger, key = make(tmp_path, fake)
    r = client.post("/memories", json=ADD, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    assert [e["id"] for e in r.json()["results"]] == ["n1", "e1"]
    listed = fake.requests[0]
    assert listed.url.params["agent_id"] == ME and listed.url.params["user_id"] == "alice"
    sent = json.loads(fake.requests[1].content)
    assert sent["agent_id"] == ME and sent["infer"] is True and sent["metadata"]["mw_owner"] == ME
    rows = ledger.get_rows("mem0", "default", ["n1", "e1", "e2"])
    assert rows["n1"].status == "active" and rows["n1"].owner == ME and rows["n1"].extra == {"cedar": {"user_id": "alice"}}
    assert rows["e1"].status == "active" and rows["e2"].status == "deleted"
    assert ledger.pending_tombstones("mem0") == []


def test_infer_touching_rows_outside_the_confinement_tombstones_them(tmp_path: Path) -> None:
    fake = FakeMem0(["e1"], [{"id": "e2", "memory": "x", "event": "UPDATE"}])
    client, ledger, key = make(tmp_path, fake)
    assert client.post("/memories", json=ADD, headers={"X-API-Key": key}).json()["results"] == []
    assert ledger.get_rows("mem0", "default", ["e2"])["e2"].status == "deleted"


@pytest.mark.parametrize("listed", [["e1", "ungoverned"], ["e1", "foreign"]])
def test_infer_refused_when_it_cannot_be_confined(tmp_path: Path, listed: list[str]) -> None:
    fake = FakeMem0(listed, [])
    client, ledger, key = make(tmp_path, fake)
    ledger.reserve_rows([_row("foreign", owner="t/red/b")])
    ledger.activate_rows("mem0", "default", ["foreign"])
    r = client.post("/memories", json=ADD, headers={"X-API-Key": key})
    assert r.status_code in (403, 409)
    assert "infer=false" in r.json()["message"]
    assert all(req.method == "GET" for req in fake.requests)  # the add was never forwarded


def test_infer_refuse_setting_and_errors(tmp_path: Path) -> None:
    fake = FakeMem0([], [], status=500)
    client, _, key = make(tmp_path, fake, mem0_infer="refuse")
    r = client.post("/memories", json=ADD, headers={"X-API-Key": key})
    assert r.status_code == 400 and fake.requests == []
    r = client.post("/memories", json={**ADD, "infer": False}, headers={"X-API-Key": key})
    assert r.status_code == 502 and "results" not in r.text
    fake.status = 422
    r = client.post("/memories", json={**ADD, "infer": False}, headers={"X-API-Key": key})
    assert r.status_code == 422 and "boom" not in r.text


def test_backend_timeout_and_garbage(tmp_path: Path) -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    ledger = SQLiteLedger(tmp_path / "t.db")
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://mem0:9", backend="mem0"),
                     transport=httpx.MockTransport(timeout), ledger=ledger)
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    client = TestClient(app)
    r = client.post("/search", json={"query": "x"}, headers={"X-API-Key": key})
    assert r.status_code == 504 and "results" not in r.text

    garbage = SQLiteLedger(tmp_path / "g.db")
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://mem0:9", backend="mem0"),
                     transport=httpx.MockTransport(lambda req: httpx.Response(200, json={"results": [{"no": "id"}]})),
                     ledger=garbage)
    _, key = garbage.create_key("agent", "t", "red", "a", 1)
    r = TestClient(app).post("/search", json={"query": "x"}, headers={"X-API-Key": key})
    assert r.status_code == 502 and "results" not in r.text
