"""The one visibility predicate (`sidecar.core.visibility`) against Cedar itself and against its translations.

- Soundness (docs/design.md §3, Inv-Scope and pushdown soundness): for every principal and row, cedarpy's
  ``Allow`` of ``read`` under the shipped policies implies the predicate admits the row, so fetching only admitted
  rows never loses one Cedar would serve. The entity store is built here, independently of the sidecar's code.
- The predicate is the baseline invariant ``invariants/baseline/inv-scope.cedar`` (evaluated by cedarpy) and
  docs/design.md §3's ``auth`` written out again here (same tenant; agent → owner, fleet → the
  reader's fleet or trust ≥ 2, tenant → anyone, restricted → a named reader; the tenant alone for tenant admins and
  mode ``tenant``; nothing for an operator).
- The planner's estimate (`sidecar.planner.admitted_count`) and the ledger's SQL (`sql_branches`, run on SQLite and
  PostgreSQL by ``tests/unit/test_visible_row_ids.py``) are derived from it; Chroma's ``where`` and Mem0's ``OR``
  are run against the real backends by ``tests/integration/mem0/test_visibility_backends.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cedarpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.visibility import Visibility, visibility
from sidecar.governance import Principal, Row
from sidecar.planner import admitted_count

POLICIES = Path(__file__).resolve().parents[2] / "policies"
SCHEMA = (POLICIES / "memwarden.cedarschema").read_text()
POLICY_SET = "\n".join(p.read_text() for p in sorted(POLICIES.glob("*.cedar")))
# The baseline invariant policy-check proves every read permit against: the predicate in Cedar's own language.
INV_SCOPE = (Path(__file__).resolve().parents[2] / "invariants" / "baseline" / "inv-scope.cedar").read_text()

TENANTS = ["t", "u"]
FLEETS = ["red", "blue"]
AGENTS = ["a", "b", "c"]
UIDS = [f"{t}/{f}/{a}" for t in TENANTS for f in FLEETS for a in AGENTS]
LABELS = ["pii", "finance"]
ROLES = ["auditor", "pii-reader"]

agents = st.builds(lambda t, f, a, trust, roles: Principal("agent", "k", t, f, a, trust, tuple(roles)),
                   st.sampled_from(TENANTS), st.sampled_from(FLEETS), st.sampled_from(AGENTS), st.integers(0, 3),
                   st.lists(st.sampled_from(ROLES), max_size=2, unique=True))
principals = st.one_of(agents, st.builds(lambda t: Principal("admin", "k1", t), st.sampled_from(TENANTS)),
                       st.just(Principal("operator", "k2", "")))


@st.composite
def rows(draw: Any) -> Row:
    owner = draw(st.sampled_from(UIDS))
    tenant, home, _ = owner.split("/")
    return Row("chroma", "c", f"r{draw(st.integers(0, 10**6))}", tenant, draw(st.sampled_from([home, *FLEETS])), owner,
               draw(st.sampled_from(["agent", "fleet", "tenant", "restricted"])), owner, 1, "active",
               readers=tuple(draw(st.lists(st.sampled_from([u for u in UIDS if u.startswith(tenant + "/")]),
                                           max_size=2, unique=True))),
               labels=tuple(draw(st.lists(st.sampled_from(LABELS), max_size=2, unique=True))))


def _ref(type_: str, id_: str) -> dict[str, Any]:
    return {"__entity": {"type": type_, "id": id_}}


def _agent(uid: str, trust: int, roles: tuple[str, ...] = ()) -> dict[str, Any]:
    tenant, fleet, _ = uid.split("/")
    return {"uid": {"type": "Agent", "id": uid}, "attrs": {
        "tenant": _ref("Tenant", tenant), "fleet": _ref("Fleet", f"{tenant}/{fleet}"), "trust": trust,
        "roles": list(roles)}, "parents": [{"type": "Fleet", "id": f"{tenant}/{fleet}"}]}


def cedar_reads(p: Principal, batch: list[Row], policies: str = POLICY_SET) -> list[bool]:
    """cedarpy's answer to ``read`` of each row of `batch` by `p` under `policies` (default: the shipped policy set;
    entities built here)."""
    entities: list[dict[str, Any]] = [{"uid": {"type": "Tenant", "id": t}, "attrs": {}, "parents": []} for t in TENANTS]
    entities += [{"uid": {"type": "Fleet", "id": f"{t}/{f}"}, "attrs": {"tenant": _ref("Tenant", t)},
                  "parents": [{"type": "Tenant", "id": t}]} for t in TENANTS for f in FLEETS]
    owners = {r.owner for r in batch}
    if p.kind == "agent":
        me = f"{p.tenant}/{p.fleet}/{p.agent}"
        entities.append(_agent(me, p.trust, p.roles))
        owners.discard(me)
        principal = {"type": "Agent", "id": me}
    elif p.kind == "admin":
        principal = {"type": "TenantAdmin", "id": f"{p.tenant}/admin/{p.key_id}"}
        entities.append({"uid": principal, "attrs": {"tenant": _ref("Tenant", p.tenant)}, "parents": []})
    else:
        principal = {"type": "Operator", "id": p.key_id}
        entities.append({"uid": principal, "attrs": {}, "parents": []})
    entities += [_agent(o, 1) for o in sorted(owners)]
    requests = []
    for i, r in enumerate(batch):
        entities.append({"uid": {"type": "Memory", "id": f"m{i}"}, "attrs": {
            "tenant": _ref("Tenant", r.tenant), "fleet": _ref("Fleet", f"{r.tenant}/{r.fleet}"),
            "owner": _ref("Agent", r.owner), "scope": r.scope, "status": r.status,
            "readers": [_ref("Agent", x) for x in r.readers], "labels": list(r.labels)},
            "parents": [{"type": "Fleet", "id": f"{r.tenant}/{r.fleet}"}]})
        requests.append({"principal": principal, "action": {"type": "Action", "id": "read"},
                         "resource": {"type": "Memory", "id": f"m{i}"}, "context": {}})
    results = cedarpy.is_authorized_batch(requests, policies, entities, SCHEMA)
    return [res.decision == cedarpy.Decision.Allow for res in results]


def auth(p: Principal, r: Row, mode: str) -> bool:
    """docs/design.md §3's ``auth`` (status aside), written out independently of `sidecar.core.visibility`."""
    if p.kind == "operator" or r.tenant != p.tenant:
        return False
    if mode == "tenant" or p.kind == "admin":
        return True
    me = f"{p.tenant}/{p.fleet}/{p.agent}"
    return (r.scope == "agent" and r.owner == me) or (r.scope == "fleet" and (r.fleet == p.fleet or p.trust >= 2)) \
        or r.scope == "tenant" or (r.scope == "restricted" and me in r.readers)


