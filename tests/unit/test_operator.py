"""Operator features in-process: probes, Prometheus metrics, hot reload (valid, invalid and
invariant-violating sets), shadow mode, decision-log sinks and masking."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.ledger import CollectionRecord, SQLiteLedger
from sidecar.stages.forward import Upstream

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
BROKEN = ROOT / "tests" / "invariants" / "fixtures" / "missing-tenant-check" / "policies.cedar"
CID = "11111111-1111-1111-1111-111111111111"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"
SHADOW = {"shadow_mode": True, "shadow_mode_confirm": "decisions-are-not-enforced"}


def reply(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/get"):
        return httpx.Response(200, json={"ids": ["r1", "r2"], "metadatas": [{}, {}], "documents": ["a", "b"], "included": []})
    return httpx.Response(200, json=True)


def empty(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/get"):
        return httpx.Response(200, json={"ids": [], "metadatas": [], "documents": [], "included": []})
    return httpx.Response(200, json=True)


def down(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


@pytest.fixture
def ledger(tmp_path: Path) -> SQLiteLedger:
    led = SQLiteLedger(tmp_path / "l.db")
    led.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    return led


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    return target


def make(ledger: SQLiteLedger, policies_dir: Path = POLICIES, handler: Any = reply, **settings: Any) -> tuple[TestClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def transport(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    app = create_app(Settings(policies_dir=policies_dir, backend_url="http://backend:9", policy_watch_interval_s=0, **settings),
                     transport=httpx.MockTransport(transport), ledger=ledger)
    return TestClient(app), seen


def details(client: TestClient, ledger: SQLiteLedger) -> httpx.Response:
    """``/_memwarden/readyz`` with an operator key: the details (checks, policy set, mode)."""
    key = ledger.create_key("operator", None, None, None, 0)[1]
    return client.get("/_memwarden/readyz", headers={"X-API-Key": key})


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.app.state.services.metrics.render().decode()  # type: ignore[attr-defined]
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def test_probes(ledger: SQLiteLedger) -> None:
    client, _ = make(ledger)
    assert client.get("/_memwarden/healthz").json() == {"status": "ok"}
    assert client.get("/_memwarden/readyz").json() == {"ready": True}
    r = details(client, ledger)
    assert r.status_code == 200 and r.json()["checks"] == {"ledger": True, "policies": True, "backend": True}
    assert r.json()["mode"] == "enforce" and len(r.json()["policy"]["sha256"]) == 64
    assert value(samples(client), "memwarden_ready") == 1


def test_only_the_three_operational_routes_skip_authentication(ledger: SQLiteLedger) -> None:
    client, seen = make(ledger)
    key = ledger.create_key("agent", "t", "f", "a", 1)[1]
    for path in ("/_memwarden/docs", "/_memwarden/%6Detrics", "/_memwarden/healthz/", "/_memwarden/memories/r1/lineage",
                 "/_memwarden/openapi.json", "/_memwarden/metrics"):
        assert client.get(path).status_code == 401, path  # the pipeline answers, and authenticates first
    authed = {"Authorization": f"Bearer {key}"}
    assert client.get("/_memwarden/docs", headers=authed).status_code == 404
    assert client.get("/_memwarden/%6Detrics", headers=authed).status_code == 404
    assert client.get(f"/_memwarden/memories/r1/lineage?collection={CID}", headers=authed).status_code == 404
    assert seen == []  # none of it reached the backend
    with pytest.raises(Exception):  # no WebSocket route: the connection is closed before any framework code
        with client.websocket_connect("/_memwarden/healthz"):
            pass


def test_readyz_is_503_when_backend_or_ledger_is_down(ledger: SQLiteLedger, tmp_path: Path) -> None:
    client, _ = make(ledger, handler=down)
    assert client.get("/_memwarden/healthz").status_code == 200  # the process is up
    r = client.get("/_memwarden/readyz")
    assert r.status_code == 503 and r.json() == {"ready": False}
    r = details(client, ledger)
    assert r.status_code == 503 and r.json()["checks"]["backend"] is False
    assert value(samples(client), "memwarden_ready") == 0
    other = SQLiteLedger(tmp_path / "other.db")
    client, _ = make(other)
    other.close()
    r = client.get("/_memwarden/readyz")
    assert r.status_code == 503 and r.json() == {"ready": False}  # no operator key can be checked either
    from sidecar.app import readiness

    ready, body = asyncio.run(readiness(client.app.state.services))  # type: ignore[attr-defined]
    assert not ready and body["checks"]["ledger"] is False  # type: ignore[index]


def test_metrics_count_requests_decisions_rows_and_latencies(ledger: SQLiteLedger) -> None:
    from sidecar.governance import Row

    ledger.reserve_rows([Row("chroma", CID, "r1", "t", "red", "t/red/a", "fleet", "t/red/a", 1)])
    ledger.activate_rows("chroma", CID, ["r1"])
    client, _ = make(ledger)
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    r = client.post(f"{BASE}/get", json={}, headers={"X-API-Key": key})
    assert r.status_code == 200 and r.json()["ids"] == ["r1"]  # r2 is not in the ledger: filtered
    assert client.post(f"{BASE}/get", json={}).status_code == 401
    m = samples(client)
    assert value(m, "memwarden_requests_total", operation="get", action="read", decision="allow", status="200") == 1
    assert value(m, "memwarden_requests_total", operation="unrouted", action="none", decision="deny", status="401") == 1
    assert value(m, "memwarden_rows_total", result="allowed") == 1
    assert value(m, "memwarden_rows_total", result="unknown") == 1
    assert sum(v for (n, labels), v in m.items() if n == "memwarden_cedar_decisions_total" and ("decision", "allow") in labels) >= 1
    assert value(m, "memwarden_cedar_batch_duration_seconds_count") >= 1
    assert sum(v for (n, labels), v in m.items() if n == "memwarden_backend_request_duration_seconds_count"
               and ("outcome", "ok") in labels) >= 1
    assert value(m, "memwarden_ledger_call_duration_seconds_count", method="authenticate") == 1  # no key: no lookup
    assert value(m, "memwarden_request_duration_seconds_count") == 2
    assert value(m, "memwarden_shadow_mode") == 0 and value(m, "memwarden_policy_last_reload_success") == 1


def test_reconciler_state_is_exported(ledger: SQLiteLedger) -> None:
    ledger.tombstone("chroma", CID, ["gone"], "t/red/a", "req")
    client, seen = make(ledger, handler=down)
    with client:  # lifespan: the start-up reconciler run fails (backend down)
        m = samples(client)
        assert value(m, "memwarden_reconciler_runs_total", result="error") == 1
        assert value(m, "memwarden_reconciler_pending_tombstones") == 1
    client, _ = make(ledger)
    with client:
        m = samples(client)
        assert value(m, "memwarden_reconciler_runs_total", result="ok") == 1
        assert value(m, "memwarden_reconciler_pending_tombstones") == 0
        assert value(m, "memwarden_reconciler_last_success_timestamp_seconds") > 0


def test_reload_valid_invalid_and_invariant_violating(ledger: SQLiteLedger, policies: Path) -> None:
    client, _ = make(ledger, policies)
    handle = client.app.state.services.policy  # type: ignore[attr-defined]
    first_engine, first_sha = handle.engine, handle.digest
    assert handle.reload() == "unchanged"
    # valid: the same rules plus a comment — parsed, validated, policy-check passes, applied
    with open(policies / "default.cedar", "a") as fh:
        fh.write("\n// reviewed\n")
    assert handle.reload() == "ok" and handle.engine is not first_engine and handle.digest != first_sha
    good_engine, good_sha = handle.engine, handle.digest
    # invalid: does not parse → last known good kept, reported
    (policies / "default.cedar").write_text((policies / "default.cedar").read_text() + "\npermit (principal, action, resource")
    assert handle.reload() == "invalid" and handle.engine is good_engine and handle.digest == good_sha
    m = samples(client)
    assert value(m, "memwarden_policy_reloads_total", result="invalid") == 1
    assert value(m, "memwarden_policy_last_reload_success") == 0
    assert "invalid" in details(client, ledger).json()["policy"]["last_reload_error"]
    # valid Cedar that breaks tenant isolation: policy-check rejects it, last known good kept
    shutil.copy(BROKEN, policies / "default.cedar")
    assert handle.reload() == "invariant_violation" and handle.engine is good_engine
    m = samples(client)
    assert value(m, "memwarden_policy_reloads_total", result="invariant_violation") == 1
    assert value(m, "memwarden_policy_set_info", sha256=good_sha) == 1
    assert client.get("/_memwarden/readyz").status_code == 200  # still serving the last known good set


def test_reload_changes_decisions_and_is_never_half_applied(ledger: SQLiteLedger, policies: Path) -> None:
    client, _ = make(ledger, policies)
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    assert client.post(f"{BASE}/get", json={}, headers={"X-API-Key": key}).status_code == 200
    # Two files change in one reload: a forbid for this agent, and a comment; both pass the gate.
    (policies / "zz-freeze.cedar").write_text('@id("freeze-t-red-a")\nforbid (principal == Agent::"t/red/a", action, resource);\n')
    with open(policies / "default.cedar", "a") as fh:
        fh.write("\n// frozen: t/red/a\n")
    assert client.app.state.services.policy.reload() == "ok"  # type: ignore[attr-defined]
    r = client.post(f"{BASE}/get", json={}, headers={"X-API-Key": key})
    assert r.status_code == 403  # forbid overrides permit: the whole new set is in force


def test_watcher_applies_a_valid_change(ledger: SQLiteLedger, policies: Path) -> None:
    app = create_app(Settings(policies_dir=policies, backend_url="http://backend:9", policy_watch_interval_s=0.2),
                     transport=httpx.MockTransport(reply), ledger=ledger)
    op = {"X-API-Key": ledger.create_key("operator", None, None, None, 0)[1]}
    with TestClient(app) as client:
        before = client.get("/_memwarden/readyz", headers=op).json()["policy"]["sha256"]
        with open(policies / "default.cedar", "a") as fh:
            fh.write("\n// watched\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and client.get("/_memwarden/readyz", headers=op).json()["policy"]["sha256"] == before:
            time.sleep(0.2)
        assert client.get("/_memwarden/readyz", headers=op).json()["policy"]["sha256"] != before
        assert value(samples(client), "memwarden_policy_reloads_total", result="ok") == 1


def test_shadow_mode_refused_unless_confirmed(ledger: SQLiteLedger) -> None:
    with pytest.raises(pydantic.ValidationError, match="SHADOW_MODE_CONFIRM"):
        Settings(shadow_mode=True)


def test_shadow_mode_forwards_denied_writes_only_when_all_and_is_loud(ledger: SQLiteLedger) -> None:
    _, reader = ledger.create_key("agent", "t", "red", "ro", 0)  # trust 0: writes are denied
    body = {"ids": ["n1"], "embeddings": [[1.0]], "documents": ["x"]}
    client, seen = make(ledger, handler=empty)
    assert client.post(f"{BASE}/add", json=body, headers={"X-API-Key": reader}).status_code == 403
    assert not any(r.url.path.endswith("/add") for r in seen)
    # shadow mode "reads" (and the legacy "true"): a denied write is still refused, nothing is forwarded
    for mode in (True, "reads"):
        led = SQLiteLedger(":memory:")
        led.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
        _, ro = led.create_key("agent", "t", "red", "ro", 0)
        client, seen = make(led, handler=empty, **{**SHADOW, "shadow_mode": mode})
        assert client.post(f"{BASE}/add", json=body, headers={"X-API-Key": ro}).status_code == 403
        assert not any(req.url.path.endswith("/add") for req in seen)
        ready = details(client, led).json()
        assert ready["mode"] == "shadow" and "NOT enforced" in ready["warning"] and "writes, updates and deletes are" in ready["warning"]
        m = samples(client)
        assert value(m, "memwarden_shadow_mode") == 1 and value(m, "memwarden_shadow_would_deny_total", action="write") == 0
    # "all", explicitly: the denied write is forwarded, counted and flagged
    ledger2 = SQLiteLedger(":memory:")
    ledger2.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    _, reader2 = ledger2.create_key("agent", "t", "red", "ro", 0)
    client, seen = make(ledger2, handler=empty, **{**SHADOW, "shadow_mode": "all"})
    r = client.post(f"{BASE}/add", json=body, headers={"X-API-Key": reader2})
    assert r.status_code == 200 and any(req.url.path.endswith("/add") for req in seen)
    assert client.post(f"{BASE}/add", json=body, headers={"X-API-Key": "mwk_nope.nope"}).status_code == 401  # authn still enforced
    ready = details(client, ledger2).json()
    assert ready["mode"] == "shadow-all" and "destroyed" in ready["warning"]
    m = samples(client)
    assert value(m, "memwarden_shadow_mode") == 2
    assert value(m, "memwarden_shadow_would_deny_total", action="write") == 1


def test_file_sink_rotates_and_masks(tmp_path: Path) -> None:
    """structlog is configured once per process, so the sink is exercised in a fresh interpreter."""
    log = tmp_path / "logs" / "decisions.jsonl"
    script = f"""
