"""Cedar per governance class (`invariants.classes`, `Authorizer.decide_rows`): the analysis accepts the
default policy set and refuses sets that can tell rows apart by more than their class key; on
generated rows and principals, per-class decisions equal cedarpy's per-row decisions (the policy sets
of the repository and the invariant fixtures); class answers are kept per policy set only."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from invariants.classes import analyse
from sidecar.exchange import Exchange
from sidecar.governance import Principal, Row
from sidecar.ledger import SQLiteLedger
from sidecar.policy import CedarRequest, Decision, PolicyEngine
from sidecar.stages.authorize import Authorizer

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = (ROOT / "policies" / "memwarden.cedarschema").read_text()
DEFAULT = (ROOT / "policies" / "default.cedar").read_text()
FIXTURES = sorted((ROOT / "tests" / "invariants" / "fixtures").glob("*/policies.cedar"))


def test_default_policies_decide_per_class() -> None:
    a = analyse(DEFAULT, SCHEMA)
    assert a.sound and {"owner", "scope", "status", "tenant"} <= a.attributes


@pytest.mark.parametrize("policy,why", [
    ('permit(principal, action, resource == Memory::"chroma:c:r1");', "constrains the resource"),
    ('permit(principal, action, resource in Memory::"chroma:c:r1");', "constrains the resource"),
    ('permit(principal, action, resource) when { resource == Memory::"chroma:c:r1" };', "uses the resource itself"),
    ('permit(principal, action, resource) when { [Memory::"chroma:c:r1"].contains(resource) };', "names a Memory entity"),
    ('permit(principal, action, resource) when { [principal].contains(resource) };', "uses the resource itself"),
    ('permit(principal, action, resource) when { principal.tenant == resource.tenant && '
     'Memory::"chroma:c:r1".scope == "agent" };', "names a Memory entity"),
    ('permit(principal, action, resource) when { resource in Memory::"chroma:c:r1" };', "names a Memory entity"),
    ('permit(principal, action, resource == ?resource);', "template"),
])
def test_policies_that_tell_rows_apart_are_decided_per_row(policy: str, why: str) -> None:
    a = analyse(policy, SCHEMA)
    assert not a.sound and why in a.reason


def test_a_schema_with_memory_typed_attributes_is_decided_per_row() -> None:
    schema = SCHEMA.replace("entity Tenant;", "entity Tenant { pinned: Set<Memory> };")
    a = analyse("permit(principal, action, resource) when { resource.scope == \"tenant\" };", schema)
    assert not a.sound and "Tenant.pinned" in a.reason


def test_attributes_read_through_the_owner_and_has() -> None:
    a = analyse('permit(principal, action, resource) when { resource.owner.trust > 1 && resource has subject '
                '&& resource in principal.fleet && resource is Memory };', SCHEMA)
    assert a.sound and a.attributes == {"owner", "subject"}


@dataclass
class Handle:
    """The part of `PolicyHandle` the Authorizer uses, around one engine (counts Cedar calls)."""

    engine: PolicyEngine
    shadow: bool = False
    calls: list[int] = field(default_factory=list)

    @property
    def current(self) -> Any:
        return self

    @property
    def sha256(self) -> str:
        return "test"

    def decide(self, requests: list[CedarRequest], entities: list[dict[str, Any]], ps: Any = None) -> list[Decision]:
        self.calls.append(len(requests))
        return self.engine.decide(requests, entities)


AGENTS = [("t", f, a, trust, roles) for f in ("red", "blue") for a, trust, roles in
          (("a0", 0, ()), ("a1", 1, ()), ("a2", 2, ("auditor",)), ("a3", 3, ()))] + [("u", "red", "x1", 1, ())]


def ledger_with_agents() -> SQLiteLedger:
    ledger = SQLiteLedger(":memory:")
    for tenant, fleet, agent, trust, _ in AGENTS:
        ledger.create_key("agent", tenant, fleet, agent, trust)
    return ledger


def generated_rows(rnd: random.Random, n: int) -> list[Row]:
    owners = [f"{t}/{f}/{a}" for t, f, a, _, _ in AGENTS] + ["t/red/ghost"]  # ghost: unknown to the ledger
    rows = []
    for i in range(n):
        owner = rnd.choice(owners)
        tenant, fleet, _ = owner.split("/")
        if rnd.random() < 0.1:
            fleet = rnd.choice(["red", "blue", "green"])
        triple = rnd.random() < 0.3
        rows.append(Row("chroma", "c", f"r{i}", tenant, fleet, owner, rnd.choice(["agent", "fleet", "tenant", "restricted"]),
                        owner, 1, status=rnd.choice(["active", "active", "superseded", "deleted"]),
                        readers=tuple(sorted(rnd.sample(owners[:9], rnd.randint(0, 3)))),
                        labels=tuple(rnd.sample(["x", "y"], rnd.randint(0, 1))),
                        subject="s" if triple else None, predicate=rnd.choice(["p", "q"]) if triple else None,
                        object=str(rnd.randint(0, 3)) if triple else None))
    return rows


def principals() -> list[Principal]:
    out = [Principal("agent", f"k{i}", t, f, a, trust) for i, (t, f, a, trust, _) in enumerate(AGENTS)]
    return out + [Principal("admin", "kadmin", "t"), Principal("admin", "kadmin2", "u")]


# Reads through the owner to its fleet's tenant: the owner's fleet entity must be in every batch's store,
# or a row's decision would depend on whether another row of that fleet shares its batch.
OWNER_CHAIN = DEFAULT + """
@id("owner-chain")
permit(principal is Agent, action == Action::"read", resource)
  when { resource.owner.fleet.tenant == principal.tenant && resource.owner.trust >= 2 && resource.scope == "fleet" };
