"""One-line English summaries of counterexamples (invariants.summary) and where they show up:
CheckResult.summary / permitted_by / blamed, the gate's failure line, SARIF and JUnit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from invariants.catalog import check_invariants
from invariants.engine import authorize
from invariants.gate import admit, failure_line
from invariants.project import load_project
from invariants.summary import counterexample_summary, request_sentence

from .conftest import FIXTURES, SCHEMA


def ref(t: str, i: str) -> dict[str, Any]:
    return {"__entity": {"type": t, "id": i}}


def agent(i: str, tenant: str, fleet: str, trust: int) -> dict[str, Any]:
    return {"uid": {"type": "Agent", "id": i}, "parents": [],
            "attrs": {"tenant": ref("Tenant", tenant), "fleet": ref("Fleet", fleet), "trust": trust, "roles": []}}


def row(i: str, tenant: str, fleet: str, owner: str, scope: str, status: str = "active",
        readers: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"uid": {"type": "Memory", "id": i}, "parents": [],
            "attrs": {"tenant": ref("Tenant", tenant), "fleet": ref("Fleet", fleet), "owner": ref("Agent", owner),
                      "scope": scope, "status": status, "readers": [ref("Agent", r) for r in readers], "labels": []}}


def req(p: tuple[str, str], action: str, r: tuple[str, str], **ctx: Any) -> dict[str, Any]:
    return {"principal": {"type": p[0], "id": p[1]}, "action": {"type": "Action", "id": action},
            "resource": {"type": r[0], "id": r[1]}, "context": ctx}


def test_the_issue_example_reads_as_written() -> None:
    ents = [agent("a2", "t", "blue", 2), agent("a1", "t", "red", 1), row("m1", "t", "red", "a1", "agent")]
    cex = {"kind": "bound", "request": req(("Agent", "a2"), "read", ("Memory", "m1")), "entities": ents}
    assert counterexample_summary(cex) == \
        "agent a2 (fleet blue, trust 2) may read an agent-scoped row m1 owned by a1 in fleet red"


def test_tenant_status_readers_ownership_and_context() -> None:
    ents = [agent("a1", "t1", "f1", 0), row("m1", "t2", "f9", "a7", "tenant", status="deleted")]
    assert request_sentence(req(("Agent", "a1"), "read", ("Memory", "m1")), ents) == \
        ("agent a1 (tenant t1, fleet f1, trust 0) may read a deleted tenant-scoped row m1 owned by a7 "
         "(absent from the entity store) in fleet f9 of tenant t2")
    ents = [agent("a1", "t", "f1", 3), row("m1", "t", "f1", "a1", "restricted", readers=("a2",))]
    assert request_sentence(req(("Agent", "a1"), "redistribute", ("Memory", "m1"),
                                target_fleet=ref("Fleet", "f2"), target_scope="fleet"), ents) == \
        'agent a1 (fleet f1, trust 3) may redistribute its own restricted-scoped row m1 in fleet f1 ' \
        'to a fleet f2 absent from the entity store as "fleet" scope'
    ents = [{"uid": {"type": "TenantAdmin", "id": "adm"}, "attrs": {"tenant": ref("Tenant", "t")}, "parents": []},
            {"uid": {"type": "Deployment", "id": "chroma"}, "attrs": {}, "parents": []}]
    assert request_sentence(req(("TenantAdmin", "adm"), "configure", ("Deployment", "chroma")), ents) == \
        "tenant admin adm (tenant t) may configure the deployment chroma"
    # odd values are quoted, never printed raw
    ents = [agent("a\n1", "t", "f", 1), row("m", "t", "f", "x", "", status="")]
    s = request_sentence(req(("Agent", "a\n1"), "delete_bulk", ("Memory", "m")), ents)
    assert s.startswith('agent "a\\n1" (fleet f, trust 1) may bulk-delete in a row m with scope ""')  # no empty status
    assert "\n" not in s


def test_never_errors_monotone_and_compare_wording() -> None:
    ents = [agent("a1", "t", "f", 1), row("m", "t", "f", "a2", "fleet")]
    r = req(("Agent", "a1"), "read", ("Memory", "m"))
    assert counterexample_summary({"kind": "never-errors", "request": r, "entities": ents,
                                   "cedar": {"decision": "deny", "reasons": [], "errors": ["p1"]}}) == \
        "policy p1 raises an evaluation error when agent a1 (fleet f, trust 1) asks to read a fleet-scoped row m " \
        "owned by a2 (absent from the entity store) in fleet f"
    raised = [agent("a1", "t", "f", 3), row("m", "t", "f", "a2", "fleet")]
    assert counterexample_summary({"kind": "monotone", "request": r, "entities": ents,
                                   "raised": {"entities": raised}}).startswith(
        "raising the trust of agent a1 (fleet f, trust 1) to 3 (from 1) removes its permission to read")
    assert counterexample_summary({"invariant": "newly-permitted", "request": r, "entities": ents}).startswith(
        "agent a1 (fleet f, trust 1) may now read")
    assert counterexample_summary({"invariant": "newly-denied", "request": r, "entities": ents}).startswith(
        "agent a1 (fleet f, trust 1) may no longer read")


def _fixture_dir(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    shutil.copy(SCHEMA, d / SCHEMA.name)
    return d


def test_check_result_carries_summary_and_the_permitting_policy(tmp_path: Path) -> None:
    proj = load_project(_fixture_dir("fleet-ignores-trust", tmp_path))
    bad = [r for r in check_invariants(proj.schema, proj.schema_text, proj.policies, proj.invariants)
           if r.status == "VIOLATED"]
    assert [(r.invariant, r.action) for r in bad] == [("inv-scope", "read")]
    r = bad[0]
    cex = r.counterexample
    assert cex is not None
    # the summary describes this very counterexample
    assert r.summary == counterexample_summary(cex)
    p = cex["request"]["principal"]["id"]
    trust = next(e["attrs"]["trust"] for e in cex["entities"] if e["uid"]["id"] == p)
    assert r.summary.startswith(f"agent {p} (") and f"trust {trust}) may read a fleet-scoped row" in r.summary
    # permitted_by is Cedar's determining policy, located in the fixture file
    again = authorize(cex["request"], proj.policies, cex["entities"], proj.schema_text)
    assert again.allow and [b.id for b in r.permitted_by] == sorted(again.reasons)
    pol = next(x for x in proj.policies if x.id == r.permitted_by[0].id)
    assert (r.permitted_by[0].file, r.permitted_by[0].line) == (pol.file, pol.line)
    assert r.blamed == r.permitted_by
    line = failure_line(r, proj.policies)
    assert line.startswith(f"VIOLATED inv-scope ({r.file}:{r.line}) on read: {r.summary}; permitted by "
                           f"{pol.id} at {pol.file}:{pol.line}; counterexample ")


def test_never_errors_blames_the_erroring_policy(tmp_path: Path) -> None:
    d = _fixture_dir("erroring-deleted-forbid", tmp_path)
    res = admit(d)
    assert res.status == "invariant_violation"
    line = next(p for p in res.problems if p.startswith("VIOLATED never-errors") and " on read:" in p)
    text = (d / "policies.cedar").read_text().splitlines()
    n = next(i for i, t in enumerate(text, 1) if 'forbid-orphaned-or-deleted' in t)
    assert "policy forbid-orphaned-or-deleted raises an evaluation error when agent" in line
    assert f"evaluation error in forbid-orphaned-or-deleted at {d}/policies.cedar:{n}" in line
