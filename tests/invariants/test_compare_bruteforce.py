"""Issue 38 item 7: an independent check of ``--compare``.

For the shipped policies and a corpus of edits (widenings, narrowings, a no-op), every request of a bounded
universe of entities — two tenants, three fleets, agents of every trust 0-3 in each fleet (one with a role),
tenant admins, an operator, namespaces, collections, and rows of every scope × status × owner × reader list ×
subject — is decided by Cedar (cedarpy) on the old and on the new set. An action with a request Cedar allows
only on the new set must be CHANGED (newly-permitted) in ``compare_sets``, one allowed only on the old set
NARROWED (newly-denied), and, since the universe covers every class of the access matrix these edits touch,
an action ``compare_sets`` reports changed must have such a request in the universe too."""

from __future__ import annotations

import os
from itertools import product
from typing import Any

import cedarpy
import pytest

from invariants.catalog import compare_sets
from invariants.engine import parse_text
from invariants.project import load_project

from .conftest import POLICIES

DEFAULT = (POLICIES / "default.cedar").read_text()

# (name, old text, new text) applied to default.cedar; each `old` occurs exactly once
EDITS = [
    ("fleet-read-any-trust", "principal.trust >= 2)\n};", "principal.trust >= 0)\n};"),
    # (a guard on another status would also narrow, on rows of that status: a widening only)
    ("deleted-guard-one-scope", 'when { resource.status == "deleted" };',
     'when { resource.status == "deleted" && resource.scope == "none" };'),
    ("update-delete-trust-2", "resource.owner == principal &&\n  principal.trust >= 1\n};",
     "resource.owner == principal &&\n  principal.trust >= 2\n};"),
    ("admins-no-redistribute", 'Action::"delete", Action::"redistribute"],\n  resource is Memory',
     'Action::"delete"],\n  resource is Memory'),
    ("search-needs-trust", 'when { resource.tenant == principal.tenant };\n\n@id("agent-delete-bulk")',
     'when { resource.tenant == principal.tenant && principal.trust >= 1 };\n\n@id("agent-delete-bulk")'),
    ("restricted-owner-reads", "resource.readers.contains(principal)\n};",
     "(resource.readers.contains(principal) || resource.owner == principal)\n};"),
    ("no-op", "// ---- read: the four scopes", "// ---- read: the four scopes (reworded)"),
]


def _uid(t: str, i: str) -> dict[str, str]:
    return {"type": t, "id": i}


def _e(t: str, i: str, attrs: dict[str, Any] | None = None, parents: list[dict[str, str]] | None = None
       ) -> dict[str, Any]:
    return {"uid": _uid(t, i), "attrs": attrs or {}, "parents": parents or []}


def _ref(t: str, i: str) -> dict[str, Any]:
    return {"__entity": _uid(t, i)}


