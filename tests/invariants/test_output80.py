"""Issue 38 item 5: plain text reads at 80 columns, --compare shows old→new, markdown gives a table,
summaries say only what the counterexample needs, SARIF locates UNKNOWN and validation errors."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from invariants.cli import app, explain_app
from invariants.matrix import diff_matrices
from invariants.project import load_project
from invariants.report import Report, render
from invariants.summary import request_sentence

from .conftest import FIXTURES, POLICIES, SCHEMA

runner = CliRunner()


def _narrow(out: str) -> None:
    long = [ln for ln in out.splitlines() if len(ln) > 80]
    assert not long, long


def _copy(fixture: str, root: Path) -> Path:
    d = root / fixture
    d.mkdir(parents=True)
    shutil.copy(SCHEMA, d)
    shutil.copy(FIXTURES / fixture / "policies.cedar", d)
    return d


def test_text_reads_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # paths as a CI job names them: relative to the checkout
    _copy("fleet-ignores-trust", tmp_path / "p")
    res = runner.invoke(app, ["p/fleet-ignores-trust", "--counterexamples", "c"], env={"COLUMNS": "80"})
    assert res.exit_code == 1, res.output
    _narrow(res.output)
    assert "VIOLATED inv-scope / read" in res.output
    assert "permitted by read-fleet-scope at" in res.output
    assert 'status ""' not in res.output  # the empty status says nothing
    assert "PROVED tenant-isolation: read, write" in res.output


def test_compare_text_at_80_columns_shows_old_to_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _copy("fleet-ignores-trust", tmp_path / "p")
    shutil.copytree(POLICIES, tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(explain_app, ["--compare", "base", "p/fleet-ignores-trust", "-a", "read"],
                        env={"COLUMNS": "80"})
    assert res.exit_code == 1, res.output
    _narrow(res.output)
    assert "✗→✓ widened read: agent agent1" in res.output  # each witness with its cell's old→new verdict
    assert "✗…" not in res.output
    assert "may now read a fleet-scoped row" in " ".join(res.output.split())


def test_markdown_has_a_table_of_changes_and_findings(tmp_path: Path) -> None:
    d = _copy("fleet-ignores-trust", tmp_path / "p")
    old = load_project(POLICIES, with_invariants=False)
    new = load_project(d, with_invariants=False)
    rep = Report("old -> new", old_policies=old.policies, new_policies=new.policies)
    rep.diff = diff_matrices(new.schema, new.schema_text, old.policies, new.policies, 20.0, ["read"])
    buf = io.StringIO()
    render(rep, "markdown", Console(file=buf, width=80))
    md = buf.getvalue()
    assert "| change | action | class of requests | witness (replayed through Cedar) |" in md
    assert any(ln.startswith("| ✗→✓ widened | read | agent") for ln in md.splitlines()), md
    res = runner.invoke(app, [str(d), "--format", "markdown", "--counterexamples", str(tmp_path / "c")])
    assert res.exit_code == 1
    assert "| **VIOLATED** | inv-scope | read |" in res.stdout


def _agent(i: str, roles: list[str] | None = None) -> dict:
    return {"uid": {"type": "Agent", "id": i}, "parents": [], "attrs": {
        "tenant": {"__entity": {"type": "Tenant", "id": "t"}}, "fleet": {"__entity": {"type": "Fleet", "id": "f"}},
        "trust": 3, "roles": roles or []}}


def test_summaries_say_only_what_is_needed() -> None:
    row = {"uid": {"type": "Memory", "id": "m"}, "parents": [], "attrs": {
        "tenant": {"__entity": {"type": "Tenant", "id": "t"}}, "fleet": {"__entity": {"type": "Fleet", "id": "f"}},
        "owner": {"__entity": {"type": "Agent", "id": "o"}}, "scope": "restricted", "status": "",
        "readers": [{"__entity": {"type": "Agent", "id": f"r{i}"}} for i in range(30)], "labels": []}}
    req = {"principal": {"type": "Agent", "id": "a"}, "action": {"type": "Action", "id": "redistribute"},
           "resource": {"type": "Memory", "id": "m"},
           "context": {"target_fleet": {"__entity": {"type": "Fleet", "id": "fleet1"}}, "target_scope": "fleet"}}
    s = request_sentence(req, [_agent("a", [f"role{i}" for i in range(20)] + ["auditor"]), row],
                         strings=frozenset({"auditor"}))
    assert 'status ""' not in s and "r17" not in s and "role7" not in s
    assert 'roles "auditor"' in s and "(a not among its readers)" in s
    assert "to a fleet fleet1 absent from the entity store" in s
    odd = request_sentence({**req, "principal": {"type": "Agent", "id": "a\U0001F600"}},
                           [_agent("a\U0001F600"), row])
    assert "\\u{1f600}" in odd and "\\ud83d" not in odd


def test_sarif_unknown_at_the_policy_and_validation_error_once_at_its_line(tmp_path: Path) -> None:
    d = tmp_path / "pol"
    shutil.copytree(POLICIES, d)
    shutil.rmtree(d / "tests")
    (d / "zz-ip.cedar").write_text('// note\n@id("ip-rule")\nforbid (principal, action == Action::"read", '
                                   'resource) when { ip("10.0.0.1").isLoopback() };\n')
    res = runner.invoke(app, [str(d), "--format", "sarif", "--counterexamples", str(tmp_path / "c")])
    assert res.exit_code == 3
    results = json.loads(res.stdout)["runs"][0]["results"]
    unknown = [r for r in results if r["level"] == "warning"]
    assert unknown and all(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("zz-ip.cedar")
                           and r["locations"][0]["physicalLocation"]["region"]["startLine"] == 2 for r in unknown)
    (d / "zz-ip.cedar").write_text('@id("bad")\npermit (principal is Agent, action == Action::"read", '
                                   'resource is Memory)\nwhen {\n  resource.tenant == principal.tenant &&\n'
                                   '  resource.scope == 1 + "a"\n};\n')
    res = runner.invoke(app, [str(d), "--format", "sarif"])
    assert res.exit_code == 1
    results = json.loads(res.stdout)["runs"][0]["results"]
    assert len(results) == 1, results
    assert results[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 5
