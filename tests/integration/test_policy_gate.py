"""One gate, everywhere: `memwarden serve` refuses a policy set that fails its invariants (exit 2, the
failing invariant, its counterexample and the permitting policy with file:line), also when the
invariant files were deleted from the policy directory, and hot reload refuses the same set and keeps
serving the last known good one. Real `memwarden serve` processes in front of the session's Chroma."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from memwarden_eval.harness import Server, free_port, start_sidecar
from tests.integration.conftest import POLICIES, Stack, chroma_client

pytestmark = pytest.mark.integration

ROOT = POLICIES.parent
BASELINE = ROOT / "invariants" / "baseline"
FIXTURES = ROOT / "tests" / "invariants" / "fixtures"
WIDEN = ('// an operator widens reads to the whole tenant\n'
         '@id("read-tenant-wide")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
         'when { resource.tenant == principal.tenant };\n')


def serve(policies: Path, tmp: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`memwarden serve` as an operator starts it; returns once it exits (a refusal) or raises on a timeout."""
    full = {**os.environ, "MEMWARDEN_LEDGER_PATH": str(tmp / "ledger.db"), "MEMWARDEN_METRICS_PORT": "0",
            **(env or {})}
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", str(free_port()),
                           "--policies", str(policies), *extra], capture_output=True, text=True, timeout=120, env=full)


def widened(tmp: Path, *, with_invariants: bool) -> Path:
    """A copy of policies/ plus the widening permit; optionally with the baseline's files copied into its
    invariants/ (the layout before the baseline moved into the package)."""
    d = tmp / "policies-widened"
    shutil.copytree(POLICIES, d)
    (d / "zz-widen.cedar").write_text(WIDEN)
    if with_invariants:
        shutil.copytree(BASELINE, d / "invariants")
    return d


def delete_invariants_and_their_tests(d: Path) -> None:
    """What the issue did: remove the invariant files and the policy test that caught the change."""
    shutil.rmtree(d / "invariants", ignore_errors=True)
    (d / "tests" / "read-scopes.json").unlink()


def assert_refusal_names_the_violation(proc: subprocess.CompletedProcess[str], policies: Path) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "policy set refused (invariant_violation)" in out and "nothing is served" in out
    line = next(ln for ln in out.splitlines() if "VIOLATED inv-scope" in ln)
    assert f"{BASELINE / 'inv-scope.cedar'}:" in line  # the invariant and where it is written
    assert re.search(r'counterexample Agent::"[^"]+" \{.*\} read Memory::"[^"]+" \{.*\} -> Cedar allow', line), line
    assert f"permitted by read-tenant-wide at {policies}/zz-widen.cedar:2" in line
    assert "mw-policies-" not in out and "Traceback" not in out


def test_start_up_refuses_a_widened_set(tmp_path: Path) -> None:
    d = widened(tmp_path, with_invariants=False)
    assert_refusal_names_the_violation(serve(d, tmp_path), d)


def test_start_up_refuses_it_with_the_invariant_files_deleted(tmp_path: Path) -> None:
    d = widened(tmp_path, with_invariants=True)
    delete_invariants_and_their_tests(d)
    proc = serve(d, tmp_path)
    assert_refusal_names_the_violation(proc, d)
    assert "policy test failed" not in proc.stderr  # the test file is gone: the invariant alone refuses it


def test_start_up_refuses_a_set_whose_forbid_can_error(tmp_path: Path) -> None:
    d = tmp_path / "erroring"
    d.mkdir()
    shutil.copy(POLICIES / "memwarden.cedarschema", d)
    shutil.copy(FIXTURES / "erroring-deleted-forbid" / "policies.cedar", d)
    proc = serve(d, tmp_path)
    out = proc.stderr
    assert proc.returncode == 2, out
    line = next(ln for ln in out.splitlines() if "VIOLATED never-errors" in ln)
    assert f"evaluation error in forbid-orphaned-or-deleted at {d}/policies.cedar:" in line


def test_pinned_invariants_dir_adds_to_the_baseline(tmp_path: Path) -> None:
    pinned = tmp_path / "pinned"
    pinned.mkdir()
    shutil.copy(ROOT / "tests" / "invariants" / "proposed-invariants.cedar", pinned)
    proc = serve(POLICIES, tmp_path, env={"MEMWARDEN_INVARIANTS_DIR": str(pinned)})
    assert proc.returncode == 2 and "VIOLATED update-delete-home-fleet" in proc.stderr, proc.stderr
    assert f"{pinned}/proposed-invariants.cedar:" in proc.stderr and "INVARIANTS_DIR=" in proc.stderr