"""


@pytest.mark.parametrize("source", ["default", "owner-chain"] + [f.parent.name for f in FIXTURES])
def test_per_class_decisions_equal_per_row_cedar(source: str) -> None:
    text = {"default": DEFAULT, "owner-chain": OWNER_CHAIN}.get(source) or \
        (ROOT / "tests" / "invariants" / "fixtures" / source / "policies.cedar").read_text()
    analysis = analyse(text, SCHEMA)
    assert analysis.sound
    engine = PolicyEngine(text, SCHEMA, [Path("p.cedar")], Path("s.cedarschema"))
    per_row = PolicyEngine(text, SCHEMA, [Path("p.cedar")], Path("s.cedarschema"))
    engine.row_classes = analysis.attributes
    ledger = ledger_with_agents()
    by_class, by_row = Authorizer(Handle(engine), ledger), Authorizer(Handle(per_row), ledger)  # type: ignore[arg-type]
    rnd = random.Random(source)
    outcomes = set()
    for _ in range(2):
        rows = generated_rows(rnd, 40)
        for p in principals():
            for action in ("read", "write", "update", "delete", "supersede"):
                got = by_class.decide_rows(Exchange("POST", "/", principal=p), action, rows)
                want = by_row.decide_rows(Exchange("POST", "/", principal=p), action, rows)
                assert [d.allowed for d in got] == [d.allowed for d in want], (source, p, action)
                assert [d.reason for d in got] == [d.reason for d in want]
                assert [set(d.policies) for d in got] == [set(d.policies) for d in want]
                outcomes.update(d.allowed for d in want)
    assert outcomes == {True, False}  # degeneracy guard


def test_class_answers_are_kept_per_policy_set_and_recorded_per_row() -> None:
    analysis = analyse(DEFAULT, SCHEMA)
    engine = PolicyEngine(DEFAULT, SCHEMA, [Path("p.cedar")], Path("s.cedarschema"))
    engine.row_classes = analysis.attributes
    handle = Handle(engine)
    authz = Authorizer(handle, ledger_with_agents())  # type: ignore[arg-type]
    p = Principal("agent", "k1", "t", "red", "a1", 1)
    rows = [Row("chroma", "c", f"r{i}", "t", "red", "t/red/a1", "tenant", "t/red/a1", 1) for i in range(50)]
    rows += [Row("chroma", "c", f"o{i}", "t", "blue", "t/blue/a1", "agent", "t/blue/a1", 1) for i in range(50)]
    ex = Exchange("POST", "/", principal=p)
    got = authz.readable(ex, "chroma", "c", [])  # no rows, no call
    assert got == set() and handle.calls == []
    first = authz.decide_rows(ex, "read", rows)
    assert handle.calls == [2]  # two classes, one batched call
    assert [d.allowed for d in first] == [True] * 50 + [False] * 50
    assert len(ex.deny_policies) >= 0 and ex.reason  # the denial's reason is recorded
    again = authz.decide_rows(Exchange("POST", "/", principal=p), "read", rows)
    assert handle.calls == [2] and [d.allowed for d in again] == [d.allowed for d in first]  # from the class memo
    other = Principal("agent", "k2", "t", "blue", "a1", 1)
    authz.decide_rows(Exchange("POST", "/", principal=other), "read", rows)
    assert handle.calls == [2, 2]  # answers are per principal
    fresh = PolicyEngine(DEFAULT, SCHEMA, [Path("p.cedar")], Path("s.cedarschema"))  # a reload: a new engine
    fresh.row_classes = analysis.attributes
    handle.engine = fresh
    authz.decide_rows(Exchange("POST", "/", principal=p), "read", rows)
    assert handle.calls == [2, 2, 2]


def test_a_class_answer_does_not_depend_on_the_batch_it_was_computed_in() -> None:
    """A row's decision reads its owner's fleet (OWNER_CHAIN): that fleet is in the store whatever other
    rows share the batch, so an answer kept from one batch holds in another."""
    analysis = analyse(OWNER_CHAIN, SCHEMA)
    engine = PolicyEngine(OWNER_CHAIN, SCHEMA, [Path("p.cedar")], Path("s.cedarschema"))
    per_row = PolicyEngine(OWNER_CHAIN, SCHEMA, [Path("p.cedar")], Path("s.cedarschema"))
    engine.row_classes = analysis.attributes
    ledger = ledger_with_agents()
    by_class, by_row = Authorizer(Handle(engine), ledger), Authorizer(Handle(per_row), ledger)  # type: ignore[arg-type]
    p = Principal("agent", "k1", "t", "green", "g", 1)  # a fleet no row is in
    moved = Row("chroma", "c", "m", "t", "red", "t/blue/a2", "fleet", "t/blue/a2", 1)  # owner of fleet blue, trust 2
    blue = Row("chroma", "c", "b", "t", "blue", "t/blue/a0", "agent", "t/blue/a0", 1)
    with_blue = by_class.decide_rows(Exchange("POST", "/", principal=p), "read", [moved, blue])
    alone = by_class.decide_rows(Exchange("POST", "/", principal=p), "read", [moved])  # from the class memo
    want = by_row.decide_rows(Exchange("POST", "/", principal=p), "read", [moved])
    assert with_blue[0].allowed and alone[0].allowed == want[0].allowed is True
