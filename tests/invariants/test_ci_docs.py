"""Issue 38 item 6: the CI snippets of docs/ci.md and the pre-commit hook run as documented.

The ``policy-check`` command lines are read from the GitHub Actions and GitLab CI snippets in docs/ci.md (so
the page and this test cannot drift) and run, exactly, with bash in a scratch copy of this repository's policy
directory: the check passes on the shipped policies and fails on a broken one, the SARIF it writes is a SARIF
log, and the --compare line writes a markdown comment and exits 0 even when the head widens access."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from .conftest import FIXTURES, POLICIES, REPO

DOC = REPO / "docs" / "ci.md"


def _blocks() -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]


def _lines(cmds: list[str]) -> list[str]:
    return [ln.strip() for c in cmds for ln in str(c).splitlines() if ln.strip().startswith("policy-check ")]


def github_lines() -> list[str]:
    (gh,) = [b for b in _blocks() if isinstance(b, dict) and "jobs" in b]
    return _lines([s["run"] for s in gh["jobs"]["policy-check"]["steps"] if "run" in s])


def gitlab_lines() -> list[str]:
    (gl,) = [b for b in _blocks() if isinstance(b, dict) and "policy-compare" in b]
    return _lines([c for job in ("policy-check", "policy-compare") for part in ("script", "after_script")
                   for c in gl[job].get(part, [])])


def _bash(line: str, cwd: Path, base: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("policy-check")
    env = {**os.environ, "POLICY_DIR": "policies", "BASE_DIR": str(base), "PATH": f"{exe.parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _workdir(tmp: Path, policies: Path) -> Path:
    shutil.copytree(policies, tmp / "policies")
    if not (tmp / "policies" / "memwarden.cedarschema").exists():
        shutil.copy(POLICIES / "memwarden.cedarschema", tmp / "policies")
    return tmp


def test_both_ci_systems_run_the_same_policy_check_lines() -> None:
    gh, gl = github_lines(), gitlab_lines()
    assert len(gh) == 3 and set(gh) <= set(gl), (gh, gl)
    assert any("--format sarif" in ln for ln in gh) and any("--compare" in ln for ln in gh)
    hook = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook[0]["id"] == "policy-check" and hook[0]["entry"] == "policy-check"


def test_documented_lines_pass_on_this_repositorys_policies(tmp_path: Path) -> None:
    work = _workdir(tmp_path / "head", POLICIES)
    base = _workdir(tmp_path / "base", POLICIES)
    for line in gitlab_lines():
        p = _bash(line, work, base)
        assert p.returncode == 0, (line, p.stdout[-2000:], p.stderr[-2000:])
    sarif = json.loads((work / "policy-check.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"] == []
    assert "No class of requests changed." in (work / "policy-compare.md").read_text()
    assert "<testsuites" in (work / "policy-check.junit.xml").read_text()
    # the pre-commit hook's command line
    hook = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())[0]
    p = subprocess.run([str(Path(sys.executable).with_name(hook["entry"])), *hook["args"]], cwd=work,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:]


def test_documented_lines_fail_on_a_violation_and_post_the_widening(tmp_path: Path) -> None:
    work = _workdir(tmp_path / "head", FIXTURES / "fleet-ignores-trust")
    base = _workdir(tmp_path / "base", POLICIES)
    check, log, compare = github_lines()
    p = _bash(check, work, base)
    assert p.returncode == 1, p.stderr[-2000:]
    sarif = json.loads((work / "policy-check.sarif").read_text())
    assert any(r["level"] == "error" for r in sarif["runs"][0]["results"])
    assert list((work / "policy-check-counterexamples").glob("*.json"))
    assert _bash(log, work, base).returncode == 1
    p = _bash(compare, work, base)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])  # a widening is posted, not a failure
    md = (work / "policy-compare.md").read_text()
    assert "|" in md and "read" in md
