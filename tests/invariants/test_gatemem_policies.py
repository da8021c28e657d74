"""The GateMem domain policy sets (evaluation/memwarden_eval/gatemem/policies/<domain>) pass policy-check: the baseline
invariants, their domain invariant and their policy tests; weakening a domain rule is caught."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from invariants.cli import app
from memwarden_eval import gatemem
from memwarden_eval.gatemem.data import DOMAINS
from sidecar.policy import PolicyEngine

POLICIES = Path(gatemem.__file__).resolve().parent / "policies"
DOMAIN_INVARIANT = {"medical": "medical-family-no-clinical", "office": "office-no-credentials-for-limited-roles",
                    "education": "education-parent-limited", "household": "household-no-credentials-for-helpers"}


def _check(path: Path) -> tuple[int, dict]:
    res = CliRunner().invoke(app, [str(path), "--format", "json"])
    return res.exit_code, json.loads(res.output)


@pytest.mark.parametrize("domain", DOMAINS)
def test_domain_policies_prove(domain: str) -> None:
    code, rep = _check(POLICIES / domain)
    assert code == 0, rep
    statuses = {(r["invariant"], r["action"]): r["status"] for r in rep["results"]}
    assert set(statuses.values()) == {"PROVED"}
    assert statuses[(DOMAIN_INVARIANT[domain], "read")] == "PROVED"
    assert {"inv-scope", "tenant-isolation", "deletion-closure"} <= {i for i, _ in statuses}
    PolicyEngine.load(POLICIES / domain)  # the sidecar loads the same directory


def test_medical_policy_tests_run() -> None:
    code, rep = _check(POLICIES / "medical")
    assert code == 0 and rep["summary"]["tests_passed"] == 15 and rep["summary"]["tests_failed"] == 0


def test_weakened_family_rule_is_violated(tmp_path: Path) -> None:
    broken = tmp_path / "medical"
    shutil.copytree(POLICIES / "medical", broken, symlinks=False, ignore=shutil.ignore_patterns("tests"))
    text = (broken / "medical.cedar").read_text()
    weakened = text.replace('!["general", "logistics"].containsAll(resource.labels)',
                            '!["general", "logistics", "clinical"].containsAll(resource.labels)')
    assert weakened != text
    (broken / "medical.cedar").write_text(weakened)
    code, rep = _check(broken)
    assert code != 0
    bad = [r for r in rep["results"] if r["status"] == "VIOLATED"]
    assert [r["invariant"] for r in bad] == ["medical-family-no-clinical"]
    assert bad[0]["counterexample"] is not None
