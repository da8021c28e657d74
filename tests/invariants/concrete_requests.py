"""Concrete Cedar requests over the default schema for checking proved matrix cells against cedarpy:
a small universe of tenants, fleets and agents (some fleets in no tenant, some agents absent from the
store), every resource type of an action, trust outside 0–3, scopes and statuses outside the known
values. Shared by test_matrix and the ``policy-check --compare`` tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from invariants.schema import Schema

TENANTS, FLEETS, AGENTS = ["t1", "t2"], ["f1", "f2", "f3"], ["a1", "a2", "a3"]
Case = tuple[dict[str, Any], list[dict[str, Any]]]


def ref(t: str, i: str) -> dict[str, Any]:
    return {"__entity": {"type": t, "id": i}}


def requests(schema: Schema, actions: list[str]) -> st.SearchStrategy[Case]:
    """(request, entities) in Cedar JSON for one of ``actions``."""

    @st.composite
    def draw_case(draw: Any) -> Case:
        action = draw(st.sampled_from(actions))
        ad = schema.actions[action]
        pt, rt = draw(st.sampled_from(sorted(ad.principals))), draw(st.sampled_from(sorted(ad.resources)))
        ents: list[dict[str, Any]] = []
        fleet_tenant = {f: draw(st.sampled_from(TENANTS + [None])) for f in FLEETS}
        for f, t in fleet_tenant.items():
            ents.append({"uid": {"type": "Fleet", "id": f}, "attrs": {"tenant": ref("Tenant", t or "t9")},
                         "parents": [{"type": "Tenant", "id": t}] if t else []})
        ents += [{"uid": {"type": "Tenant", "id": t}, "attrs": {}, "parents": []} for t in TENANTS]
        present = draw(st.sets(st.sampled_from(AGENTS)))
        pid = draw(st.sampled_from(AGENTS)) if pt == "Agent" else "p"
        for a in sorted(present | ({pid} if pt == "Agent" else set())):
            ents.append({"uid": {"type": "Agent", "id": a}, "parents": [],
                         "attrs": {"tenant": ref("Tenant", draw(st.sampled_from(TENANTS))),
                                   "fleet": ref("Fleet", draw(st.sampled_from(FLEETS))),
                                   "trust": draw(st.integers(-1, 5)), "roles": []}})
        if pt == "TenantAdmin":
            ents.append({"uid": {"type": pt, "id": pid}, "parents": [],
                         "attrs": {"tenant": ref("Tenant", draw(st.sampled_from(TENANTS)))}})
        elif pt != "Agent":
            ents.append({"uid": {"type": pt, "id": pid}, "attrs": {}, "parents": []})
        rid = "r"
        if rt == "Memory":
            ents.append({"uid": {"type": "Memory", "id": rid}, "parents": [],
                         "attrs": {"tenant": ref("Tenant", draw(st.sampled_from(TENANTS))),
                                   "fleet": ref("Fleet", draw(st.sampled_from(FLEETS))),
                                   "owner": ref("Agent", draw(st.sampled_from(AGENTS))),
                                   "scope": draw(st.sampled_from(["agent", "fleet", "tenant", "restricted", "x", ""])),
                                   "status": draw(st.sampled_from(["active", "superseded", "deleted", "gone"])),
                                   "readers": [ref("Agent", a) for a in sorted(draw(st.sets(st.sampled_from(AGENTS))))],
                                   "labels": []}})
        elif rt in ("Collection", "Namespace"):
            ents.append({"uid": {"type": rt, "id": rid}, "parents": [],
                         "attrs": {"tenant": ref("Tenant", draw(st.sampled_from(TENANTS)))}})
        else:
            ents.append({"uid": {"type": rt, "id": rid}, "attrs": {}, "parents": []})
        ctx: dict[str, Any] = {}
        if action == "redistribute":
            ctx = {"target_fleet": ref("Fleet", draw(st.sampled_from(FLEETS))), "target_scope": "fleet"}
        req = {"principal": {"type": pt, "id": pid}, "action": {"type": "Action", "id": action},
               "resource": {"type": rt, "id": rid}, "context": ctx}
        return req, ents

    return draw_case()
