"""The access matrix (invariants.matrix, policy-check explain): every cell's verdict agrees with cedarpy
on generated concrete requests, witnesses replay, the CLI prints the matrix and the diff of a widened
copy (exit 1), and a narrowed copy exits 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from invariants.cli import explain_app
from invariants.engine import authorize
from invariants.matrix import Matrix, build_matrix, classify, diff_matrices
from invariants.project import load_project

from .concrete_requests import requests
from .conftest import POLICIES

runner = CliRunner()
ACTIONS = ["read", "write", "redistribute", "configure", "list"]  # a sample of every resource type (CI time)
PROJ = load_project(POLICIES, with_invariants=False)


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return build_matrix(PROJ.schema, PROJ.schema_text, PROJ.policies, actions=ACTIONS)


@pytest.fixture(scope="module")
def cells(matrix: Matrix) -> dict[Any, Any]:
    return matrix.by_key()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(requests(PROJ.schema, ACTIONS))
def test_cells_agree_with_cedar(cells: dict[Any, Any], case: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    req, ents = case
    coords = classify(PROJ.schema, PROJ.schema_text, req, ents)
    key = (req["action"]["id"], req["principal"]["type"], req["resource"]["type"], tuple(sorted(coords.items())))
    cell = cells[key]
    cedar = authorize(req, PROJ.policies, ents, PROJ.schema_text)
    assert cell.verdict in ("permitted", "denied", "depends"), cell
    if cell.verdict == "permitted":
        assert cedar.allow, (cell.coords, req, ents)
    elif cell.verdict == "denied":
        assert not cedar.allow, (cell.coords, req, ents)


def test_every_witness_replays_and_lies_in_its_cell(matrix: Matrix) -> None:
    # The leaves of one proved region share its witnesses: each distinct witness is replayed once against
    # the region it was found for (its cells' common proved_by).
    seen: dict[tuple[int, bool], dict[str, str]] = {}
    for c in matrix.cells:
        for w, allow in ((c.allow, True), (c.deny, False)):
            if w is not None:
                assert seen.setdefault((id(w), allow), c.proved_by) == c.proved_by, c
    witnesses = {id(w): w for c in matrix.cells for w in (c.allow, c.deny) if w is not None}
    for (wid, allow), region in seen.items():
        w = witnesses[wid]
        assert authorize(w.request, PROJ.policies, w.entities, PROJ.schema_text).allow is allow
        got = classify(PROJ.schema, PROJ.schema_text, w.request, w.entities)
        assert all(got[k] == v for k, v in region.items())
    assert len(seen) >= len({tuple(sorted(c.proved_by.items())) for c in matrix.cells})
    verdicts = {c.verdict for c in matrix.cells}
    assert {"permitted", "denied"} <= verdicts and "unknown" not in verdicts


def test_default_policy_facts(matrix: Matrix) -> None:
    cells = matrix.by_key()

    def v(action: str, pt: str, rt: str, **coords: str) -> str:
        return cells[(action, pt, rt, tuple(sorted(coords.items())))].verdict

    same = {"tenant": "same tenant"}
    assert v("read", "Agent", "Memory", **same, status="active", scope="fleet", trust="1", owner="not owner",
             fleet="other fleet", reader="not a reader") == "denied"
    assert v("read", "Agent", "Memory", **same, status="active", scope="fleet", trust="2", owner="not owner",
             fleet="other fleet", reader="not a reader") == "permitted"
    assert v("read", "Agent", "Memory", **same, status="deleted", scope="tenant", trust="≥3", owner="owner",
             fleet="same fleet", reader="reader") == "denied"
    assert v("read", "Agent", "Memory", tenant="other tenant", status="active", scope="tenant", trust="≥3") == "denied"
    assert v("configure", "Operator", "Deployment") == "permitted"
    assert v("configure", "TenantAdmin", "Deployment") == "denied"


def _widened(tmp_path: Path) -> Path:
    d = tmp_path / "widened"
    shutil.copytree(POLICIES, d)
    (d / "zz-widen.cedar").write_text('@id("read-fleet-any-trust")\npermit (principal is Agent, action == '
                                      'Action::"read", resource is Memory)\nwhen { resource.tenant == principal.tenant '
                                      '&& resource.scope == "fleet" };\n')
    return d


def test_diff_of_a_widened_copy() -> None:
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        new = load_project(_widened(Path(t)), with_invariants=False)
    diff = diff_matrices(PROJ.schema, PROJ.schema_text, PROJ.policies, new.policies, actions=["read", "write"])
    assert diff.widened and not any(c.narrowed for c in diff.changes)
    changed = {(c.action, c.coords.get("scope"), c.coords.get("trust"), c.coords.get("fleet"), c.coords.get("status"))
               for c in diff.changes}
    # exactly the fleet-scoped, readable-status rows of other fleets for trust <= 1
    assert {a for a, *_ in changed} == {"read"}
    assert {(s, t, f) for _, s, t, f, _ in changed} == {("fleet", "≤0", "other fleet"), ("fleet", "1", "other fleet")}
    assert {st for *_, st in changed} == {"active", "superseded", "other"}
    for c in diff.changes:
        assert c.old == "denied" and c.new == "permitted" and c.widen is not None
        assert c.widen.decision == "allow" and "read-fleet-any-trust" in c.widen.reasons
        assert not authorize(c.widen.request, PROJ.policies, c.widen.entities, PROJ.schema_text).allow


def test_explain_cli_prints_the_matrix_and_the_diff(tmp_path: Path) -> None:
    # cheap actions for the CLI (the read matrix is the module fixture's, checked above)
    res = runner.invoke(explain_app, [str(POLICIES), "--action", "list", "--action", "configure"])
    assert res.exit_code == 0, res.output
    assert "list" in res.output and "configure" in res.output and "✓" in res.output and "✗" in res.output
    assert "tenant admin" in res.output and "other tenant" in res.output and "witnesses replayed" in res.output
    res = runner.invoke(explain_app, [str(POLICIES), "--action", "configure", "--format", "json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["cells"] and {c["action"] for c in doc["cells"]} == {"configure"}
    assert {(c["principal"], c["verdict"]) for c in doc["cells"]} == {("Operator", "permitted"), ("TenantAdmin", "denied"),
                                                                        ("Agent", "denied")}
    new = _widened(tmp_path)
    res = runner.invoke(explain_app, ["--compare", str(POLICIES), str(new), "-a", "read"])
    assert res.exit_code == 1, res.output
    flat = " ".join(res.output.split())  # text wraps at the console's width (80 columns in a pipe)
    assert "widened read: agent " in flat and " may now read a fleet-scoped row" in flat
    assert "✗→✓" in res.output
    res = runner.invoke(explain_app, ["--compare", str(new), str(POLICIES), "--format", "json", "-a", "read"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and not doc["widened"] and doc["changes"]
    assert all(c["narrowed"] and c["narrow_witness"]["decision"] == "allow" for c in doc["changes"])
    res = runner.invoke(explain_app, ["--compare", str(POLICIES), str(POLICIES), "-a", "read", "-a", "list"])
    assert res.exit_code == 0 and "no class of requests changed" in res.output
