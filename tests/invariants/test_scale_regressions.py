"""Issue 38: long ``||``/``&&`` chains are valid Cedar, never INVALID (item 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from invariants.engine import NESTING_MODELLED, authorize, parse_text

from .conftest import FIXTURES, POLICIES, SCHEMA
from .test_policy_check import run, run_json


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


# ---- item 4: who writes a row of an owner; the principal-present assumption

def test_tenant_admins_writing_any_agents_rows_is_violated(tmp_path: Path) -> None:
    fx = FIXTURES / "tenant-admins-write-any-row"
    code, rep = run_json(str(fx), "--schema", str(SCHEMA), "--counterexamples", str(tmp_path / "c"))
    assert code == 1
    bad = {(r["invariant"], r["action"]): r for r in rep["results"] if r["status"] != "PROVED"}
    assert set(bad) == {("row-writer-is-owner", "write")}, {k: v["status"] for k, v in bad.items()}
    row = bad[("row-writer-is-owner", "write")]
    assert row["status"] == "VIOLATED" and row["permitted_by"][0]["policy"] == "tenant-admin-rows"
    cex = row["counterexample"]
    assert cex["request"]["principal"]["type"] == "TenantAdmin"
    pols = parse_text((fx / "policies.cedar").read_text(), "policies.cedar").policies
    assert authorize(cex["request"], pols, cex["entities"], SCHEMA.read_text()).allow
    default = parse_text((POLICIES / "default.cedar").read_text(), "default.cedar").policies
    assert not authorize(cex["request"], default, cex["entities"], SCHEMA.read_text()).allow
    assert any("principal and resource entity is present" in a for a in rep["assumptions"])


def test_principal_present_assumption_is_printed_and_checked_by_policy_tests(tmp_path: Path) -> None:
    # `!(principal has tenant)` is PROVED (under the assumption that the principal is in the store) ...
    d = _dir(tmp_path, "zz-absent.cedar", '@id("absent-principal")\npermit (principal is Agent, '
                                           'action == Action::"read", resource is Memory)\n'
                                           'when { !(principal has tenant) };\n')
    code, out = run(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 0, out
    assert "assumes: every request's principal and resource entity is present" in out
    # ... and a policy test where Cedar allows such a request (the principal absent) fails, naming it.
    (d / "tests").mkdir()
    (d / "tests" / "absent.json").write_text(json.dumps({"entities": [
        {"uid": {"type": "Memory", "id": "m"}, "parents": [], "attrs": {
            "tenant": {"__entity": {"type": "Tenant", "id": "t"}}, "fleet": {"__entity": {"type": "Fleet", "id": "t/f"}},
            "owner": {"__entity": {"type": "Agent", "id": "t/f/a"}}, "scope": "agent", "status": "active",
            "readers": [], "labels": []}}],
        "cases": [{"name": "unknown agent", "principal": {"type": "Agent", "id": "t/f/ghost"},
                   "action": {"type": "Action", "id": "read"}, "resource": {"type": "Memory", "id": "m"},
                   "expect": "allow"}]}))
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 1
    t = rep["tests"][0]
    assert not t["passed"] and "principal entity is absent" in t["message"], t


# ---- item 2: `like` patterns of the finite prefix/suffix/contains fragment are decided outright

LIKE_EMPTY = ('@id("allow-minus-deny")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
              'when { resource.tenant == principal.tenant && resource.scope like "x*y" && '
              '!(resource.scope like "*y") };\n')


def test_like_allow_list_minus_deny_list_is_proved(tmp_path: Path) -> None:
    d = _dir(tmp_path, "zz-like.cedar", LIKE_EMPTY)
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"), "--timeout", "5")
    assert code == 0, [r for r in rep.get("results", []) if r["status"] != "PROVED"]
    assert _statuses(rep, "read")["inv-scope"] == "PROVED"


def test_like_fragment_agrees_with_cedar() -> None:
    """Every pattern shape of the fragment against strings around it: the Z3 encoding and Cedar agree."""
    import itertools

    import cedarpy
    import z3

    from invariants.translate import like
    from invariants.zstring import Codec

    codec = Codec()
    pats = ["", "*", "**", "ab", "ab*", "*ab", "*ab*", "a*b", "a**b", "ab*ba", "*a*", "a*", "*\\\\*", "x*y",
            "a*b*c", "*a*b", "\U0001F600*"]
    words = ["", "a", "b", "ab", "ba", "aba", "abba", "abab", "xy", "x", "y", "xay", "*", "a*b", "abc", "acb",
             "\U0001F600", "\U0001F600a"]
    for pat, w in itertools.product(pats, words):
        ps = cedarpy.policies_to_pst(f'permit (principal, action, resource) when {{ context.s like "{pat}" }};')
        pol = next(iter(ps.static_policies.values()))
        elems = pol.clauses[0].expr.pattern
        got = z3.simplify(like(codec.encode(w), elems, codec))
        req = {"principal": {"type": "A", "id": "a"}, "action": {"type": "Action", "id": "r"},
               "resource": {"type": "R", "id": "r"}, "context": {"s": w}}
        text = f'permit (principal, action, resource) when {{ context.s like "{pat}" }};'
        want = cedarpy.is_authorized(req, text, []).decision == cedarpy.Decision.Allow
        assert z3.is_true(got) == want and (z3.is_true(got) or z3.is_false(got)), (pat, w)