def universe() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(entities, requests) of the bounded universe."""
    ents: list[dict[str, Any]] = [_e("Tenant", t) for t in ("t1", "t2")]
    fleets = [("t1", "t1/f1"), ("t1", "t1/f2"), ("t2", "t2/f1")]
    ents += [_e("Fleet", f, {"tenant": _ref("Tenant", t)}, [_uid("Tenant", t)]) for t, f in fleets]
    agents = []
    for (t, f), trust in product(fleets, range(4)):
        a = f"{f}/a{trust}"
        agents.append((t, f, a))
        ents.append(_e("Agent", a, {"tenant": _ref("Tenant", t), "fleet": _ref("Fleet", f), "trust": trust,
                                    "roles": ["auditor"] if trust == 1 else []}, [_uid("Fleet", f)]))
    admins = [("t1", "t1/admin"), ("t2", "t2/admin")]
    ents += [_e("TenantAdmin", a, {"tenant": _ref("Tenant", t)}) for t, a in admins]
    ents += [_e("Operator", "op"), _e("Deployment", "deployment")]
    for t in ("t1", "t2"):
        ents.append(_e("Namespace", f"{t}/ns", {"tenant": _ref("Tenant", t)}, [_uid("Tenant", t)]))
        ents.append(_e("Collection", f"{t}/c", {"tenant": _ref("Tenant", t)}, [_uid("Namespace", f"{t}/ns")]))
    rows = []
    owners = [("t1", "t1/f1", "t1/f1/a1"), ("t1", "t1/f2", "t1/f2/a3"), ("t2", "t2/f1", "t2/f1/a1")]
    n = 0
    for (t, f, o), scope, status, readers, subject in product(
            owners, ("agent", "fleet", "tenant", "restricted", "other"), ("active", "superseded", "deleted"),
            ([], ["t1/f2/a0"]), (None, "t1-handbook")):
        attrs: dict[str, Any] = {"tenant": _ref("Tenant", t), "fleet": _ref("Fleet", f), "owner": _ref("Agent", o),
                                 "scope": scope, "status": status, "readers": [_ref("Agent", r) for r in readers],
                                 "labels": []}
        if subject:
            attrs["subject"] = subject
        n += 1
        rows.append(f"m{n}")
        ents.append(_e("Memory", f"m{n}", attrs, [_uid("Fleet", f)]))
    principals = [_uid("Agent", a) for _, _, a in agents] + [_uid("TenantAdmin", a) for _, a in admins] + \
        [_uid("Operator", "op")]
    schema = load_project(POLICIES).schema
    resources = {"Memory": [_uid("Memory", m) for m in rows], "Collection": [_uid("Collection", "t1/c"),
                 _uid("Collection", "t2/c")], "Namespace": [_uid("Namespace", "t1/ns"), _uid("Namespace", "t2/ns")],
                 "Deployment": [_uid("Deployment", "deployment")]}
    reqs = []
    for action in schema.applicable_actions():
        ad = schema.actions[action]
        ctxs: list[dict[str, Any]] = [{}]
        if action == "redistribute":
            ctxs = [{"target_fleet": _ref("Fleet", f), "target_scope": "fleet"} for _, f in fleets]
        for p in principals:
            if p["type"] not in ad.principals:
                continue
            for rt in ad.resources:
                for r in resources[rt]:
                    for c in ctxs:
                        reqs.append({"principal": p, "action": _uid("Action", action), "resource": r, "context": c})
    return ents, reqs


@pytest.fixture(scope="module")
def world() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[bool]]:
    ents, reqs = universe()
    schema = (POLICIES / "memwarden.cedarschema").read_text()
    base = [r.decision == cedarpy.Decision.Allow
            for r in cedarpy.is_authorized_batch(reqs, DEFAULT, ents, schema)]
    assert any(base) and not all(base)  # the universe is not degenerate
    return ents, reqs, base


# A full run of the seven edits takes minutes of solver time; CI runs one edit of each kind (a widening, a narrowing,
# a status guard, the no-op) and ``MW_BRUTEFORCE_ALL=1`` runs them all.
CI_EDITS = ("fleet-read-any-trust", "deleted-guard-one-scope", "update-delete-trust-2", "no-op")
CHOSEN = EDITS if os.environ.get("MW_BRUTEFORCE_ALL") else [e for e in EDITS if e[0] in CI_EDITS]


@pytest.mark.parametrize("name,old,new", CHOSEN, ids=[e[0] for e in CHOSEN])
def test_compare_agrees_with_brute_force(name: str, old: str, new: str,
                                         world: tuple[list[dict[str, Any]], list[dict[str, Any]], list[bool]]) -> None:
    ents, reqs, base = world
    assert DEFAULT.count(old) == 1, name
    edited = DEFAULT.replace(old, new)
    schema_text = (POLICIES / "memwarden.cedarschema").read_text()
    after = [r.decision == cedarpy.Decision.Allow
             for r in cedarpy.is_authorized_batch(reqs, edited, ents, schema_text)]
    widened = {q["action"]["id"] for q, a, b in zip(reqs, base, after) if b and not a}
    narrowed = {q["action"]["id"] for q, a, b in zip(reqs, base, after) if a and not b}
    proj = load_project(POLICIES)
    res = compare_sets(proj.schema, proj.schema_text, parse_text(DEFAULT, "old.cedar").policies,
                       parse_text(edited, "new.cedar").policies)
    assert all(r.status in ("UNCHANGED", "CHANGED", "NARROWED") for r in res), [(r.action, r.status) for r in res]
    said_w = {r.action for r in res if r.invariant == "newly-permitted" and r.status == "CHANGED"}
    said_n = {r.action for r in res if r.invariant == "newly-denied" and r.status == "NARROWED"}
    assert (said_w, said_n) == (widened, narrowed), name
    if name == "no-op":
        assert not widened and not narrowed
    else:
        assert widened or narrowed, f"edit {name} changes nothing in the universe"