def admits(v: Visibility, r: Row) -> bool:
    return v.admits(r.tenant, r.scope, r.fleet, r.owner, r.readers)


@settings(max_examples=300, deadline=None)
@given(principals, st.lists(rows(), min_size=1, max_size=12))
def test_cedar_allow_implies_admitted_and_predicate_is_auth(p: Principal, batch: list[Row]) -> None:
    scope, tenant = visibility(p, "scope"), visibility(p, "tenant")
    for r, allowed, bound in zip(batch, cedar_reads(p, batch), cedar_reads(p, batch, INV_SCOPE)):
        assert admits(scope, r) == bound, (p, r)  # the baseline Inv-Scope, evaluated by Cedar
        assert admits(scope, r) == auth(p, r, "scope"), (p, r)
        assert admits(tenant, r) == auth(p, r, "tenant"), (p, r)
        if allowed:  # pushdown soundness: nothing Cedar serves is filtered out before it is asked
            assert admits(scope, r) and admits(tenant, r), (p, r)


def test_degeneracy_guard() -> None:
    """The corpus is not trivial: Cedar allows some reads and denies others, and the predicate refuses some rows
    (and admits no row of another tenant)."""
    batch = [Row("chroma", "c", f"r{i}", "t", fleet, owner, scope, owner, 1, "active", readers=readers, labels=labels)
             for i, (fleet, owner, scope, readers, labels) in enumerate(
                 (f, o, s, rd, lb) for f in FLEETS for o in ("t/red/a", "t/blue/b")
                 for s in ("agent", "fleet", "tenant", "restricted") for rd in ((), ("t/red/c",))
                 for lb in ((), ("pii",)))]
    outcomes = set()
    for p in (Principal("agent", "k", "t", "red", "c", trust) for trust in range(4)):
        v = visibility(p, "scope")
        for r, allowed in zip(batch, cedar_reads(p, batch)):
            outcomes.add((allowed, admits(v, r)))
    assert {(True, True), (False, False)} <= outcomes
    assert (True, False) not in outcomes


@given(principals, st.lists(rows(), max_size=20), st.booleans())
def test_planner_counts_are_the_predicate(p: Principal, batch: list[Row], wide: bool) -> None:
    """`admitted_count` over a collection's counts (its rows are of one tenant) is the number the predicate admits."""
    mine = [r for r in batch if r.tenant == (p.tenant or "t")]
    counts = [(r.scope, r.fleet, r.owner, r.readers, r.status, 1) for r in mine]
    v = visibility(p, "tenant" if wide else "scope")
    assert admitted_count(p, counts, wide) == sum(1 for r in mine if v.matches(r.scope, r.fleet, r.owner, r.readers))
    assert admitted_count(p, counts, wide) == sum(1 for r in mine if auth(p, r, "tenant" if wide else "scope"))


def test_reader_round_trip() -> None:
    for p in [Principal("agent", "k", "t", "red", "a", trust) for trust in range(4)] + [Principal("admin", "k", "t")]:
        for mode in ("scope", "tenant"):
            v = visibility(p, mode)
            assert Visibility.of_reader(v.tenant, v.reader) == v
