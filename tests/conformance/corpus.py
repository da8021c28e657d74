"""The conformance corpus, as data: a tenant's agents, the rows they write (seeds), and cedarpy as the oracle.

Every backend is driven through the same cases (tests/conformance/test_conformance.py); what a principal may read,
update, delete or write is whatever cedarpy answers under the shipped policies for an entity store built here,
independently of the sidecar's code (STYLE.md, "Conformance"). Nothing here is hand-written as an expected set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy

POLICIES = Path(__file__).resolve().parents[2] / "policies"
SCHEMA = (POLICIES / "memwarden.cedarschema").read_text()
POLICY_SET = "\n".join(p.read_text() for p in sorted(POLICIES.glob("*.cedar")))

# (fleet, agent, trust) of the tenant's agents; "admin" is the tenant admin.
AGENTS = [("red", "r0", 0), ("red", "r1", 1), ("red", "r2", 2), ("red", "r3", 3), ("blue", "b1", 1), ("blue", "b2", 2)]
PRINCIPALS = [a for _, a, _ in AGENTS] + ["admin"]
FLEET = {agent: fleet for fleet, agent, _ in AGENTS}
TEXT = {"alpha": "hiking in the mountains on the weekend", "beta": "the quarterly budget review is on friday"}


@dataclass(frozen=True)
class Seed:
    """A row its `writer` writes through the sidecar: the requested `scope`, `fleet` (None: the writer's own; another
    needs trust 3) and `readers` (``fleet/agent``); `topic` is plain metadata a client filter may select."""

    row_id: str
    writer: str
    scope: str
    fleet: str | None = None
    readers: tuple[str, ...] = ()
    topic: str = "alpha"

    def requested(self) -> dict[str, Any]:
        """The governed metadata a client sends to request this seed's governance."""
        meta: dict[str, Any] = {"mw_scope": self.scope}
        if self.fleet:
            meta["mw_fleet"] = self.fleet
        if self.readers:
            meta["mw_readers"] = ",".join(self.readers)
        return meta


SEEDS = [
    Seed("r1-agent", "r1", "agent"), Seed("r1-fleet", "r1", "fleet", topic="beta"),
    Seed("r1-tenant", "r1", "tenant"), Seed("r1-restricted", "r1", "restricted", readers=("red/r0", "blue/b2"), topic="beta"),
    Seed("r3-agent", "r3", "agent", topic="beta"), Seed("r3-blue-fleet", "r3", "fleet", fleet="blue"),
    Seed("r3-restricted", "r3", "restricted", readers=("red/r3",)),
    Seed("b1-agent", "b1", "agent"), Seed("b1-fleet", "b1", "fleet", topic="beta"), Seed("b1-tenant", "b1", "tenant"),
    Seed("b1-restricted", "b1", "restricted", readers=("red/r2",)),
]
SEED_IDS = [s.row_id for s in SEEDS]
UNGOVERNED = "ungoverned"  # a row written straight into the backend with forged governance metadata

# New rows the write cases ask for: (requested scope, requested fleet or None, readers).
WRITES = [("agent", None, ()), ("fleet", None, ()), ("tenant", None, ()), ("restricted", None, ("blue/b1",)),
          ("fleet", "blue", ()), ("fleet", "red", ())]


def _ref(type_: str, id_: str) -> dict[str, Any]:
    return {"__entity": {"type": type_, "id": id_}}


def _principal(tenant: str, principal: str) -> dict[str, str]:
    if principal == "admin":
        return {"type": "TenantAdmin", "id": f"{tenant}/admin"}
    return {"type": "Agent", "id": f"{tenant}/{FLEET[principal]}/{principal}"}


def _entities(tenant: str) -> list[dict[str, Any]]:
    entities: list[dict[str, Any]] = [{"uid": {"type": "Tenant", "id": tenant}, "attrs": {}, "parents": []}]
    for fleet in ("red", "blue"):
        entities.append({"uid": {"type": "Fleet", "id": f"{tenant}/{fleet}"}, "attrs": {"tenant": _ref("Tenant", tenant)},
                         "parents": [{"type": "Tenant", "id": tenant}]})
    for fleet, agent, trust in AGENTS:
        entities.append({"uid": {"type": "Agent", "id": f"{tenant}/{fleet}/{agent}"}, "attrs": {
            "tenant": _ref("Tenant", tenant), "fleet": _ref("Fleet", f"{tenant}/{fleet}"), "trust": trust, "roles": []},
            "parents": [{"type": "Fleet", "id": f"{tenant}/{fleet}"}]})
    entities.append({"uid": {"type": "TenantAdmin", "id": f"{tenant}/admin"}, "attrs": {"tenant": _ref("Tenant", tenant)},
                     "parents": []})
    return entities


