"""policy-check with `Agent.roles` and `Memory.labels` in play: the example policies that use them
(examples/labels-and-roles, a forbid on labelled rows) leave every baseline invariant proved, and a policy
that lets a role widen reads is VIOLATED with a counterexample that carries the role, replayed by cedarpy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from invariants.cli import app
from invariants.engine import authorize, parse_text

from .conftest import POLICIES, REPO, SCHEMA

EXAMPLE = REPO / "examples" / "labels-and-roles"


def _with(tmp_path: Path, extra: dict[str, str]) -> Path:
    """A copy of the default policy set with the extra files (relative path → text) added."""
    directory = tmp_path / "policies"
    shutil.copytree(POLICIES, directory)
    for rel, text in extra.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_text(text)
    return directory


def _check(directory: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    res = CliRunner().invoke(app, [str(directory), "--format", "json", "--counterexamples", str(tmp_path / "cex")])
    return res.exit_code, json.loads(res.output)


def test_label_and_role_policies_keep_the_baseline_proved(tmp_path: Path) -> None:
    directory = _with(tmp_path, {"labels.cedar": (EXAMPLE / "labels.cedar").read_text(),
                                 "tests/labels.json": (EXAMPLE / "tests" / "labels.json").read_text()})
    code, rep = _check(directory, tmp_path)
    assert code == 0, [r for r in rep["results"] if r["status"] != "PROVED"] or rep["tests"]
    assert {r["status"] for r in rep["results"]} == {"PROVED"}
    assert {"inv-scope", "never-errors", "trust-monotonicity", "cross-fleet-propagation"} <= {r["invariant"] for r in rep["results"]}
    example_tests = [t for t in rep["tests"] if t["file"].endswith("labels.json")]
    assert len(example_tests) == len(json.loads((EXAMPLE / "tests" / "labels.json").read_text())["cases"])
    assert all(t["passed"] for t in example_tests)


@pytest.mark.parametrize("condition,entity,attr,value", [
    ('principal.roles.contains("auditor")', "principal", "roles", "auditor"),
    ('resource.labels.contains("public")', "resource", "labels", "public"),
], ids=["role", "label"])
def test_a_role_or_label_that_widens_reads_is_a_counterexample(tmp_path: Path, condition: str, entity: str, attr: str,
                                                                value: str) -> None:
    """Found every time (the probed literal is a candidate member of the model's sets; before, Z3's co-finite
    set for roles made this UNKNOWN after the solver timeout on most runs)."""
    widening = ('@id("widened-read")\n'
                'permit (principal is Agent, action == Action::"read", resource is Memory)\n'
                f'when {{ resource.tenant == principal.tenant && {condition} }};\n')
    directory = _with(tmp_path, {"widened.cedar": widening})
    code, rep = _check(directory, tmp_path)
    assert code == 1
    row = next(r for r in rep["results"] if r["invariant"] == "inv-scope" and r["action"] == "read")
    assert row["status"] == "VIOLATED", row
    cex = row["counterexample"]
    uid = cex["request"][entity]
    assert value in next(e for e in cex["entities"] if e["uid"] == uid)["attrs"][attr]
    policies = [p for f in ("default.cedar", "widened.cedar")
                for p in parse_text((directory / f).read_text(), f).policies]
    assert authorize(cex["request"], policies, cex["entities"], SCHEMA.read_text()).allow
