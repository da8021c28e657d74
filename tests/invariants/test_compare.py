"""``policy-check --compare OLD NEW``: the changed cells of the access matrix, a witness each replayed
through cedarpy on both sets, and per action newly-permitted/newly-denied. On widened copies of
policies/ (the broken fixtures) the printed cells agree with cedarpy on generated concrete requests:
a request of an unchanged class gets the same decision from both sets, one of a changed class moves
only in the direction the cell says. Exit 1 iff access widened; every format stays a valid document."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from invariants import translate
from invariants.cli import app
from invariants.engine import authorize
from invariants.matrix import classify
from invariants.project import load_project

from .concrete_requests import Case, requests
from .conftest import FIXTURES, POLICIES, SCHEMA

runner = CliRunner()
OLD = load_project(POLICIES, with_invariants=False)
WIDENED = {"fleet-ignores-trust": {"read"}, "trusted-agents-change-any-row": {"update", "delete"}}
ACTIONS = ["read", "update", "delete", "write", "list"]


def _copy(fixture: str, root: Path) -> Path:
    d = root / fixture
    d.mkdir()
    shutil.copy(SCHEMA, d)
    shutil.copy(FIXTURES / fixture / "policies.cedar", d)
    return d


def cli(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    return {f: _copy(f, root) for f in WIDENED}


@pytest.fixture(scope="module")
def docs(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, Any]]]:
    out = {}
    for f, d in dirs.items():
        code, text = cli("--compare", str(POLICIES), str(d), "--format", "json",
                         "--counterexamples", str(tmp_path_factory.mktemp("cex")))
        out[f] = (code, json.loads(text))
    return out


@pytest.mark.parametrize("fixture", sorted(WIDENED))
def test_widened_copy_reports_changed_cells_with_replayed_witnesses(fixture: str, docs: Any, dirs: Any) -> None:
    code, doc = docs[fixture]
    assert code == 1 and doc["exit_code"] == 1 and doc["widened"] and not doc["unknown"]
    # the per-action results the CLI always gave
    changed = {(r["invariant"], r["action"]) for r in doc["results"] if r["status"] != "UNCHANGED"}
    assert changed == {("newly-permitted", a) for a in WIDENED[fixture]}
    row = next(r for r in doc["results"] if r["status"] == "CHANGED")
    cex = row["counterexample"]
    assert cex["old"]["cedar"]["decision"] == "deny" and cex["new"]["cedar"]["decision"] == "allow"
    assert row["permitted_by"] and Path(row["counterexample_file"]).is_file()
    # the cells: only widenings, only of the widened actions, each witness replayed on both sets
    new = load_project(dirs[fixture], with_invariants=False)
    assert doc["changes"] and {c["action"] for c in doc["changes"]} == WIDENED[fixture]
    for c in doc["changes"]:
        assert c["widened"] and not c["narrowed"] and c["old"] in ("denied", "depends")
        w = c["widen_witness"]
        assert w["decision"] == "allow" and w["other_set"]["decision"] == "deny"
        assert authorize(w["request"], new.policies, w["entities"], new.schema_text).allow
        assert not authorize(w["request"], OLD.policies, w["entities"], OLD.schema_text).allow
        got = classify(OLD.schema, OLD.schema_text, w["request"], w["entities"])
        assert all(got[k] == v for k, v in c["class"].items())


def _agree(fixture: str, docs: Any, dirs: Any, case: Case) -> None:
    req, ents = case
    _, doc = docs[fixture]
    new = load_project(dirs[fixture], with_invariants=False)
    cells = {(c["action"], c["principal"], c["resource"], tuple(sorted(c["class"].items()))): c for c in doc["changes"]}
    coords = classify(OLD.schema, OLD.schema_text, req, ents)
    cell = cells.get((req["action"]["id"], req["principal"]["type"], req["resource"]["type"],
                      tuple(sorted(coords.items()))))
    old_allow = authorize(req, OLD.policies, ents, OLD.schema_text).allow
    new_allow = authorize(req, new.policies, ents, new.schema_text).allow
    if cell is None:  # an unchanged class: no request of it changes its decision
        assert old_allow == new_allow, (coords, req, ents)
        return
    assert cell["widened"] or not (new_allow and not old_allow), (cell["class"], req, ents)
    assert cell["narrowed"] or not (old_allow and not new_allow), (cell["class"], req, ents)
    for verdict, allow in ((cell["old"], old_allow), (cell["new"], new_allow)):
        assert verdict != "permitted" or allow, (cell["class"], req, ents)
        assert verdict != "denied" or not allow, (cell["class"], req, ents)


_SETTINGS = settings(max_examples=200, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_SETTINGS
@given(requests(OLD.schema, ACTIONS))
def test_changed_cells_agree_with_cedar_fleet_ignores_trust(docs: Any, dirs: Any, case: Case) -> None:
    _agree("fleet-ignores-trust", docs, dirs, case)


@_SETTINGS
@given(requests(OLD.schema, ACTIONS))
def test_changed_cells_agree_with_cedar_trusted_agents(docs: Any, dirs: Any, case: Case) -> None:
    _agree("trusted-agents-change-any-row", docs, dirs, case)


def test_text_sarif_and_junit(docs: Any, dirs: Any, tmp_path: Path) -> None:
    fixture = "fleet-ignores-trust"
    _, doc = docs[fixture]
    n = len(doc["changes"])
    base = ["--compare", str(POLICIES), str(dirs[fixture]), "--counterexamples", str(tmp_path)]
    code, out = cli(*base)
    out = " ".join(out.split())  # text wraps at the console's width (80 columns in a pipe)
    assert code == 1
    assert "widened read: agent " in out and " may now read a fleet-scoped row" in out and "✗→✓" in out
    assert f"{n} changed cells ({n} widened, 0 narrowed)" in out and "newly permitted: read" in out and "exit 1" in out
    code, out = cli(*base, "--format", "sarif")
    assert code == 1
    run = json.loads(out)["runs"][0]
    cells = [r for r in run["results"] if r["ruleId"] == "access-widened"]
    assert {r["properties"]["action"] for r in cells} == {"read"}
    assert sum(len(r["properties"]["cells"]) for r in cells) == n
    line = next(i for i, t in enumerate((dirs[fixture] / "policies.cedar").read_text().splitlines(), 1)
                if '@id("read-fleet-scope")' in t)
    for r in cells:
        (loc,) = r["locations"]
        assert loc["physicalLocation"]["artifactLocation"]["uri"].endswith(f"{fixture}/policies.cedar")
        assert loc["physicalLocation"]["region"]["startLine"] == line and r["level"] == "error"
    assert {"access-widened", "newly-permitted"} <= {x["id"] for x in run["tool"]["driver"]["rules"]}
    code, out = cli(*base, "--format", "junit")
    assert code == 1
    suite = next(s for s in ET.fromstring(out) if s.get("name") == "access-changes")
    assert suite.get("tests") == suite.get("failures") == str(n) and len(suite.findall("testcase/failure")) == n


def test_narrowing_passes_and_no_change_is_unchanged(dirs: Any, tmp_path: Path) -> None:
    code, out = cli("--compare", str(dirs["fleet-ignores-trust"]), str(POLICIES), "--format", "json",
                    "--counterexamples", str(tmp_path))
    doc = json.loads(out)
    assert code == 0 and not doc["widened"] and doc["changes"]
    assert all(c["narrowed"] and not c["widened"] for c in doc["changes"])
    assert {(r["invariant"], r["action"]) for r in doc["results"] if r["status"] == "NARROWED"} == {("newly-denied", "read")}
    assert {r["status"] for r in doc["results"]} == {"UNCHANGED", "NARROWED"}
    code, out = cli("--compare", str(POLICIES), str(POLICIES), "--format", "junit", "--counterexamples", str(tmp_path))
    root = ET.fromstring(out)
    assert code == 0 and not root.findall(".//failure")
    assert next(s for s in root if s.get("name") == "access-changes").get("tests") == "0"


def test_disagreement_is_exit_4_in_every_format(dirs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Inject a translator bug: `like` matches exactly the strings the pattern rejects (Cedar is not fooled).
    monkeypatch.setattr(translate, "like", lambda s, elems, codec: translate.z3.Not(real_like(s, elems, codec)))
    like = _copy("like-other-tenants", tmp_path)
    for fmt in ("sarif", "json", "junit"):
        code, out = cli("--compare", str(POLICIES), str(like), "--format", fmt, "--counterexamples", str(tmp_path / "c"))
        assert code == 4, out
        if fmt == "sarif":
            assert json.loads(out)["runs"][0]["results"][0]["ruleId"] == "disagree"
        elif fmt == "json":
            assert json.loads(out)["invalid"][0]["rule"] == "disagree"
        else:
            assert ET.fromstring(out).findall(".//failure")


real_like = translate.like
