"""CI formats: SARIF 2.1.0 (validated against the official JSON schema), JUnit and JSON. A violation's
SARIF location is the policy that permitted the counterexample, the invariant a related location."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from invariants.cli import app
from invariants.engine import parse_text

from .conftest import FIXTURES, POLICIES, SCHEMA
from .sarif import assert_valid_sarif

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout


def test_the_schema_check_can_fail() -> None:
    good = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": []}]}
    assert_valid_sarif(good)
    with pytest.raises(AssertionError):
        assert_valid_sarif({**good, "version": "2.0.0"})
    with pytest.raises(AssertionError):
        assert_valid_sarif({"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [
            {"message": {"text": "m"}, "locations": [{"physicalLocation": {"region": {"startLine": 0}}}]}]}]})


def _fixture_dir(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    shutil.copy(SCHEMA, d / SCHEMA.name)
    return d


def test_violation_points_at_the_permitting_policy(tmp_path: Path) -> None:
    d = _fixture_dir("fleet-ignores-trust", tmp_path)
    code, out = run(str(d), "--format", "sarif", "--counterexamples", str(tmp_path / "cx"))
    assert code == 1
    doc = json.loads(out)
    assert_valid_sarif(doc)
    res = [r for r in doc["runs"][0]["results"] if r["ruleId"] == "inv-scope"]
    assert len(res) == 1
    r = res[0]
    pols = {p.id: p for p in parse_text((d / "policies.cedar").read_text(), str(d / "policies.cedar")).policies}
    cex = r["properties"]["counterexample"]
    (culprit,) = cex["cedar"]["reasons"]
    loc = r["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == str(d / "policies.cedar")
    assert loc["region"]["startLine"] == pols[culprit].line
    rel = r["relatedLocations"][0]
    assert rel["physicalLocation"]["artifactLocation"]["uri"].endswith("baseline/inv-scope.cedar")
    assert rel["message"]["text"] == "invariant inv-scope"
    assert r["message"]["text"].startswith("VIOLATED on action read: agent ")
    assert f"permitted by {culprit} at " in r["message"]["text"]


def test_default_policies_give_valid_empty_sarif_and_passing_junit(tmp_path: Path) -> None:
    code, out = run(str(POLICIES), "--format", "sarif", "--counterexamples", str(tmp_path))
    assert code == 0
    doc = json.loads(out)
    assert_valid_sarif(doc)
    assert doc["runs"][0]["results"] == []
    code, out = run(str(POLICIES), "--format", "junit", "--counterexamples", str(tmp_path))
    root = ET.fromstring(out)
    assert code == 0 and root.findall(".//testcase") and not root.findall(".//failure")
