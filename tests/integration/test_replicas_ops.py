"""Operator signals on a real `memwarden serve` process: SIGHUP reloads (invalid set rejected and
kept, valid set applied), shadow mode is refused without confirmation and loud when confirmed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from tests.integration.conftest import POLICIES

pytestmark = pytest.mark.integration


def metric(server: Server, line_prefix: str) -> float:
    assert server.metrics_url is not None
    for line in httpx.get(server.metrics_url, trust_env=False).text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(server: Server, line_prefix: str, value: float, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric(server, line_prefix) == value:
            return
        time.sleep(0.2)
    raise AssertionError(f"{line_prefix} never became {value}:\n{server.log_tail()}")


def test_sighup_reload(chroma_server: Server, tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(POLICIES, policies)
    side = start_sidecar(chroma_server.url, tmp_path / "ledger.db", policies,
                         extra_env={"MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0"})
    try:
        before = side.readiness().json()["policy"]["sha256"]
        (policies / "default.cedar").write_text("permit (principal, action, resource")  # does not parse
        side.proc.send_signal(signal.SIGHUP)
        wait_for(side, 'memwarden_policy_reloads_total{result="invalid"}', 1.0)
        assert metric(side, "memwarden_policy_last_reload_success") == 0.0
        assert side.readiness().json()["policy"]["sha256"] == before
        assert "policy_reload_rejected" in side.log.read_text()
        shutil.copy(POLICIES / "default.cedar", policies / "default.cedar")
        with open(policies / "default.cedar", "a") as fh:
            fh.write("\n// reviewed\n")
        side.proc.send_signal(signal.SIGHUP)
        wait_for(side, 'memwarden_policy_reloads_total{result="ok"}', 1.0)
        assert side.readiness().json()["policy"]["sha256"] != before
        assert side.proc.poll() is None
    finally:
        side.stop()


def test_shadow_mode_refused_then_loud(chroma_server: Server, tmp_path: Path) -> None:
    env = {**os.environ, "MEMWARDEN_BACKEND_URL": chroma_server.url, "MEMWARDEN_POLICIES_DIR": str(POLICIES),
           "MEMWARDEN_LEDGER_PATH": str(tmp_path / "l.db"), "MEMWARDEN_SHADOW_MODE": "true"}
    refused = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", "1"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "SHADOW_MODE_CONFIRM" in refused.stdout + refused.stderr
    # SHADOW_MODE=all (explicit): every denial within the tenant is shadowed, writes included (issue 34: the
    # default shadow mode, reads, enforces them — tests/integration/test_shadow_mode.py)
    side = start_sidecar(chroma_server.url, tmp_path / "ledger.db", POLICIES, extra_env={
        "MEMWARDEN_SHADOW_MODE": "all", "MEMWARDEN_SHADOW_MODE_CONFIRM": "decisions-are-not-enforced"})
    try:
        ready = side.readiness().json()
        assert ready["mode"] == "shadow-all" and "NOT enforced" in ready["warning"] and "destroyed" in ready["warning"]
        assert metric(side, "memwarden_shadow_mode") == 2.0
        assert "shadow_mode_enabled" in side.log.read_text()
        from sidecar.ledger import SQLiteLedger

        ledger = SQLiteLedger(tmp_path / "ledger.db")
        _, agent = ledger.create_key("agent", "shadowt", "red", "a", 0)
        ledger.close()
        # An agent key may not create tenants (request-level `admin`): denied by Cedar, forwarded in shadow mode.
        r = httpx.post(side.url + "/api/v2/tenants", json={"name": "shadowt"}, headers={"X-API-Key": agent}, trust_env=False)
        assert r.status_code == 200, r.text
        # The decision event is written after the answer has left (sidecar/app.py): wait for this request's.
        request_id = r.headers["x-request-id"]
        deadline = time.monotonic() + 10
        while True:
            events = []
            for line in side.log.read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue  # uvicorn's own lines
            decisions = [e for e in events if isinstance(e, dict) and e.get("event") == "decision"
                         and e.get("request_id") == request_id]
            if decisions or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert decisions and any("shadow-mode:would-deny" in json.dumps(e) for e in decisions), side.log_tail()
        assert "shadow_would_deny" in side.log.read_text()
    finally:
        side.stop()
