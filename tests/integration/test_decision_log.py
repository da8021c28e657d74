"""The decision log an auditor reads, Chroma profile, through a real `memwarden serve`: every status has
the right decision and reason (200/400/401/403/404/409/413/502), every event names the policy set it was
decided under and the determining policies, rows denied by Cedar are counted apart from superseded,
deleted and unknown rows, and no content or key is logged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from memwarden_eval.harness import Server, free_port, start_sidecar
from sidecar.ledger import CollectionRecord, SQLiteLedger
from tests.integration.conftest import POLICIES, Stack
from tests.integration.logutil import decision, decisions, file_sink

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
        assert r.status_code == 200 and (e["decision"], e["reason"], e["action"]) == ("allow", None, "write")
        assert "write-trust-ladder" in e["policies"] and e["actions"][:2] == ["list", "write"]

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
    assert e["deny_policies"] is None and e["row_deny_reasons"] == {"no_permit": 1} and e["deny_action"] == "write"
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
    assert "write-trust-ladder" in e["policies"] and (e["action"], e["deny_action"]) == ("write", None)
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


# -- issue 34, finding 4: the audit trail ---------------------------------------------------------------------


def test_every_event_says_who_from_where_how_and_on_what(logged: tuple[Stack, Path]) -> None:
    """The fields of schema version 1 on every kind of answer: 401 (no key, a revoked key, a malformed one) and
    404 carry the client address, the path and the credential kind; an authenticated event the key id and
    principal; one action name per operation (an add is ``write`` whether allowed, refused or conflicting)."""
    stack, log = logged
    t = stack.tenant("who")
    owner = stack.key(t.name, "red", "owner", 1)
    reader = stack.key(t.name, "red", "reader", 0)
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    # 401 without a key: client, path and "none"
    r, e = call(stack, log, "POST", f"{base}/get", None, json={})
    assert r.status_code == 401
    assert e["client"].startswith("127.0.0.1:") and int(e["client"].rsplit(":", 1)[1]) > 0
    assert (e["path"], e["auth"], e["key_id"], e["principal"]) == (f"{base}/get", "none", None, None)
    # 401 with a revoked key: its key id is logged (never the secret), no principal
    revoked = stack.key(t.name, "red", "gone", 1)
    kid = revoked.removeprefix("mwk_").split(".")[0]
    ledger = stack.ledger()
    try:
        ledger.revoke_key(kid)
    finally:
        ledger.close()
    with stack.http() as h:
        r = h.post(f"{base}/get", json={}, headers={"Authorization": f"Bearer {revoked}"})
    e = decision(log, r.headers["x-request-id"])
    assert r.status_code == 401 and (e["auth"], e["key_id"], e["principal"], e["reason"]) == (
        "authorization", kid, None, "not_authenticated")
    assert revoked.split(".", 1)[1] not in log.read_text()
    # 404 on an unmapped route: client and path
    r, e = call(stack, log, "GET", "/api/v2/no/such/route", owner)
    assert r.status_code == 404 and e["path"] == "/api/v2/no/such/route" and e["client"].startswith("127.0.0.1:")
    assert (e["auth"], e["key_id"], e["principal"]) == ("x-api-key", owner.removeprefix("mwk_").split(".")[0],
                                                         f"Agent::{t.name}/red/owner")
    # one action per operation: add is `write` allowed, refused (403) and conflicting (409)
    add = {"ids": ["w1"], "embeddings": [[0.1, 0.2]]}
    outcomes = []
    for key in (owner, reader, owner):
        r, e = call(stack, log, "POST", f"{base}/add", key, json=add)
        outcomes.append((r.status_code, e["action"], e["operation"]))
    assert outcomes == [(200, "write", "add"), (403, "write", "add"), (409, "write", "add")]
    # a get is `read` (its request-level `list` is in `actions`)
    r, e = call(stack, log, "POST", f"{base}/get", owner, json={"ids": ["w1"]})
    assert (e["action"], e["actions"], e["resource"]) == ("read", ["list", "read"], f"Collection::chroma:{t.collection_id}")


def test_deletes_and_updates_count_rows_alike_and_log_refused_ids(logged: tuple[Stack, Path]) -> None:
    """One counting rule: each row named counted once, by outcome; a refused delete (Chroma answers 200 with
    nothing deleted for an id the caller cannot see) names the refused row ids."""
    stack, log = logged
    t = stack.tenant("cnt")
    owner = stack.key(t.name, "red", "owner", 1)
    peer = stack.key(t.name, "red", "peer", 1)  # same fleet: reads the fleet rows, may change none of them
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    with stack.http(owner) as h:
        r = h.post(f"{base}/add", json={"ids": ["f1", "f2", "p1", "p2"], "embeddings": [[0.1, 0.2]] * 4,
                                         "metadatas": [{"mw_scope": "fleet"}] * 2 + [{"mw_scope": "agent"}] * 2})
        assert r.status_code == 200
    # allowed: one row updated, one deleted — the same counts
    _, up = call(stack, log, "POST", f"{base}/update", owner, json={"ids": ["f1"], "documents": ["x"]})
    _, de = call(stack, log, "POST", f"{base}/delete", owner, json={"ids": ["f2"]})
    for e, action in ((up, "update"), (de, "delete")):
        assert (e["action"], e["decision"], e["rows_allowed"], e["rows_denied"], e["row_ids"], e["denied_row_ids"]) == (
            action, "allow", 1, 0, [e["row_ids"][0]], None)
    # refused by Cedar on a row the caller can read: 403 for both, one denied row, its id
    r_up, up = call(stack, log, "POST", f"{base}/update", peer, json={"ids": ["f1"], "documents": ["y"]})
    r_de, de = call(stack, log, "POST", f"{base}/delete", peer, json={"ids": ["f1"]})
    assert r_up.status_code == r_de.status_code == 403
    for e, action in ((up, "update"), (de, "delete")):
        assert (e["decision"], e["deny_action"], e["rows_allowed"], e["rows_denied"], e["denied_row_ids"]) == (
            "deny", action, 0, 1, ["f1"]), e
        assert e["row_deny_reasons"] == {"no_permit": 1}
    # a row the caller cannot read: update 404, delete 200 with nothing deleted — both log the id as denied
    r_up, up = call(stack, log, "POST", f"{base}/update", peer, json={"ids": ["p1"], "documents": ["y"]})
    r_de, de = call(stack, log, "POST", f"{base}/delete", peer, json={"ids": ["p1"]})
    assert r_up.status_code == 404 and r_de.status_code == 200 and r_de.json() == {"deleted": 0}
    for e in (up, de):
        assert (e["decision"], e["rows_allowed"], e["rows_denied"], e["denied_row_ids"]) == ("deny", 0, 1, ["p1"]), e
    assert de["deny_action"] == "delete"
    # ids nobody governs count as unknown, not as denied, on both
    r_up, up = call(stack, log, "POST", f"{base}/update", owner, json={"ids": ["nope"], "documents": ["y"]})
    r_de, de = call(stack, log, "POST", f"{base}/delete", owner, json={"ids": ["nope"]})
    assert r_up.status_code == 404 and r_de.status_code == 200
    for e in (up, de):
        assert (e["rows_denied"], e["rows_unknown"], e["denied_row_ids"]) == (0, 1, ["nope"]), e
    # a deleted row: hidden as deleted on both
    r_up, up = call(stack, log, "POST", f"{base}/update", owner, json={"ids": ["f2"], "documents": ["y"]})
    r_de, de = call(stack, log, "POST", f"{base}/delete", owner, json={"ids": ["f2"]})
    assert r_up.status_code == 404 and r_de.status_code == 200
    for e in (up, de):
        assert (e["rows_denied"], e["rows_hidden_deleted"], e["denied_row_ids"]) == (0, 1, ["f2"]), e


def _six_requests(stack: Stack, log: Path) -> list[str]:
    t = stack.tenant("lvl")
    key = stack.key(t.name, "red", "a", 1)
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    ids = []
    with stack.http(key) as h:
        for r in (h.post(f"{base}/add", json={"ids": ["x"], "embeddings": [[0.1, 0.2]]}),
                  h.post(f"{base}/get", json={}), h.get(f"{base}/count"), h.get("/api/v2/no/such"),
                  h.post(f"{base}/delete", json={"ids": ["x"]})):
            ids.append(r.headers["x-request-id"])
    with stack.http() as h:
        ids.append(h.post(f"{base}/get", json={}).headers["x-request-id"])
    return ids


@pytest.mark.parametrize("level", ["WARNING", "error"])
def test_the_log_level_never_silences_the_decision_log(tmp_path: Path, chroma_server: Server, level: str) -> None:
    """``LOG_LEVEL=WARNING`` wrote 0 decision lines for 6 requests on main."""
    log = tmp_path / "decisions.jsonl"
    side = start_sidecar(chroma_server.url, tmp_path / "ledger.db", POLICIES,
                         extra_env=file_sink(log, MEMWARDEN_LOG_LEVEL=level))
    try:
        ids = _six_requests(Stack(chroma_server, side, tmp_path / "ledger.db"), log)
        for rid in ids:  # each of the 6 requests has its event (and so has every request of the set-up)
            decision(log, rid)
        assert len(decisions(log)) >= 6
    finally:
        side.stop()


def test_decision_log_off_is_explicit(tmp_path: Path, chroma_server: Server) -> None:
    log = tmp_path / "decisions.jsonl"
    side = start_sidecar(chroma_server.url, tmp_path / "ledger.db", POLICIES,
                         extra_env=file_sink(log, MEMWARDEN_DECISION_LOG="off"))
    try:
        stack = Stack(chroma_server, side, tmp_path / "ledger.db")
        _six_requests(stack, log)
        assert decisions(log) == []
        assert "decision_log_off" in log.read_text() and "decisions OFF" in side.log.read_text()
        assert side.readiness().json()["decision_log"] == "off"
    finally:
        side.stop()


def test_an_unknown_log_level_stops_serve(tmp_path: Path, chroma_server: Server) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.upper().startswith("MEMWARDEN_")},
           "MEMWARDEN_BACKEND_URL": chroma_server.url, "MEMWARDEN_POLICIES_DIR": str(POLICIES),
           "MEMWARDEN_LEDGER_PATH": str(tmp_path / "l.db"), "MEMWARDEN_LOG_LEVEL": "verbose"}
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", str(free_port())], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "MEMWARDEN_LOG_LEVEL" in out.stdout + out.stderr
    assert "unknown log level 'verbose'" in out.stdout + out.stderr
