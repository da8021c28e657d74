"""Mem0 assigns memory ids, so the sidecar's checks of an add run before the Mem0 call and the rows reach
the ledger after it. What changes in between — a fact activated, a parent deleted, content forgotten — must
be seen before the new memory is served. A `httpx.MockTransport` Mem0 makes the change while it answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import httpx
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.governance import Row
from sidecar.ledger import SQLiteLedger
from sidecar.provenance import content_digest

POLICIES = Path(__file__).resolve().parents[2] / "policies"


class RacingMem0:
    """Answers an add with one ADD event for memory `n1`, after running `during` (the concurrent change)."""

    def __init__(self, during: Callable[[], None]) -> None:
        self.during = during
        self.deleted: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/memories":
            self.during()
            return httpx.Response(200, json={"results": [{"id": "n1", "memory": "the text", "event": "ADD"}]})
        if request.method == "DELETE" and request.url.path.startswith("/memories/"):
            self.deleted.append(request.url.path.rsplit("/", 1)[1])
            return httpx.Response(200, json={"message": "Memory deleted successfully"})
        return httpx.Response(404, json={"detail": "not found"})


def make(tmp_path: Path, during: Callable[[SQLiteLedger], None]) -> tuple[TestClient, SQLiteLedger, RacingMem0]:
    ledger = SQLiteLedger(tmp_path / "l.db")
    fake = RacingMem0(lambda: during(ledger))
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://mem0:9", backend="mem0", reconcile_interval_s=0),
                     transport=httpx.MockTransport(fake), ledger=ledger)
    return TestClient(app), ledger, fake


def row(row_id: str, owner: str, scope: str = "tenant", **kw: Any) -> Row:
    t, fleet, _ = owner.split("/")
    return Row("mem0", "default", row_id, t, fleet, owner, scope, owner, 1, **kw)


def put(ledger: SQLiteLedger, r: Row) -> None:
    ledger.reserve_rows([r])
    ledger.activate_rows("mem0", "default", [r.row_id])


def add(client: TestClient, key: str, **metadata: str) -> httpx.Response:
    return client.post("/memories", headers={"X-API-Key": key}, json={
        "messages": [{"role": "user", "content": "the text"}], "infer": False, "metadata": metadata})


def test_a_fact_activated_during_the_call_is_superseded_only_after_supersede_is_decided_on_it(tmp_path: Path) -> None:
    fact = {"subject": "pipeline:prod", "predicate": "pipeline_status", "object": "running", "single_valued": True}
    client, ledger, fake = make(tmp_path, lambda led: put(led, row("f0", "t/red/v", **fact)))
    _, key = ledger.create_key("agent", "t", "blue", "x", 1)  # another fleet: may read f0 (tenant scope)
    r = add(client, key, mw_scope="tenant", mw_subject="pipeline:prod", mw_predicate="pipeline_status", mw_object="paused")
    assert r.status_code == 200, r.text
    rows = ledger.get_rows("mem0", "default", ["f0", "n1"])
    # f0 appeared while Mem0 answered: the activation saw it (compare-and-set), decided supersede on it, chained it
    assert rows["f0"].status == "superseded" and rows["f0"].superseded_by == ("default", "n1")
    assert rows["n1"].status == "active" and rows["n1"].supersedes == ("default", "f0") and fake.deleted == []


def test_a_fact_of_another_partition_activated_during_the_call_is_left_alone(tmp_path: Path) -> None:
    fact = {"subject": "pipeline:prod", "predicate": "pipeline_status", "object": "running", "single_valued": True}
    client, ledger, fake = make(tmp_path, lambda led: put(led, row("f0", "t/red/v", scope="fleet", **fact)))
    _, key = ledger.create_key("agent", "t", "blue", "x", 1)  # fleet blue: red's fleet facts are another partition
    r = add(client, key, mw_scope="fleet", mw_subject="pipeline:prod", mw_predicate="pipeline_status", mw_object="paused")
    assert r.status_code == 200, r.text
    rows = ledger.get_rows("mem0", "default", ["f0", "n1"])
    assert rows["f0"].status == "active" and rows["n1"].status == "active" and rows["n1"].supersedes is None


def test_a_parent_deleted_during_the_call_does_not_leave_a_live_child(tmp_path: Path) -> None:
    client, ledger, fake = make(tmp_path, lambda led: led.tombstone("mem0", "default", ["p1"], "t/red/a", "r0"))
    put(ledger, row("p1", "t/red/a"))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    r = add(client, key, mw_derived_from="p1")
    assert r.status_code == 403, r.text  # the same answer as for a parent deleted before the call
    assert "n1" not in ledger.get_rows("mem0", "default", ["n1"]) and fake.deleted == ["n1"]


def test_content_forgotten_during_the_call_does_not_come_back(tmp_path: Path) -> None:
    client, ledger, fake = make(tmp_path, lambda led: led.tombstone("mem0", "default", ["d1"], "t/red/a", "r0"))
    put(ledger, row("d1", "t/red/a", content_hmac=content_digest(ledger.content_key(), "the text")))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    r = add(client, key)
    assert r.status_code == 409, r.text
    assert "n1" not in ledger.get_rows("mem0", "default", ["n1"]) and fake.deleted == ["n1"]
    # a refused write is not itself "forgotten": only d1's content was
    assert ledger.forgotten("t", [content_digest(ledger.content_key(), "the text")])


def test_without_a_concurrent_change_the_add_goes_through(tmp_path: Path) -> None:
    client, ledger, fake = make(tmp_path, lambda led: None)
    put(ledger, row("p1", "t/red/a"))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    r = add(client, key, mw_derived_from="p1")
    assert r.status_code == 200 and [e["id"] for e in r.json()["results"]] == ["n1"]
    assert ledger.get_rows("mem0", "default", ["n1"])["n1"].status == "active" and fake.deleted == []


def test_a_principal_that_may_not_write_gets_one_answer(tmp_path: Path) -> None:
    client, ledger, fake = make(tmp_path, lambda led: None)
    put(ledger, row("f0", "t/red/v", scope="agent", subject="employee:bob", predicate="status", object="leave", single_valued=True))
    put(ledger, row("p0", "t/red/v", scope="agent"))
    _, key = ledger.create_key("agent", "t", "red", "ro", 0)  # trust 0: may not write
    answers = {(r.status_code, r.text) for r in (
        add(client, key, mw_subject="employee:bob", mw_predicate="status", mw_object="x"),  # an unreadable fact exists
        add(client, key, mw_subject="employee:carol", mw_predicate="status", mw_object="x"),  # none exists
        add(client, key, mw_derived_from="p0"), add(client, key, mw_derived_from="never-existed"))}
    assert answers == {(403, '{"error":"forbidden","message":"write is not permitted"}')} and fake.deleted == []
