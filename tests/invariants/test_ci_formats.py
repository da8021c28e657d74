"""CI formats: SARIF 2.1.0 (validated against the official JSON schema), JUnit and JSON. A violation's
SARIF location is the policy that permitted the counterexample, the invariant a related location."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

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


# ---- inputs that do not parse or validate: every format still answers, at the exact position ----

def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "pol"
    shutil.copytree(POLICIES, d)
    return d


# (text, line, column, message start): the offending token, not the policy's first line
PARSE_ERRORS = [
    ('@id("x")\npermit (principal, action, resource)\nwhen {\n  principal.trust >=\n};\n', 5, 1,
     "syntax error: unexpected token `}`"),
    ('permit (principal, action, resource);\npermit (principal, action, resource)\n  when { 1 +* 2 };\n', 3, 13,
     "syntax error: unexpected token `*`"),
    ('permit (principal, action, resource)\nwhen {\n  principal.x like "ab\\q" };\n', 3, 23,
     "syntax error: the input `\\q` is not a valid escape"),
    ('permit (principal, action, resource);\n\n  permat (principal, action, resource);\n', 3, 3,
     "syntax error: invalid policy effect: permat"),
    ('permit (principal, action, resource)\nwhen {\n  x };\n', 3, 3, "syntax error: invalid variable: x"),
    ('permit (principal, action, resource) when { "abc };\n', 1, 45, "syntax error: invalid token"),
    ('permit (principal, action, resource) when { true }\n', 1, 51, "syntax error: unexpected end of input"),
    ('@id("a")\n@id("b")\npermit (principal, action, resource);\n', 2, 1, "syntax error: duplicate annotation"),
]


@pytest.mark.parametrize("text,line,column,message", PARSE_ERRORS)
def test_parse_error_in_every_format(text: str, line: int, column: int, message: str, tmp_path: Path) -> None:
    d = _copy(tmp_path)
    bad = d / "zz-bad.cedar"
    bad.write_text(text)
    code, out = run(str(d), "--format", "sarif")
    assert code == 1
    doc = json.loads(out)
    assert_valid_sarif(doc)
    (res,) = doc["runs"][0]["results"]
    assert res["ruleId"] == "policy-invalid" and res["level"] == "error"
    assert res["message"]["text"].startswith(message)
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == str(bad)
    assert (loc["region"]["startLine"], loc["region"]["startColumn"]) == (line, column)
    code, out = run(str(d), "--format", "junit")
    assert code == 1
    case = ET.fromstring(out).find(".//testcase")
    assert case is not None and case.get("file") == str(bad) and case.get("line") == str(line)
    fail = case.find("failure")
    assert fail is not None and fail.get("message", "").startswith(message)
    assert fail.text is not None and fail.text.startswith(f"{bad}:{line}:{column}: ")
    code, out = run(str(d), "--format", "json")
    assert code == 1
    (inv,) = json.loads(out)["invalid"]
    assert (inv["file"], inv["line"], inv["column"]) == (str(bad), line, column)


def test_validation_error_points_at_the_named_attribute(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    bad = d / "zz-bad.cedar"
    bad.write_text('// comment\n\n@id("bad")\npermit (principal is Agent, action, resource)\n'
                   'when { principal.trust > 1 &&\n       principal.nope == 1 };\n')
    code, out = run(str(d), "--format", "sarif")
    assert code == 1
    doc = json.loads(out)
    assert_valid_sarif(doc)
    (res,) = doc["runs"][0]["results"]
    assert "attribute `nope`" in res["message"]["text"] and res["properties"]["policy"] == "bad"
    region = res["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (6, 18)


SCHEMA_ERRORS = [
    (("trust: Long,", "trust: Lon,"), "failed to resolve type: Lon", "trust: Lon", 10),
    (("owner: Agent,", "owner: Agent"), "unexpected token `scope`", "  scope: String,", 3),
    (("entity Operator;", "entity Operator;\nentity Tenant;"), "`Tenant` is declared twice", "entity Tenant;", 8),
    (("action search, delete_bulk", "action search, read"), "`read` is declared twice", "action search, read", 16),
]


@pytest.mark.parametrize("edit,message,line_text,column", SCHEMA_ERRORS)
def test_schema_error_in_every_format(edit: tuple[str, str], message: str, line_text: str, column: int,
                                      tmp_path: Path) -> None:
    d = _copy(tmp_path)
    sp = d / SCHEMA.name
    text = sp.read_text().replace(*edit, 1)
    sp.write_text(text)
    lines = text.splitlines()
    # the line holding the error: the edited declaration, never the first line of the file
    line = max(i for i, t in enumerate(lines, 1) if t.strip().startswith(line_text.strip()))
    code, out = run(str(d), "--format", "sarif")
    assert code == 1
    doc = json.loads(out)
    assert_valid_sarif(doc)
    (res,) = doc["runs"][0]["results"]
    assert res["ruleId"] == "schema-invalid" and message in res["message"]["text"]
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == str(sp)
    assert (loc["region"]["startLine"], loc["region"]["startColumn"]) == (line, column)
    code, out = run(str(d), "--format", "junit")
    assert code == 1 and ET.fromstring(out).find(".//testcase/failure") is not None
    code, out = run(str(d), "--format", "json")
    assert code == 1 and json.loads(out)["invalid"][0]["line"] == line


def test_json_schema_error_and_missing_schema_still_answer(tmp_path: Path) -> None:
    d = tmp_path / "j"
    d.mkdir()
    (d / "s.cedarschema.json").write_text('{"": {"entityTypes": {"A": {}},\n "actions": {}}\n')
    code, out = run(str(d), "--format", "sarif")
    doc = json.loads(out)
    assert_valid_sarif(doc)
    (res,) = doc["runs"][0]["results"]
    assert code == 1 and res["locations"][0]["physicalLocation"]["region"]["startLine"] == 2
    (d / "s.cedarschema.json").unlink()
    for fmt in ("sarif", "junit", "json"):
        code, out = run(str(d), "--format", fmt)
        assert code == 2 and out.strip()
    doc = json.loads(run(str(d), "--format", "sarif")[1])
    assert_valid_sarif(doc)
    assert doc["runs"][0]["results"][0]["ruleId"] == "input-error"