import httpx
from pathlib import Path
from starlette.testclient import TestClient
from sidecar import Settings, create_app
from sidecar.ledger import SQLiteLedger
led = SQLiteLedger(":memory:")
_, key = led.create_key("agent", "t", "red", "a", 1)
app = create_app(Settings(policies_dir={str(POLICIES)!r}, backend_url="http://b:9", policy_watch_interval_s=0,
                          decision_log_sink="file", decision_log_path={str(log)!r}, decision_log_max_bytes=2000,
                          decision_log_backups=2, decision_log_mask="principal,row_ids"),
                 transport=httpx.MockTransport(lambda r: httpx.Response(200, json=True)), ledger=led)
c = TestClient(app)
for _ in range(30):
    c.post("/api/v2/tenants/t/databases/db/collections/nope/get", json={{}}, headers={{"X-API-Key": key}})
print("done")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "decision" not in out.stdout  # nothing on stdout: the file sink took it
    files = sorted(p.name for p in log.parent.iterdir())
    assert files == ["decisions.jsonl", "decisions.jsonl.1", "decisions.jsonl.2"]
    events = [json.loads(line) for p in log.parent.iterdir() for line in p.read_text().splitlines()]
    decisions = [e for e in events if e["event"] == "decision"]
    assert decisions and all(e["principal"].startswith("mask:") for e in decisions)
    assert len({e["principal"] for e in decisions}) == 1  # masked values still correlate
    assert all("t/red/a" not in json.dumps(e) for e in events)
    assert all(p.stat().st_size <= 2600 for p in log.parent.iterdir())


