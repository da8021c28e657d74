"""Issue 38: long ``||``/``&&`` chains are valid Cedar, never INVALID (item 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from invariants.engine import NESTING_MODELLED, authorize, parse_text

from .conftest import POLICIES, SCHEMA
from .test_policy_check import run_json


def _dir(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "pol"
    shutil.copytree(POLICIES, d)
    shutil.rmtree(d / "tests")
    (d / name).write_text(text, encoding="utf-8")
    return d


def _chain(n: int, op: str, term: str) -> str:
    return f" {op} ".join(term.format(i=i) for i in range(n))


def _statuses(rep: dict[str, Any], action: str) -> dict[str, str]:
    return {r["invariant"]: r["status"] for r in rep["results"] if r["action"] == action}


# 150 `||` terms: an allow-list of tenant-scoped labels (Cedar parses, validates and evaluates it; cedarpy's
# typed AST refuses it: "expression nesting exceeds the supported limit of 100 levels").
def _chain_permit(scopes: list[str]) -> str:
    terms = " || ".join(f'resource.scope == "{s}"' for s in scopes)
    return ('@id("long-chain")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
            f'when {{ resource.tenant == principal.tenant && principal.trust >= 0 && ({terms}) }};\n')


def test_150_term_chain_is_proved_not_invalid(tmp_path: Path) -> None:
    trusts = _chain(150, "||", "principal.trust == {i}")
    d = _dir(tmp_path, "zz-chain.cedar",
             '@id("long-chain")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
             f'when {{ resource.tenant == principal.tenant && resource.scope == "tenant" && ({trusts}) }};\n')
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"), "--timeout", "60")
    assert code == 0, json.dumps(rep)[:2000]
    assert _statuses(rep, "read")["inv-scope"] == "PROVED"


def test_150_term_chain_violation_is_replayed(tmp_path: Path) -> None:
    scopes = [f"label{i}" for i in range(149)] + ["fleet"]  # the last term lets any tenant agent read fleet rows
    d = _dir(tmp_path, "zz-chain.cedar", _chain_permit(scopes))
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"), "--timeout", "60")
    assert code == 1, json.dumps(rep)[:2000]
    bad = [r for r in rep["results"] if r["invariant"] == "inv-scope" and r["action"] == "read"]
    assert bad[0]["status"] == "VIOLATED"
    assert bad[0]["permitted_by"][0]["policy"] == "long-chain"
    # Cedar itself, on the original (unflattened) text, allows the saved counterexample.
    cex = bad[0]["counterexample"]
    pols = [p for f in sorted(d.glob("*.cedar")) for p in parse_text(f.read_text(), str(f)).policies]
    res = authorize(cex["request"], pols, cex["entities"], SCHEMA.read_text())
    assert res.allow and "long-chain" in res.reasons


def test_chains_are_balanced_in_order_and_deep_ones_are_unknown(tmp_path: Path) -> None:
    pols = parse_text("permit (principal, action, resource) when { " + _chain(300, "&&", "context has a{i}") +
                      " };\n", "x.cedar").policies
    assert pols[0].unmodelled is None
    deep = _chain(NESTING_MODELLED + 10, "||", 'resource.scope == "s{i}"')
    d = _dir(tmp_path, "zz-deep.cedar", f'@id("deep")\nforbid (principal, action == Action::"read", resource is Memory) '
                                        f'when {{ {deep} }};\n')
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 3, json.dumps(rep)[:2000]
    unknown = [r for r in rep["results"] if r["status"] == "UNKNOWN"]
    assert unknown and all("deep" in r["message"] and "levels" in r["message"] for r in unknown)
    assert all(r["status"] != "INVALID" for r in rep["results"])