def _row(tenant: str, row_id: str, writer: str, scope: str, fleet: str | None, readers: tuple[str, ...]) -> dict[str, Any]:
    home = FLEET[writer]
    fleet = fleet or home
    return {"uid": {"type": "Memory", "id": row_id}, "attrs": {
        "tenant": _ref("Tenant", tenant), "fleet": _ref("Fleet", f"{tenant}/{fleet}"),
        "owner": _ref("Agent", f"{tenant}/{home}/{writer}"), "scope": scope, "status": "active",
        "readers": [_ref("Agent", f"{tenant}/{r}") for r in readers], "labels": []},
        "parents": [{"type": "Fleet", "id": f"{tenant}/{fleet}"}]}


def _allowed(requests: list[dict[str, Any]], entities: list[dict[str, Any]]) -> list[bool]:
    results = cedarpy.is_authorized_batch(requests, POLICY_SET, entities, SCHEMA)
    return [r.decision == cedarpy.Decision.Allow for r in results]


def oracle(tenant: str, principal: str, action: str) -> set[str]:
    """Seed ids for which cedarpy answers Allow to (`principal`, `action`, the seed as the ledger holds it)."""
    entities = _entities(tenant) + [_row(tenant, s.row_id, s.writer, s.scope, s.fleet, s.readers) for s in SEEDS]
    requests = [{"principal": _principal(tenant, principal), "action": {"type": "Action", "id": action},
                 "resource": {"type": "Memory", "id": s.row_id}, "context": {}} for s in SEEDS]
    return {s.row_id for s, ok in zip(SEEDS, _allowed(requests, entities)) if ok}


def write_oracle(tenant: str, principal: str) -> list[bool]:
    """For each of `WRITES`: whether cedarpy allows `principal` to ``write`` it as a new row it owns. A tenant
    admin owns no rows: its writes are refused before Cedar is asked (the answer here is False for it)."""
    if principal == "admin":
        return [False] * len(WRITES)
    entities = _entities(tenant) + [_row(tenant, f"new{i}", principal, scope, fleet, readers)
                                    for i, (scope, fleet, readers) in enumerate(WRITES)]
    requests = [{"principal": _principal(tenant, principal), "action": {"type": "Action", "id": "write"},
                 "resource": {"type": "Memory", "id": f"new{i}"}, "context": {}} for i in range(len(WRITES))]
    return _allowed(requests, entities)


def change_outcome(tenant: str, principal: str, action: str) -> dict[str, str]:
    """The one rule for a change (``update`` or ``delete``) of a seed by `principal`, on every backend: ``ok`` when
    Cedar allows the action (an update also needs the row readable: it is read back; a delete is Cedar's alone, so an
    owner may delete its restricted row it cannot read); else ``forbidden`` (403) when the principal may read the row;
    else ``not_found``: a row it may not read is answered exactly as a row that does not exist."""
    allowed, readable = oracle(tenant, principal, action), oracle(tenant, principal, "read")
    if action == "update":
        allowed &= readable
    return {s: "ok" if s in allowed else "forbidden" if s in readable else "not_found" for s in SEED_IDS}


def rewrite_refused(tenant: str, principal: str, writer: str, scope: str) -> bool:
    """The forgotten-content rule: whether `principal`'s write of the text of a deleted row (written by `writer`
    with `scope`, in `writer`'s fleet) is refused with 409 — when cedarpy lets it read that row as it was (active)
    and it is of the row's lineage (its owner, an agent of its fleet, the tenant admin), and no policy lets it
    ``reassert`` the row. Only for principals that may write a new row of their own (`write_oracle`)."""
    if principal == "admin":
        return True
    entities = _entities(tenant) + [_row(tenant, "gone", writer, scope, None, ())]
    requests = [{"principal": _principal(tenant, principal), "action": {"type": "Action", "id": action},
                 "resource": {"type": "Memory", "id": "gone"}, "context": {}} for action in ("read", "reassert")]
    read, reassert = _allowed(requests, entities)
    return read and not reassert and (principal == writer or FLEET[principal] == FLEET[writer])