def _private_row(stack: Stack) -> tuple[str, str, str]:
    """A tenant with an agent-scope row of red/owner; returns (tenant, collection id, other agent's key)."""
    t = stack.tenant("gate")
    owner = stack.key(t.name, "red", "owner", 1)
    other = stack.key(t.name, "red", "other", 1)
    coll = stack.client(owner, t.name).get_collection(t.collection)
    coll.add(ids=["private"], embeddings=[[0.1, 0.2]], documents=["owner's note"], metadatas=[{"mw_scope": "agent"}])
    return t.name, t.collection_id, other


def test_reload_refuses_the_same_set_and_keeps_serving_the_last_good_one(tmp_path: Path, stack: Stack) -> None:
    d = tmp_path / "policies"
    shutil.copytree(POLICIES, d)
    shutil.copytree(BASELINE, d / "invariants")
    side = start_sidecar(stack.chroma.url, stack.ledger_path, d, extra_env={"MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0"})
    try:
        with httpx.Client(base_url=side.url, timeout=30, trust_env=False) as h:
            good = side.readiness().json()["policy"]
            assert good["baseline_invariants"] >= 9 and good["last_reload_error"] is None
            tenant, cid, other = _private_row(stack)
            path = f"/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}/get"
            assert h.post(path, json={"ids": ["private"]}, headers={"X-API-Key": other}).json()["ids"] == []
            (d / "zz-widen.cedar").write_text(WIDEN)
            delete_invariants_and_their_tests(d)
            side.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and side.readiness().json()["policy"]["last_reload_error"] is None:
                time.sleep(0.2)
            ready = side.readiness()
            policy = ready.json()["policy"]
            assert ready.status_code == 200 and policy["sha256"] == good["sha256"]
            assert policy["last_reload_error"].startswith("invariant_violation: ")
            line = next(p for p in policy["last_reload_problems"] if p.startswith("VIOLATED inv-scope"))
            assert f"permitted by read-tenant-wide at {d}/zz-widen.cedar:2" in line and "mw-policies-" not in line
            # the widened set is not in force: the other agent still cannot read the owner's private row
            assert h.post(path, json={"ids": ["private"]}, headers={"X-API-Key": other}).json()["ids"] == []
            assert chroma_client(stack.chroma.port, tenant).get_collection("mem").get(ids=["private"])["ids"] == ["private"]
        events = [json.loads(x) for x in side.log.read_text().split("\n")[:-1] if x.startswith("{")]
        rejected = [e for e in events if e.get("event") == "policy_reload_rejected"]
        assert rejected and rejected[0]["result"] == "invariant_violation" and rejected[0]["kept_sha256"] == good["sha256"]
    finally:
        side.stop()


def test_serve_prints_the_start_up_banner(tmp_path: Path, chroma_server: Server) -> None:
    pinned = ROOT / "deploy" / "kubernetes" / "invariants"
    side = start_sidecar(chroma_server.url, tmp_path / "ledger.db", POLICIES,
                         extra_env={"MEMWARDEN_INVARIANTS_DIR": str(pinned)})
    try:
        sha = side.readiness().json()["policy"]["sha256"]
        text = side.log.read_text()
        assert f"listening on http://127.0.0.1:{side.port}" in text
        assert f"backend   chroma {chroma_server.url}" in text
        n_pinned = len(list(pinned.glob("*.cedar")))
        m = re.search(rf"policies  {re.escape(str(POLICIES))} sha256 {sha} — (\d+) policies; (\d+) invariants proved "
                      rf"\((\d+) baseline, pinned from {re.escape(str(pinned))}\); (\d+) policy tests passed", text)
        assert m, text
        from invariants.project import load_project

        assert int(m.group(2)) == int(m.group(3)) + n_pinned
        assert int(m.group(3)) == len(load_project(POLICIES).baseline_ids)
        assert f"ledger    sqlite {tmp_path / 'ledger.db'}" in text
        assert re.search(r"metrics   http://127\.0\.0\.1:\d+/metrics", text) and "mode      enforce" in text
    finally:
        side.stop()
