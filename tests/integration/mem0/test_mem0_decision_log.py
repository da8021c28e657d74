"""The decision log and shadow mode on the Mem0 profile, through real `memwarden serve` processes in front
of the Mem0 REST test server (real `mem0ai` `Memory`): decisions and reasons for 200/400/401/403/404/409/
413/502 (a Mem0 404 for a readable memory is an error, not a deny by the permit that allowed it), and in
shadow mode the rows enforcement would hide are served and logged as would-deny with their reason, while
tenant isolation stays enforced."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from memwarden_eval.harness import Server, free_port, start_sidecar
from tests.integration.conftest import POLICIES
from tests.integration.logutil import decision, file_sink
from tests.integration.mem0.conftest import Mem0Stack, sidecar_env

pytestmark = pytest.mark.integration

LIMIT = 65536
SHADOW = {"MEMWARDEN_SHADOW_MODE": "true", "MEMWARDEN_SHADOW_MODE_CONFIRM": "decisions-are-not-enforced"}


def _stack(tmp: Path, mem0: Server, **env: str) -> tuple[Mem0Stack, Path]:
    log = tmp / "decisions.jsonl"
    side = start_sidecar(mem0.url, tmp / "ledger.db", POLICIES, extra_env=sidecar_env(file_sink(log, **env)))
    return Mem0Stack(mem0, side, tmp / "ledger.db"), log


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory, mem0_server: Server) -> Iterator[tuple[Mem0Stack, Path]]:
    s, log = _stack(tmp_path_factory.mktemp("mem0log"), mem0_server, MEMWARDEN_MAX_BODY_BYTES=str(LIMIT))
    yield s, log
    s.sidecar.stop()


@pytest.fixture(scope="module")
def shadow(tmp_path_factory: pytest.TempPathFactory, mem0_server: Server) -> Iterator[tuple[Mem0Stack, Path]]:
    s, log = _stack(tmp_path_factory.mktemp("mem0shadow"), mem0_server, **SHADOW)
    yield s, log
    s.sidecar.stop()


def call(s: Mem0Stack, log: Path, method: str, path: str, key: str | None, **kw: Any) -> tuple[httpx.Response, dict[str, Any]]:
    with s.http(key) as h:
        r = h.request(method, path, **kw)
    return r, decision(log, r.headers["x-request-id"])


def add(s: Mem0Stack, log: Path, key: str, text: str, **meta: str) -> tuple[httpx.Response, dict[str, Any]]:
    return call(s, log, "POST", "/memories", key, json={"messages": [{"role": "user", "content": text}],
                                                        "infer": False, "metadata": meta})


def test_every_status_has_its_decision_and_reason(logged: tuple[Mem0Stack, Path]) -> None:
    s, log = logged
    w = s.world([("red", "owner", 1), ("red", "other", 1), ("red", "reader", 0)], prefix="mdl")
    owner, other, reader = w.keys["owner"], w.keys["other"], w.keys["reader"]
    sha = s.sidecar.readiness().json()["policy"]["sha256"]
    r, e = add(s, log, owner, "owner's private note about the launch", mw_scope="agent")
    assert r.status_code == 200 and (e["decision"], e["reason"], e["action"], e["policy_sha256"]) == ("allow", None, "write", sha)
    private = r.json()["results"][0]["id"]
    fact = {"mw_scope": "tenant", "mw_subject": "pipeline-9", "mw_predicate": "pipeline_status"}
    add(s, log, owner, "pipeline nine is paused", **fact, mw_object="paused")
    add(s, log, owner, "pipeline nine is running", **fact, mw_object="running")

    # 200: the owner's list hides the superseded fact — counted apart from Cedar's denials
    r, e = call(s, log, "GET", "/memories", owner)
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    assert (e["decision"], e["rows_allowed"], e["rows_hidden_superseded"], e["rows_denied"]) == ("allow", 2, 1, 0)
    r, e = call(s, log, "GET", "/memories", other)
    assert (e["rows_allowed"], e["rows_denied"], e["row_deny_reasons"]) == (1, 1, {"no_permit": 1, "superseded_row": 1})
    # 400, 401, 403
    r, e = call(s, log, "POST", "/memories", owner, json={"messages": "not a list", "infer": False})
    assert r.status_code == 400 and (e["decision"], e["reason"]) == ("error", "bad_request")
    r, e = call(s, log, "GET", "/memories", None)
    assert r.status_code == 401 and (e["decision"], e["reason"]) == ("deny", "not_authenticated")
    r, e = add(s, log, reader, "a trust-0 agent may not write")
    assert r.status_code == 403 and (e["decision"], e["reason"], e["action"]) == ("deny", "no_permit", "write")
    # 404: Cedar's deny, an unknown id, and a readable memory Mem0 itself no longer has
    r, e = call(s, log, "GET", f"/memories/{private}", other)
    assert r.status_code == 404 and (e["decision"], e["reason"]) == ("deny", "no_permit")
    r, e = call(s, log, "GET", "/memories/6f1c1d9e-0000-4000-8000-000000000000", owner)
    assert r.status_code == 404 and (e["decision"], e["reason"]) == ("deny", "unknown_row")
    with s.direct() as d:
        assert d.delete(f"/memories/{private}").status_code == 200
    r, e = call(s, log, "GET", f"/memories/{private}", owner)
    assert r.status_code == 404 and (e["decision"], e["reason"]) == ("error", "backend_not_found")
    assert "read-agent-scope" in e["policies"]  # the permit allowed it; the backend did not have it
    # 409: deleted content its writer could read may not come back
    r, _ = add(s, log, owner, "the launch code is blue falcon")
    gone = r.json()["results"][0]["id"]
    assert call(s, log, "DELETE", f"/memories/{gone}", owner)[0].status_code == 200
    r, e = add(s, log, owner, "the launch code is blue falcon")
    assert r.status_code == 409 and (e["decision"], e["reason"]) == ("error", "conflict")
    # 413
    r, e = add(s, log, owner, "x" * (LIMIT + 1))
    assert r.status_code == 413 and (e["decision"], e["reason"]) == ("error", "payload_too_large")
    text = log.read_text()
    assert "blue falcon" not in text and "private note" not in text and "x" * 100 not in text
    assert all(k.split(".", 1)[1] not in text for k in (owner, other, reader))


def test_backend_down_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    side = start_sidecar(f"http://127.0.0.1:{free_port()}", tmp_path / "ledger.db", POLICIES,
                         extra_env=sidecar_env(file_sink(log)))
    try:
        s = Mem0Stack(side, side, tmp_path / "ledger.db")
        key = s.key("t", "red", "a", 1)
        r, e = call(s, log, "POST", "/search", key, json={"query": "anything"})
        assert r.status_code == 502 and (e["decision"], e["reason"]) == ("error", "backend_error")
        assert e["policies"] == ["agent-search-list"]
    finally:
        side.stop()


def test_shadow_mode_serves_and_logs_would_deny_rows(shadow: tuple[Mem0Stack, Path]) -> None:
    s, log = shadow
    w = s.world([("red", "owner", 1), ("blue", "peer", 1)], prefix="msh")
    text = "owner's agent-scope memo about the orchard harvest"
    r, _ = add(s, log, w.keys["owner"], text, mw_scope="agent")
    private = r.json()["results"][0]["id"]
    peer = w.keys["peer"]
    # get, search and list: the peer is served the row enforcement would hide, each logged as would-deny
    r, e = call(s, log, "GET", f"/memories/{private}", peer)
    assert r.status_code == 200 and r.json()["id"] == private
    assert (e["mode"], e["decision"], e["would_deny"], e["would_deny_reasons"]) == ("shadow", "allow", 1, {"no_permit": 1})
    assert e["would_deny_row_ids"] == [private]
    r, e = call(s, log, "POST", "/search", peer, json={"query": text, "top_k": 3, "threshold": 0.0})
    assert private in [m["id"] for m in r.json()["results"]] and private in e["would_deny_row_ids"]
    r, e = call(s, log, "GET", "/memories", peer)
    assert private in [m["id"] for m in r.json()["results"]] and e["would_deny_reasons"] == {"no_permit": 1}
    # tenant isolation stays enforced: another tenant sees nothing of it
    stranger = s.world([("red", "x", 3)], prefix="msx").keys["x"]
    r, e = call(s, log, "GET", f"/memories/{private}", stranger)
    assert r.status_code == 404 and e["would_deny"] == 0
    r, e = call(s, log, "POST", "/search", stranger, json={"query": text, "top_k": 3, "threshold": 0.0})
    assert private not in [m["id"] for m in r.json()["results"]]
    # shadow mode (reads) never carries out a denied change: the peer's update and delete are refused (issue 34)
    r, e = call(s, log, "PUT", f"/memories/{private}", peer, json={"text": "overwritten"})
    assert r.status_code == 403 and (e["deny_action"], e["denied_row_ids"]) == ("update", [private])
    r, e = call(s, log, "DELETE", f"/memories/{private}", peer)
    assert r.status_code == 403 and (e["action"], e["deny_action"], e["denied_row_ids"]) == ("delete", "delete", [private])
    r, _ = call(s, log, "GET", f"/memories/{private}", w.keys["owner"])
    assert r.status_code == 200 and r.json()["memory"] == text
