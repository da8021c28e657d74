"""The decision log an auditor reads, Chroma profile, through a real `memwarden serve`: every status has
the right decision and reason (200/400/401/403/404/409/413/502), every event names the policy set it was
decided under and the determining policies, rows denied by Cedar are counted apart from superseded,
deleted and unknown rows, and no content or key is logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from sidecar.harness import Server, free_port, start_sidecar
from sidecar.ledger import CollectionRecord, SQLiteLedger
from tests.integration.conftest import POLICIES, Stack
from tests.integration.logutil import decision, file_sink

pytestmark = pytest.mark.integration

LIMIT = 65536


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[tuple[Stack, Path]]:
    tmp = tmp_path_factory.mktemp("decisionlog")
    log = tmp / "decisions.jsonl"
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES,
                         extra_env=file_sink(log, MEMWARDEN_MAX_BODY_BYTES=str(LIMIT)))
    yield Stack(chroma_server, side, tmp / "ledger.db"), log
    side.stop()


def call(stack: Stack, log: Path, method: str, path: str, key: str | None = None, **kw: Any) -> tuple[httpx.Response, dict[str, Any]]:
    with stack.http(key) as h:
        r = h.request(method, path, **kw)
    return r, decision(log, r.headers["x-request-id"])


def test_every_status_has_its_decision_and_reason(logged: tuple[Stack, Path]) -> None:
    stack, log = logged
    t = stack.tenant("dl")
    owner = stack.key(t.name, "red", "owner", 1)
    other = stack.key(t.name, "red", "other", 1)
    reader = stack.key(t.name, "red", "reader", 0)
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    sha = stack.sidecar.readiness().json()["policy"]["sha256"]
    fact = {"mw_scope": "tenant", "mw_subject": "pipeline-7", "mw_predicate": "pipeline_status"}
    for key, ids, metas in ((owner, ["mine"], [{"mw_scope": "agent"}]), (other, ["theirs"], [{"mw_scope": "agent"}]),
                            (owner, ["v1"], [{**fact, "mw_object": "paused"}]),
                            (owner, ["v2"], [{**fact, "mw_object": "running"}])):
        r, e = call(stack, log, "POST", f"{base}/add", key, json={
            "ids": ids, "embeddings": [[0.1, 0.2]], "documents": [f"secret text of {ids[0]}"], "metadatas": metas})
        assert r.status_code == 200 and (e["decision"], e["reason"], e["action"]) == ("allow", None, "add")
        assert "write-trust-ladder" in e["policies"]

    # a row written straight into Chroma, around the sidecar: the ledger does not govern it
    stack.direct(t.name).get_collection(t.collection).add(ids=["ghost"], embeddings=[[0.1, 0.2]], documents=["raw"])
    # 200: one get names a readable row, a superseded one, another agent's private one and an ungoverned one
    r, e = call(stack, log, "POST", f"{base}/get", owner, json={"ids": ["theirs", "v1", "v2", "mine", "ghost"]})
    assert r.status_code == 200 and sorted(r.json()["ids"]) == ["mine", "v2"]
    assert (e["decision"], e["reason"], e["status"], e["mode"], e["policy_sha256"]) == ("allow", None, 200, "enforce", sha)
    assert (e["rows_allowed"], e["rows_denied"], e["rows_hidden_superseded"], e["rows_unknown"]) == (2, 1, 1, 1)
    assert e["row_deny_reasons"] == {"no_permit": 1, "superseded_row": 1, "unknown_row": 1}
    assert {"agent-search-list", "read-agent-scope", "read-tenant-scope"} <= set(e["policies"])
    assert sorted(e["row_ids"]) == ["mine", "v2"] and e["principal"] == f"Agent::{t.name}/red/owner"

    # 400: malformed input is an error, not an access decision
    r, e = call(stack, log, "POST", f"{base}/get", owner, json={"where": 5})
    assert r.status_code == 400 and (e["decision"], e["reason"]) == ("error", "bad_request")
    # 401
    r, e = call(stack, log, "POST", f"{base}/get", None, json={})
    assert r.status_code == 401 and (e["decision"], e["reason"], e["principal"]) == ("deny", "not_authenticated", None)
    assert e["policy_sha256"] == sha  # the set in force, though Cedar was never asked
    # 403: Cedar's deny (no permit for a trust-0 write), and a deployment-wide route (operators only)
    r, e = call(stack, log, "POST", f"{base}/add", reader, json={"ids": ["n"], "embeddings": [[0.1, 0.2]]})
    assert r.status_code == 403 and (e["decision"], e["reason"], e["action"]) == ("deny", "no_permit", "write")
    assert e["deny_policies"] is None and e["row_deny_reasons"] is None
    r, e = call(stack, log, "POST", "/api/v2/reset", owner)
    assert r.status_code == 403 and (e["decision"], e["reason"], e["action"]) == ("deny", "no_permit", "reset")
    # 403 by a forbid: another tenant's namespace
    r, e = call(stack, log, "GET", "/api/v2/tenants/someone-else/databases", owner)
    assert r.status_code == 403 and (e["decision"], e["reason"], e["deny_policies"]) == ("deny", "forbid", ["forbid-cross-tenant"])
    # 404: an unknown collection, an unmapped route, and an update of a row the caller cannot read
    r, e = call(stack, log, "POST", f"{base[:-36]}{'0' * 8}-0000-0000-0000-{'0' * 12}/get", owner, json={})
    assert r.status_code == 404 and (e["decision"], e["reason"]) == ("deny", "unknown_collection")
    r, e = call(stack, log, "GET", "/api/v2/no/such/route", owner)
    assert r.status_code == 404 and (e["decision"], e["reason"]) == ("deny", "unmapped_route")
    r, e = call(stack, log, "POST", f"{base}/update", owner, json={"ids": ["theirs"], "documents": ["x"]})
    assert r.status_code == 404 and (e["decision"], e["reason"]) == ("deny", "no_permit")
    # 409: the write was permitted, the id exists — not an allow
    r, e = call(stack, log, "POST", f"{base}/add", owner, json={"ids": ["mine"], "embeddings": [[0.1, 0.2]]})
    assert r.status_code == 409 and (e["decision"], e["reason"]) == ("error", "conflict")
    assert "write-trust-ladder" in e["policies"]
    # 413
    big = {"ids": ["big"], "embeddings": [[0.1, 0.2]], "documents": ["x" * (LIMIT + 1)]}
    r, e = call(stack, log, "POST", f"{base}/add", owner, json=big)
    assert r.status_code == 413 and (e["decision"], e["reason"]) == ("error", "payload_too_large")

    text = log.read_text()
    assert "secret text of" not in text and "x" * 100 not in text  # content is never logged
    for key in (owner, other, reader):
        assert key.split(".", 1)[1] not in text  # nor key secrets


def test_backend_down_is_an_error_not_a_decision(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    ledger = SQLiteLedger(tmp_path / "ledger.db")
    cid = "22222222-2222-2222-2222-222222222222"
    ledger.register_collection(CollectionRecord("chroma", cid, "t", "db", "mem", "x", 1))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    ledger.close()
    side = start_sidecar(f"http://127.0.0.1:{free_port()}", tmp_path / "ledger.db", POLICIES, extra_env=file_sink(log))
    try:
        stack = Stack(side, side, tmp_path / "ledger.db")
        r, e = call(stack, log, "POST", f"/api/v2/tenants/t/databases/db/collections/{cid}/get", key, json={})
        assert r.status_code == 502 and (e["decision"], e["reason"]) == ("error", "backend_error")
        assert e["policies"] == ["agent-search-list"]  # allowed by policy, answered by nobody
    finally:
        side.stop()
