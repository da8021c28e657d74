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
from sidecar.provenance import content_digest

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

    # A malformed answer is 502 with no rows; a malformed row inside a well-formed answer is dropped
    # (tests/unit/test_malformed_rows.py).
    garbage = SQLiteLedger(tmp_path / "g.db")
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://mem0:9", backend="mem0"),
                     transport=httpx.MockTransport(lambda req: httpx.Response(200, json={"results": {"no": "id"}})),
                     ledger=garbage)
    _, key = garbage.create_key("agent", "t", "red", "a", 1)
    r = TestClient(app).post("/search", json={"query": "x"}, headers={"X-API-Key": key})
    assert r.status_code == 502 and "results" not in r.text
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://mem0:9", backend="mem0"),
                     transport=httpx.MockTransport(lambda req: httpx.Response(200, json={"results": [{"no": "id"}]})),
                     ledger=garbage)
    r = TestClient(app).post("/search", json={"query": "x"}, headers={"X-API-Key": key})
    assert r.status_code == 200 and r.json() == {"results": []}


def test_infer_events_carry_provenance_supersede_and_close_deletions(tmp_path: Path) -> None:
    fake = FakeMem0(["e1", "e2"], [{"id": "n1", "memory": "Lives in Berlin", "event": "ADD"},
                                   {"id": "e1", "memory": "Moved to Berlin in May", "event": "UPDATE"},
                                   {"id": "e2", "memory": "Lives in Paris", "event": "DELETE"}])
    client, ledger, key = make(tmp_path, fake)
    child = _row("c1")
    child.derived_from = (("default", "e2"),)
    fact = _row("f0")
    fact.subject, fact.predicate, fact.object, fact.single_valued = "alice", "location", "Paris", True
    ledger.reserve_rows([child, fact])
    ledger.activate_rows("mem0", "default", ["c1", "f0"])
    meta = {"mw_derived_from": "e1", "mw_subject": "alice", "mw_predicate": "location", "mw_object": "Berlin"}
    r = client.post("/memories", json={**ADD, "metadata": meta}, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    sent = json.loads(fake.requests[1].content)["metadata"]
    assert sent["mw_derived_from"] == "e1" and sent["mw_predicate"] == "location" and sent["mw_source"].startswith("mem0:add:")
    def digest(text: str) -> str:
        return content_digest(ledger.content_key(), text)

    rows = ledger.get_rows("mem0", "default", ["n1", "e1", "e2", "c1", "f0"])
    assert (rows["n1"].status, rows["n1"].content_hmac, rows["n1"].supersedes) == ("active", digest("Lives in Berlin"), ("default", "f0"))
    assert (rows["f0"].status, rows["f0"].superseded_by) == ("superseded", ("default", "n1"))
    assert [parents for depth, _, _, parents in ledger.lineage("mem0", "default", "n1") if depth == 0] == [[("default", "e1")]]
    assert rows["e1"].content_hmac == digest("Moved to Berlin in May")
    assert rows["e2"].status == rows["c1"].status == "deleted"  # the LLM's delete closes over derived rows
    deletes = [req.url.path for req in fake.requests if req.method == "DELETE"]
    assert deletes == ["/memories/c1"]  # e2 is already gone in Mem0
    assert ledger.pending_tombstones("mem0") == []


@pytest.mark.parametrize("owner,scope,refused", [(ME, "fleet", True), ("t/blue/z", "agent", False)])
def test_infer_text_of_deleted_content_is_removed_only_where_the_caller_could_read_it(
        tmp_path: Path, owner: str, scope: str, refused: bool) -> None:
    fake = FakeMem0(["e1"], [{"id": "n1", "memory": "lives in  BERLIN", "event": "ADD"},
                             {"id": "n2", "memory": "Likes coffee", "event": "ADD"}])
    client, ledger, key = make(tmp_path, fake)
    old = _row("old", owner=owner)
    old.scope, old.content_hmac = scope, content_digest(ledger.content_key(), "Lives in Berlin")
    ledger.reserve_rows([old])
    ledger.activate_rows("mem0", "default", ["old"])
    ledger.tombstone("mem0", "default", ["old"], owner, "r0")
    r = client.post("/memories", json=ADD, headers={"X-API-Key": key})
    rows = ledger.get_rows("mem0", "default", ["n1", "n2"])
    assert rows["n2"].status == "active"
    if refused:
        assert r.status_code == 409 and "Berlin" not in r.text
        assert "n1" not in rows and ("default", "n1") in ledger.backend_deleted_tombstones("mem0")
        assert [req.url.path for req in fake.requests if req.method == "DELETE"] == ["/memories/n1"]
    else:  # the caller never could read the deleted row: no oracle
        assert r.status_code == 200 and [e["id"] for e in r.json()["results"]] == ["n1", "n2"]
        assert rows["n1"].status == "active"


def test_mem0_labels_are_stamped_and_a_change_is_redistribute(tmp_path: Path) -> None:
    """``mw_labels`` through the Mem0 profile: stamped as a list on add, stored in the ledger; a PUT that
    changes them is decided as ``redistribute`` (forbidden here by the example legal-hold rule)."""
    import shutil

    policies = tmp_path / "policies"
    shutil.copytree(POLICIES, policies)
    shutil.copy(POLICIES.parent / "examples" / "labels-and-roles" / "labels.cedar", policies / "labels.cedar")
    sent: list[httpx.Request] = []

    def mem0(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.method == "POST" and request.url.path == "/memories":
            return httpx.Response(200, json={"results": [{"id": "h1", "memory": "contract", "event": "ADD"}]})
        if request.method == "PUT":
            return httpx.Response(200, json={"message": "Memory updated successfully!"})
        return httpx.Response(404, json={"detail": "not found"})

    ledger = SQLiteLedger(tmp_path / "l.db")
    app = create_app(Settings(policies_dir=policies, backend_url="http://mem0:9", backend="mem0"),
                     transport=httpx.MockTransport(mem0), ledger=ledger)
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    _, keeper = ledger.create_key("agent", "t", "red", "a", 1, roles=["records-manager"])
    client = TestClient(app)
    r = client.post("/memories", headers={"X-API-Key": key},
                    json={"messages": [{"role": "user", "content": "contract"}], "user_id": "u", "infer": False,
                          "metadata": {"mw_labels": "legal-hold, finance"}})
    assert r.status_code == 200, r.text
    assert json.loads(sent[-1].content)["metadata"]["mw_labels"] == ["finance", "legal-hold"]
    assert ledger.get_rows("mem0", "default", ["h1"])["h1"].labels == ("finance", "legal-hold")
    r = client.put("/memories/h1", headers={"X-API-Key": key}, json={"text": "contract", "metadata": {"mw_labels": "finance"}})
    assert r.status_code == 403 and "redistribute" in r.json()["message"], r.text
    assert sent[-1].method == "POST"  # nothing forwarded
    r = client.put("/memories/h1", headers={"X-API-Key": key}, json={"text": "contract v2"})
    assert r.status_code == 200, r.text                     # the content is updatable; the labels stay
    r = client.put("/memories/h1", headers={"X-API-Key": keeper}, json={"metadata": {"mw_labels": "finance"}})
    assert r.status_code == 200, r.text
    assert json.loads([q for q in sent if q.method == "PUT"][-1].content)["metadata"]["mw_labels"] == ["finance"]
    assert ledger.get_rows("mem0", "default", ["h1"])["h1"].labels == ("finance",)
