"""policy-check end to end: the default policies prove, each broken fixture is caught
by the right invariant with a counterexample that Cedar confirms, exit codes, formats."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import invariants
from invariants import translate
from invariants.cli import app
from invariants.engine import authorize, parse_text

from .conftest import BASELINE, FIXTURES, POLICIES, SCHEMA

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def run_json(*args: str) -> tuple[int, dict[str, Any]]:
    code, out = run(*args, "--format", "json")
    return code, json.loads(out)


def fixture_schema(name: str) -> Path:
    """The fixture's own schema if it has one (a broken schema), else the default one."""
    own = FIXTURES / name / "memwarden.cedarschema"
    return own if own.is_file() else SCHEMA


def check_fixture(name: str, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    return run_json(str(FIXTURES / name), "--schema", str(fixture_schema(name)),
                    "--counterexamples", str(tmp_path / "cex"))


def test_public_api_is_pinned() -> None:
    assert sorted(invariants.__all__) == sorted([
        "CheckResult", "Invariant", "check_invariants", "compare_sets", "load_invariants",
        "InputError", "PolicyCheckError", "PolicyInvalid", "Unsupported", "Schema", "parse_schema"])


def test_default_policies_prove_everything(tmp_path: Path) -> None:
    code, rep = run_json(str(POLICIES), "--counterexamples", str(tmp_path))
    assert code == 0, rep
    statuses = {(r["invariant"], r["action"]): r["status"] for r in rep["results"]}
    assert set(statuses.values()) == {"PROVED"}
    invs = {i for i, _ in statuses}
    assert invs == {"inv-scope", "tenant-isolation", "deletion-closure", "write-scope", "cross-fleet-propagation",
                    "read-only-trust-0", "never-errors", "trust-monotonicity", "redistribute-target-in-tenant",
                    "deployment-operator-only", "supersede-scope", "row-ownership", "admin-tenant-admins-only",
                    "row-writer-is-owner"}
    # every schema action is covered, tenant isolation and never-errors on all fourteen
    actions = {"read", "write", "update", "delete", "supersede", "redistribute", "search", "delete_bulk", "list",
               "admin", "create_collection", "configure", "reset", "manage_tenants"}
    assert {a for i, a in statuses if i == "deployment-operator-only"} == {"configure", "reset", "manage_tenants"}
    assert {a for i, a in statuses if i == "tenant-isolation"} == actions
    assert {a for i, a in statuses if i == "never-errors"} == actions
    # the invariants of issue 12's catalogue gaps apply to policies/ and hold there
    for key in (("row-ownership", "update"), ("row-ownership", "delete"), ("admin-tenant-admins-only", "admin")):
        assert statuses[key] == "PROVED", key
    assert rep["summary"]["tests_passed"] >= 40 and rep["summary"]["tests_failed"] == 0
    assert all(r["solver_seconds"] >= 0 for r in rep["results"])


# (fixture, invariant, action) that must be VIOLATED; everything else listed as proved
BROKEN = [
    ("missing-tenant-check", "tenant-isolation", "read"),
    ("erroring-deleted-forbid", "never-errors", "read"),
    ("erroring-deleted-forbid", "deletion-closure", "read"),
    ("fleet-ignores-trust", "inv-scope", "read"),
    ("deleted-one-action", "deletion-closure", "redistribute"),
    ("like-other-tenants", "tenant-isolation", "read"),
    ("in-missing-parents", "inv-scope", "read"),
    ("tenant-admin-configures", "deployment-operator-only", "configure"),
    ("supersede-any-fact", "supersede-scope", "supersede"),
    # issue 12: catalogue gaps that every other invariant proved
    ("trusted-agents-change-any-row", "row-ownership", "update"),
    ("trusted-agents-change-any-row", "row-ownership", "delete"),
    ("search-list-rows", "inv-scope", "search"),
    ("search-list-rows", "inv-scope", "list"),
    ("agents-administer", "admin-tenant-admins-only", "admin"),
    # issue 38: tenant admins writing rows owned by any agent
    ("tenant-admins-write-any-row", "row-writer-is-owner", "write"),
]


@pytest.mark.parametrize("fixture,invariant,action", BROKEN)
def test_broken_fixture_is_caught_with_replayed_counterexample(fixture: str, invariant: str, action: str,
                                                                tmp_path: Path) -> None:
    code, rep = check_fixture(fixture, tmp_path)
    assert code == 1
    row = next(r for r in rep["results"] if r["invariant"] == invariant and r["action"] == action)
    assert row["status"] == "VIOLATED", row
    cex = row["counterexample"]
    assert cex["model"] == cex["cedar"]
    saved = json.loads(Path(row["counterexample_file"]).read_text())
    assert saved == cex
    # Replay it once more, independently, through cedarpy.
    pols = parse_text((FIXTURES / fixture / "policies.cedar").read_text(), "policies.cedar").policies
    again = authorize(cex["request"], pols, cex["entities"], fixture_schema(fixture).read_text())
    if invariant == "never-errors":
        assert again.errors
    else:
        assert again.allow


# Each catalogue gap of issue 12: exactly the new invariant fails, and the counterexample is the gap itself
# (Cedar allows it on the broken copy and denies it on policies/).
GAPS = {
    "trusted-agents-change-any-row": {("row-ownership", "update"), ("row-ownership", "delete")},
    "search-list-rows": {("inv-scope", "search"), ("inv-scope", "list")},
    "agents-administer": {("admin-tenant-admins-only", "admin")},
}


@pytest.mark.parametrize("fixture", sorted(GAPS))
def test_catalogue_gap_is_the_only_failure_and_policies_deny_it(fixture: str, tmp_path: Path) -> None:
    _, rep = check_fixture(fixture, tmp_path)
    bad = {(r["invariant"], r["action"]): r for r in rep["results"] if r["status"] != "PROVED"}
    assert set(bad) == GAPS[fixture], {k: v["status"] for k, v in bad.items()}
    default = parse_text((POLICIES / "default.cedar").read_text(), "default.cedar").policies
    for row in bad.values():
        cex = row["counterexample"]
        req, ents = cex["request"], cex["entities"]
        p = next(e for e in ents if e["uid"] == req["principal"])
        assert req["principal"]["type"] == "Agent" and cex["cedar"]["decision"] == "allow"
        # policies/ (its policies under its schema) denies it; for search-list-rows the request is not even
        # valid under the default schema, where search and list are decided on collections only
        assert not authorize(req, default, ents, SCHEMA.read_text()).allow, "policies/ must deny the counterexample"
        if fixture == "trusted-agents-change-any-row":
            r = next(e for e in ents if e["uid"] == req["resource"])
            assert r["attrs"]["owner"] != {"__entity": req["principal"]} and p["attrs"]["trust"] >= 2


def test_row_reads_through_search_and_list_cannot_bypass_inv_scope_on_policies() -> None:
    # search-list-rows is policies/ itself under a schema that also decides search and list on rows, where
    # agent-search-list bounds them by tenant isolation only (VIOLATED above). Under policies/' own schema
    # no row is decided by search or list (every row leaving the backend is a `read`, which Inv-Scope
    # proves: test_default_policies_prove_everything), and Inv-Scope covers search and list wherever a
    # schema does decide them on rows.
    from invariants.catalog import actions_of
    from invariants.project import load_project

    proj = load_project(POLICIES)
    for action in ("search", "list"):
        assert "Memory" not in proj.schema.actions[action].resources
    rows = load_project(POLICIES, schema_path=FIXTURES / "search-list-rows" / "memwarden.cedarschema")
    scope = next(i for i in rows.invariants if i.id == "inv-scope")
    assert {"read", "search", "list"} <= set(actions_of(rows.schema, scope.policy.ast.action))


@pytest.mark.parametrize("action", ["update", "delete"])
def test_trust_2_agent_changing_another_fleets_row(action: str) -> None:
    # The gap as the issue states it: a trust-2 agent, another agent's row, in another fleet of its tenant.
    def e(t: str, i: str) -> dict[str, Any]:
        return {"__entity": {"type": t, "id": i}}

    ents = [{"uid": {"type": "Tenant", "id": "t1"}, "attrs": {}, "parents": []},
            *({"uid": {"type": "Fleet", "id": f}, "attrs": {"tenant": e("Tenant", "t1")},
               "parents": [{"type": "Tenant", "id": "t1"}]} for f in ("t1/f1", "t1/f2")),
            *({"uid": {"type": "Agent", "id": f"t1/{f}/{a}"}, "parents": [{"type": "Fleet", "id": f"t1/{f}"}],
               "attrs": {"tenant": e("Tenant", "t1"), "fleet": e("Fleet", f"t1/{f}"), "trust": 2, "roles": []}}
              for f, a in (("f1", "a1"), ("f2", "a2"))),
            {"uid": {"type": "Memory", "id": "m"}, "parents": [{"type": "Fleet", "id": "t1/f2"}],
             "attrs": {"tenant": e("Tenant", "t1"), "fleet": e("Fleet", "t1/f2"), "owner": e("Agent", "t1/f2/a2"),
                       "scope": "fleet", "status": "active", "readers": [], "labels": []}}]
    req = {"principal": {"type": "Agent", "id": "t1/f1/a1"}, "action": {"type": "Action", "id": action},
           "resource": {"type": "Memory", "id": "m"}, "context": {}}
    broken = parse_text((FIXTURES / "trusted-agents-change-any-row" / "policies.cedar").read_text(), "b.cedar").policies
    default = parse_text((POLICIES / "default.cedar").read_text(), "default.cedar").policies
    assert authorize(req, broken, ents, SCHEMA.read_text()).allow
    assert not authorize(req, default, ents, SCHEMA.read_text()).allow


def test_tenant_admin_on_the_deployment_is_the_counterexample(tmp_path: Path) -> None:
    _, rep = check_fixture("tenant-admin-configures", tmp_path)
    bad = {(r["invariant"], r["action"]) for r in rep["results"] if r["status"] != "PROVED"}
    assert bad == {("deployment-operator-only", "configure")}
    row = next(r for r in rep["results"] if r["invariant"] == "deployment-operator-only" and r["action"] == "configure")
    assert row["counterexample"]["request"]["principal"]["type"] == "TenantAdmin"
    assert row["counterexample"]["request"]["resource"]["type"] == "Deployment"


def test_fixture_details(tmp_path: Path) -> None:
    # deletion guard missing one action: only that action is violated
    _, rep = check_fixture("deleted-one-action", tmp_path)
    bad = {(r["invariant"], r["action"]) for r in rep["results"] if r["status"] != "PROVED"}
    assert bad == {("deletion-closure", "redistribute")}
    # the erroring forbid: the counterexample's owner is absent from the store and the row is deleted
    _, rep = check_fixture("erroring-deleted-forbid", tmp_path)
    row = next(r for r in rep["results"] if (r["invariant"], r["action"]) == ("deletion-closure", "read"))
    ents = {(e["uid"]["type"], e["uid"]["id"]): e for e in row["counterexample"]["entities"]}
    res = ents[("Memory", row["counterexample"]["request"]["resource"]["id"])]
    assert res["attrs"]["status"] == "deleted"
    assert ("Agent", res["attrs"]["owner"]["__entity"]["id"]) not in ents
    assert row["counterexample"]["cedar"]["errors"] == ["forbid-orphaned-or-deleted"]
    # like: the row is another tenant's, and its subject matches "t1*"
    _, rep = check_fixture("like-other-tenants", tmp_path)
    row = next(r for r in rep["results"] if (r["invariant"], r["action"]) == ("tenant-isolation", "read"))
    ents = {(e["uid"]["type"], e["uid"]["id"]): e for e in row["counterexample"]["entities"]}
    res = ents[("Memory", row["counterexample"]["request"]["resource"]["id"])]
    assert res["attrs"]["tenant"]["__entity"]["id"] != "t1" and res["attrs"]["subject"].startswith("t1")


def test_text_output_shows_counterexample(tmp_path: Path) -> None:
    code, out = run(str(FIXTURES / "fleet-ignores-trust"), "--schema", str(SCHEMA), "--counterexamples", str(tmp_path))
    assert code == 1
    assert "VIOLATED" in out and 'request: Agent::"agent1" read Memory::"memory1"' in out and "read-fleet-scope" in out
    assert list(tmp_path.glob("inv-scope--read.json"))


def test_sarif_and_junit(tmp_path: Path) -> None:
    args = [str(FIXTURES / "missing-tenant-check"), "--schema", str(SCHEMA), "--counterexamples", str(tmp_path)]
    code, out = run(*args, "--format", "sarif")
    assert code == 1
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0"
    ids = {r["ruleId"] for r in sarif["runs"][0]["results"]}
    assert "tenant-isolation" in ids
    code, out = run(*args, "--format", "junit")
    assert code == 1
    root = ET.fromstring(out)
    failures = root.findall(".//testcase/failure")
    assert any(f.get("type") == "VIOLATED" for f in failures)


def _copy_policies(tmp_path: Path) -> Path:
    d = tmp_path / "pol"
    shutil.copytree(POLICIES, d)
    return d


def test_exit_1_on_invalid_policy_with_file_and_line(tmp_path: Path) -> None:
    d = _copy_policies(tmp_path)
    (d / "zz-bad.cedar").write_text('// comment\n\n@id("bad")\npermit (principal is Agent, action, resource)\n'
                                    'when { principal.nope == 1 };\n')
    code, rep = run_json(str(d))
    assert code == 1
    # the line and column of the attribute Cedar names, not the policy's first line
    assert rep["invalid"][0]["file"].endswith("zz-bad.cedar")
    assert (rep["invalid"][0]["line"], rep["invalid"][0]["column"]) == (5, 18)
    (d / "zz-bad.cedar").write_text('permit (principal, action, resource);\n\npermit (principal, action resource);\n')
    code, out = run(str(d))
    assert code == 1 and "zz-bad.cedar:3" in out.replace("\n", "")


def test_exit_1_on_failing_policy_test(tmp_path: Path) -> None:
    d = _copy_policies(tmp_path)
    t = json.loads((d / "tests" / "read-scopes.json").read_text())
    t["cases"][0]["expect"] = "deny"
    (d / "tests" / "read-scopes.json").write_text(json.dumps(t))
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 1 and rep["summary"]["tests_failed"] == 1


def test_uncovered_action_and_vacuous_invariant_fail() -> None:
    from invariants.catalog import check_invariants, load_invariants
    from invariants.project import load_project

    proj = load_project(POLICIES)
    only_scope = [i for i in proj.invariants if i.id == "inv-scope"]
    results = check_invariants(proj.schema, proj.schema_text, proj.policies, only_scope)
    uncovered = {r.action for r in results if r.status == "UNCOVERED"}
    assert uncovered == {"write", "update", "delete", "supersede", "redistribute", "search", "delete_bulk", "list", "admin",
                         "create_collection", "configure", "reset", "manage_tenants"}
    rest = parse_text('@id("rest") @kind("unconstrained")\npermit (principal, action in [Action::"write", '
                      'Action::"update", Action::"delete", Action::"supersede", Action::"redistribute", Action::"search", '
                      'Action::"delete_bulk", Action::"list", Action::"admin", Action::"create_collection", Action::"configure", Action::"reset", '
                      'Action::"manage_tenants"], resource);\n', "rest.cedar").policies
    results = check_invariants(proj.schema, proj.schema_text, proj.policies, only_scope + load_invariants(rest))
    assert {r.status for r in results} == {"PROVED"}
    # An invariant that applies to no request (a monotone bound on an attribute the schema lacks) is
    # VACUOUS when required, never silently counted as holding.
    ghost = load_invariants(parse_text('@id("ghost") @kind("monotone") @attribute("seniority")\n'
                                       'permit (principal is Agent, action, resource);\n', "g.cedar").policies)
    results = check_invariants(proj.schema, proj.schema_text, proj.policies, ghost, required={"ghost"})
    assert [(r.invariant, r.status) for r in results if r.invariant == "ghost"] == [("ghost", "VACUOUS")]


WIDEN = ('@id("read-tenant-wide")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
         'when { resource.tenant == principal.tenant };\n')


def _widened(tmp_path: Path) -> Path:
    """A copy of policies/ with one extra permit: any agent reads any row of its tenant."""
    d = _copy_policies(tmp_path)
    (d / "zz-widen.cedar").write_text("// tenant-wide reads\n" + WIDEN)
    shutil.rmtree(d / "tests")  # the policy tests would catch it too; the invariants must on their own
    return d


def _status(rep: dict[str, Any], invariant: str, action: str) -> str:
    return str(next(r["status"] for r in rep["results"] if (r["invariant"], r["action"]) == (invariant, action)))


def test_baseline_invariants_are_checked_without_any_in_the_directory(tmp_path: Path) -> None:
    d = _widened(tmp_path)
    assert not (d / "invariants").exists()
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 1 and _status(rep, "inv-scope", "read") == "VIOLATED"
    row = next(r for r in rep["results"] if r["invariant"] == "inv-scope" and r["action"] == "read")
    assert row["file"] == str(BASELINE / "inv-scope.cedar")
    assert row["counterexample"]["cedar"]["reasons"] == ["read-tenant-wide"]


def test_directory_invariants_add_never_shadow_or_exempt(tmp_path: Path) -> None:
    d = _widened(tmp_path)
    (d / "invariants").mkdir()
    # an identical copy of a baseline file is the same invariant, checked once
    shutil.copy(BASELINE / "tenant-isolation.cedar", d / "invariants" / "tenant-isolation.cedar")
    # a weakened invariant under a baseline id, and an opt-out of read
    (d / "invariants" / "inv-scope.cedar").write_text(
        '@id("inv-scope")\npermit (principal, action == Action::"read", resource is Memory);\n')
    (d / "invariants" / "opt-out.cedar").write_text(
        '@id("reads-are-free") @kind("unconstrained")\npermit (principal, action == Action::"read", resource);\n')
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 1
    assert _status(rep, "inv-scope", "read") == "VIOLATED"  # the baseline one, still checked
    shadow = [r for r in rep["results"] if r["invariant"].startswith("inv-scope@")]
    assert shadow and shadow[0]["status"] == "PROVED" and shadow[0]["file"].endswith("invariants/inv-scope.cedar")
    assert sum(r["invariant"] == "tenant-isolation" and r["action"] == "read" for r in rep["results"]) == 1
    # directory invariants do add: a stricter one fails the default policies
    d2 = _copy_policies(tmp_path / "two")
    (d2 / "invariants").mkdir()
    shutil.copy(Path(__file__).parent / "proposed-invariants.cedar", d2 / "invariants")
    code, rep = run_json(str(d2), "--counterexamples", str(tmp_path / "c"))
    assert code == 1 and _status(rep, "update-delete-home-fleet", "update") == "VIOLATED"


def test_schema_change_that_breaks_a_baseline_invariant_fails(tmp_path: Path) -> None:
    d = _copy_policies(tmp_path)
    schema = d / "memwarden.cedarschema"
    schema.write_text(schema.read_text().replace("  status: String,", "  status?: String,"))
    pol = d / "default.cedar"
    pol.write_text(pol.read_text().replace('when { resource.status == "deleted" };',
                                           'when { resource has status && resource.status == "deleted" };'))
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 1
    bad = {(Path(i["file"]).name, i["policy"]) for i in rep["invalid"]}
    assert ("deletion-closure.cedar", "deletion-closure") in bad and ("inv-scope.cedar", "inv-scope") in bad
    assert all(Path(i["file"]).parent == BASELINE for i in rep["invalid"])  # the policies themselves validate


def test_version() -> None:
    from importlib.metadata import version

    code, out = run("--version")
    assert code == 0 and out.strip() == f"policy-check {version('memwarden')}"


def test_exit_2_on_usage_errors(tmp_path: Path) -> None:
    assert run(str(tmp_path / "missing"))[0] == 2
    assert run()[0] == 2
    assert run(str(POLICIES), "--compare", str(POLICIES), str(POLICIES))[0] == 2
    (tmp_path / "x.cedar").write_text("")
    assert run(str(tmp_path))[0] == 2  # no schema
    assert run(str(POLICIES), "--format", "yaml")[0] == 2


def test_exit_3_on_unmodelled_construct(tmp_path: Path) -> None:
    d = _copy_policies(tmp_path)
    (d / "zz-ip.cedar").write_text('@id("loopback-forbid")\nforbid (principal, action, resource)\n'
                                   'when { ip("10.0.0.1").isLoopback() };\n')
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 3
    unknown = [r for r in rep["results"] if r["status"] == "UNKNOWN"]
    assert unknown and all("loopback-forbid" in r["message"] and "extension" in r["message"] for r in unknown)
    assert not any(r["status"] == "PROVED" for r in rep["results"])


def test_exit_4_when_model_and_cedar_disagree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Inject a translator bug: `like` matches exactly the strings the pattern rejects.
    real = translate.like
    monkeypatch.setattr(translate, "like", lambda s, elems, codec: translate.z3.Not(real(s, elems, codec)))
    code, rep = check_fixture("like-other-tenants", tmp_path)
    assert code == 4
    bad = [r for r in rep["results"] if r["status"] == "DISAGREE"]
    assert bad and bad[0]["counterexample"]["model"] != bad[0]["counterexample"]["cedar"]
