"""Shrunk failures of the differential test, replayed forever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from invariants.engine import parse_text

from .test_differential import check_agreement

AGENT = {"uid": {"type": "Agent", "id": "t1/f1/a1"},
         "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "t1"}},
                   "fleet": {"__entity": {"type": "Fleet", "id": "t1/f1"}}, "trust": 0, "roles": []},
         "parents": []}
MEMORY = {"uid": {"type": "Memory", "id": "m1"},
          "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "t1"}},
                    "fleet": {"__entity": {"type": "Fleet", "id": "t1/f1"}},
                    "owner": {"__entity": {"type": "Agent", "id": "t1/f1/a1"}},
                    "scope": "", "status": "", "readers": [], "labels": ["agent"]},
          "parents": []}
READ = {"principal": {"type": "Agent", "id": "t1/f1/a1"}, "action": {"type": "Action", "id": "read"},
        "resource": {"type": "Memory", "id": "m1"}, "context": {}}


def test_contains_all_against_a_literal_set() -> None:
    # Z3's model evaluator leaves `subset` (a `map` over arrays) unreduced; reading the
    # decision off the model said Deny where Cedar (rightly) said Allow.
    text = ('@id("p0")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n;\n'
            '@id("p1")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
            'unless { [""].containsAll(resource.labels) };')
    assert check_agreement(text, [AGENT, MEMORY], READ)


def test_cofinite_set_in_model_still_gives_a_counterexample() -> None:
    # Z3 answered with `labels = Store(K(True), ...)` (a co-finite set); the general
    # finite-set retry timed out and the check was UNKNOWN.  The model's own members
    # (plus mentioned terms) give a finite set directly.
    from invariants.catalog import check_invariants

    from .test_symbolic_replay import INVARIANTS, SCHEMA_MODEL, SCHEMA_TEXT
    from invariants.engine import parse_text

    text = ('@id("p0")\npermit (principal == TenantAdmin::"t1/admin/k1", action == Action::"read", '
            'resource is Memory)\n;\n@id("p1")\npermit (principal is TenantAdmin, action == Action::"read", '
            'resource is Memory)\nwhen { resource.owner.roles.containsAny((if resource.labels.contains((if '
            'resource has object then resource.object else "restricted")) then ["tenant"] else ["active"])) };')
    results = check_invariants(SCHEMA_MODEL, SCHEMA_TEXT, parse_text(text, "x").policies, INVARIANTS, 5)
    assert {r.status for r in results} <= {"PROVED", "VIOLATED"}
    assert any(r.status == "VIOLATED" and r.invariant == "never-errors" for r in results)


def test_cofinite_set_needing_literal_members() -> None:
    # The owner's roles must meet ["active", "restricted"]; the model gave a co-finite
    # set and the candidate members did not include set-literal elements: UNKNOWN.
    from invariants.catalog import check_invariants
    from invariants.engine import parse_text

    from .test_symbolic_replay import INVARIANTS, SCHEMA_MODEL, SCHEMA_TEXT

    text = ('@id("p0")\npermit (principal is TenantAdmin in TenantAdmin::"t1/admin/k1", action == '
            'Action::"delete", resource is Memory)\nunless { (if (!((resource.owner.trust != '
            'resource.owner.trust) && true)) then (!("restricted" like "*")) else ((!true) && (true || '
            '(resource.status like "")))) }\nunless { ((resource.owner in Fleet::"t2/f1") || '
            '(!["active", "restricted"].containsAny(resource.owner.roles))) };')
    results = check_invariants(SCHEMA_MODEL, SCHEMA_TEXT, parse_text(text, "x").policies, INVARIANTS, 5)
    assert {r.status for r in results} <= {"PROVED", "VIOLATED"}
    assert any(r.status == "VIOLATED" and r.invariant == "tenant-isolation" for r in results)


def test_string_literal_is_a_candidate_member_of_a_free_set() -> None:
    # Found while fixing issue 12: the model answered `roles = K(True)` (every string); the finite
    # retry only offered the model's explicit members and mentioned *terms*, and the literal "auditor"
    # of `roles.contains("auditor")` was not among them, so a real violation came out UNKNOWN. String
    # literals (and the argument of `contains`) are candidate members now.
    from invariants.catalog import check_invariants
    from invariants.project import load_project

    from .conftest import POLICIES

    proj = load_project(POLICIES)
    extra = parse_text('@id("auditor-reads")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
                       'when { resource.tenant == principal.tenant && principal.roles.contains("auditor") && '
                       'resource.scope == "agent" };\n', "x.cedar").policies
    inv = [i for i in proj.invariants if i.id == "inv-scope"]
    (row,) = [r for r in check_invariants(proj.schema, proj.schema_text, proj.policies + extra, inv, 60)
              if r.invariant == "inv-scope"]
    assert row.status == "VIOLATED", row.message
    req, ents = row.counterexample["request"], row.counterexample["entities"]
    me = next(e for e in ents if e["uid"] == req["principal"])
    assert "auditor" in me["attrs"]["roles"]


# Disagreements found by bench/differential.py, as it writes them (one JSON object per file: "schema"
# "memwarden" or "deep", "policies", "request", "entities"; optional "cedar": Cedar's answer when found,
# checked so a change in cedarpy shows; "note"): the Z3 model must agree with Cedar on each.
REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.json"))


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_recorded_disagreement(path: Path) -> None:
    from .strategies import DEEP_SCHEMA
    from .test_differential import SCHEMA_TEXT

    case = json.loads(path.read_text(encoding="utf-8"))
    schema = {"memwarden": SCHEMA_TEXT, "deep": DEEP_SCHEMA}[case["schema"]]
    if "cedar" in case:
        from invariants.engine import authorize
        pols = parse_text(case["policies"], "generated.cedar").policies
        assert authorize(case["request"], pols, case["entities"], schema).to_json() == case["cedar"]
    assert check_agreement(case["policies"], case["entities"], case["request"], schema)