def test_config_file_environment_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "memwarden.toml"
    cfg.write_text('backend_url = "http://from-file:1"\nledger_schema = "from_file"\ndecision_log_mask = "principal"\n')
    monkeypatch.setenv("MEMWARDEN_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("MEMWARDEN_LEDGER_SCHEMA", "from_env")
    s = Settings()
    assert str(s.backend_url) == "http://from-file:1/" and s.ledger_schema == "from_env" and s.decision_log_mask == "principal"
    assert Settings(ledger_schema="from_init").ledger_schema == "from_init"
    cfg.write_text('no_such_option = 1\n')
    with pytest.raises(pydantic.ValidationError, match="no_such_option"):
        Settings()
    monkeypatch.setenv("MEMWARDEN_CONFIG_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match="MEMWARDEN_CONFIG_FILE"):
        Settings()


def test_backend_credential_header_follows_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []
    monkeypatch.delenv("MEMWARDEN_BACKEND_AUTH_HEADER", raising=False)
    monkeypatch.setenv("MEMWARDEN_BACKEND", "mem0")
    assert Settings().backend_auth_header == "X-API-Key"  # Mem0's server answers 401 to a Bearer token
    assert Settings(backend="chroma").backend_auth_header == "Authorization"
    monkeypatch.setenv("MEMWARDEN_BACKEND_AUTH_HEADER", "Authorization")
    assert Settings().backend_auth_header == "Authorization"  # an explicit choice wins
    monkeypatch.delenv("MEMWARDEN_BACKEND_AUTH_HEADER")
    s = Settings(backend_token="admin-secret")

    async def go() -> None:
        up = Upstream("http://mem0:8888", timeout_s=1, max_connections=1, auth_header=s.backend_auth_header, token=s.backend_token,
                      transport=httpx.MockTransport(lambda r: (seen.append(r), httpx.Response(200, json=[]))[1]))
        await up.call("GET", ["memories"])
        await up.close()

    asyncio.run(go())
    assert seen[0].headers["x-api-key"] == "admin-secret" and "authorization" not in seen[0].headers


def _configmap_layout(root: Path, version: str, source: Path) -> None:
    """What the kubelet makes of a ConfigMap volume with items: files in a hidden versioned dir,
    ``..data`` pointing at it, and top-level symlinks through ``..data``; updates swap ``..data``."""
    shutil.copytree(source, root / version)
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(version)
    tmp_link.rename(root / "..data")  # atomic swap, as the kubelet does
    names = {entry.name for entry in source.iterdir()}
    for link in root.iterdir():
        if link.is_symlink() and not link.name.startswith("..") and link.name not in names:
            link.unlink()  # the kubelet removes the links of keys that left the ConfigMap
    for name in names:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)


def test_reload_from_a_kubernetes_configmap_volume(ledger: SQLiteLedger, tmp_path: Path) -> None:
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    _configmap_layout(mounted, "..2026_01", POLICIES)
    client, _ = make(ledger, mounted)
    handle = client.app.state.services.policy  # type: ignore[attr-defined]
    assert handle.reload() == "unchanged"
    update = tmp_path / "update"
    shutil.copytree(POLICIES, update)
    (update / "invariants").mkdir()
    shutil.copy(BROKEN, update / "invariants" / "zz-broken-policy-as-invariant.cedar")  # only invariants/ changes
    _configmap_layout(mounted, "..2026_02", update)
    assert handle.reload() in ("invalid", "invariant_violation")  # the change below a symlinked dir is seen
    shutil.rmtree(update)
    shutil.copytree(POLICIES, update)
    with open(update / "default.cedar", "a") as fh:
        fh.write("\n// v3\n")
    _configmap_layout(mounted, "..2026_03", update)
    assert handle.reload() == "ok"


def test_reload_when_policy_check_cannot_run_keeps_the_old_set(ledger: SQLiteLedger, policies: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import sidecar.policy_reload as pr

    client, _ = make(ledger, policies)
    handle = client.app.state.services.policy  # type: ignore[attr-defined]
    engine = handle.engine

    def broken(*args: Any) -> Any:
        raise OSError("no interpreter")

    monkeypatch.setattr(pr, "run_gate", broken)
    with open(policies / "default.cedar", "a") as fh:
        fh.write("\n// unchecked\n")
    assert handle.reload() == "error" and handle.engine is engine
    assert value(samples(client), "memwarden_policy_reloads_total", result="error") == 1


def test_readyz_details_only_to_an_operator_key(ledger: SQLiteLedger, policies: Path) -> None:
    """Issue 34, finding 12: on the API port readyz answers without a key, so it says ready or not (200/503)
    and nothing else; the details — absolute policy paths in reload problems, counterexamples, the checks,
    the mode — go to an operator key only (and to the metrics listener, `serve_metrics`)."""
    client, _ = make(ledger, policies)
    (policies / "default.cedar").write_text((policies / "default.cedar").read_text() + "\npermit (principal, action, resource")
    assert client.app.state.services.policy.reload() == "invalid"  # type: ignore[attr-defined]
    agent = ledger.create_key("agent", "t", "red", "a", 3)[1]
    admin = ledger.create_key("admin", "t", None, None, 0)[1]
    operator = ledger.create_key("operator", None, None, None, 0)[1]
    for headers in ({}, {"X-API-Key": agent}, {"Authorization": f"Bearer {admin}"}, {"X-API-Key": "mwk_nope.nope"},
                    {"X-API-Key": operator, "Authorization": f"Bearer {agent}"}):  # ambiguous: refused, no details
        r = client.get("/_memwarden/readyz", headers=headers)
        assert r.status_code == 200 and r.json() == {"ready": True}, headers
        assert str(policies) not in r.text
    for headers in ({"X-API-Key": operator}, {"Authorization": f"Bearer {operator}"}):
        r = client.get("/_memwarden/readyz", headers=headers)
        body = r.json()
        assert r.status_code == 200 and body["ready"] is True and body["checks"]["backend"] is True
        assert "invalid" in body["policy"]["last_reload_error"] and str(policies) in json.dumps(body["policy"])


def test_metrics_listener_serves_readiness_details(ledger: SQLiteLedger) -> None:
    """The operator listener (`serve_metrics`): ``/_memwarden/readyz`` answers what it is given, as JSON with
    200 or 503; every other path the exposition text."""
    from memwarden_eval.harness import free_port
    from sidecar.metrics import Metrics, serve_metrics

    state: dict[str, Any] = {"ready": True}
    metrics = Metrics()
    port = free_port()
    stop = serve_metrics(metrics, "127.0.0.1", port, readyz=lambda: (state["ready"], {"ready": state["ready"], "policy": "p"}))
    try:
        url = f"http://127.0.0.1:{port}"
        r = httpx.get(url + "/_memwarden/readyz", trust_env=False)
        assert r.status_code == 200 and r.json() == {"ready": True, "policy": "p"}
        state["ready"] = False
        r = httpx.get(url + "/_memwarden/readyz", trust_env=False)
        assert r.status_code == 503 and r.json() == {"ready": False, "policy": "p"}
        for path in ("/metrics", "/"):
            r = httpx.get(url + path, trust_env=False)
            assert r.status_code == 200 and "memwarden_ready" in r.text
    finally:
        stop()
