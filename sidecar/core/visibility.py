"""The one visibility predicate: which rows of its tenant a principal's reads may reach (docs/design.md §2.7).

It is docs/design.md §3's reference predicate ``auth`` over a row's governance columns — the predicate the
baseline invariant Inv-Scope bounds every ``permit`` of ``read`` by — written once, as data:

    tenant = P.tenant  ∧  ( scope = "agent"      ∧ owner = P
                          ∨ scope = "fleet"      ∧ (fleet = P.fleet ∨ P.trust ≥ 2)
                          ∨ scope = "tenant"
                          ∨ scope = "restricted" ∧ P ∈ readers )

A tenant admin's predicate, and every principal's in mode ``tenant`` (shadow mode, or a policy set wider than
``auth``), is the tenant conjunct alone. Row status is not part of it: which statuses are servable is the
ledger's (`sidecar.stages.authorize.servable`).

Everything that filters by visibility is derived from `Visibility`: the Python evaluation (`Visibility.admits`,
the planner's estimate), the ledger's SQL (`sql_branches`), and each backend profile's filter translator (Chroma's
``where``, Mem0's ``filters``). ``tests/property/test_visibility.py`` checks every translation against
`Visibility.admits` and against cedarpy on the shipped policies. The predicate only chooses what is *fetched*:
every row served is still decided by Cedar on its ledger governance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from sidecar.governance import SCOPES, Principal


@dataclass(frozen=True, slots=True)
class ScopeClause:
    """One disjunct: rows of `scope`, narrowed by at most one equality.

    `owner` (scope ``agent``): the row's owner must be this agent uid. `fleet` (scope ``fleet``): the row's fleet
    must be this fleet; None admits every fleet (trust ≥ 2). `reader` (scope ``restricted``): this agent uid must
    be one of the row's readers."""

    scope: str
    owner: str | None = None
    fleet: str | None = None
    reader: str | None = None


@dataclass(frozen=True, slots=True)
class Visibility:
    """The rows of `tenant` a principal's reads may reach: those matching any of `clauses`; every row of the
    tenant when `clauses` is None."""

    tenant: str
    clauses: tuple[ScopeClause, ...] | None  # () admits nothing (an operator's)

    def admits(self, tenant: str, scope: str, fleet: str | None, owner: str, readers: Sequence[str]) -> bool:
        """Whether a row with these governance columns matches (the reference evaluation)."""
        return tenant == self.tenant and self.matches(scope, fleet, owner, readers)

    def matches(self, scope: str, fleet: str | None, owner: str, readers: Sequence[str]) -> bool:
        """Whether a row of this tenant with these governance columns matches: the disjunction alone."""
        if self.clauses is None:
            return True
        for c in self.clauses:
            if c.scope != scope:
                continue
            if c.owner is not None and owner != c.owner:
                continue
            if c.fleet is not None and fleet != c.fleet:
                continue
            if c.reader is not None and c.reader not in readers:
                continue
            return True
        return False

    @property
    def reader(self) -> tuple[str, str | None, bool] | None:
        """The reader side as the ledger's ``visible_row_ids`` takes it: None for the tenant alone, else
        (agent uid, fleet, whether every fleet's fleet rows are admitted)."""
        if not self.clauses:  # the tenant alone; or an operator's, whose tenant "" is no row's
            return None
        by_scope = {c.scope: c for c in self.clauses}
        agent = by_scope["agent"].owner
        fleet = by_scope["fleet"].fleet
        assert agent is not None
        return agent, fleet, fleet is None


    @classmethod
    def of_reader(cls, tenant: str, reader: tuple[str, str | None, bool] | None) -> "Visibility":
        """The predicate whose `reader` is `reader` (the inverse of `reader`)."""
        if reader is None:
            return cls(tenant, None)
        agent, fleet, any_fleet = reader
        return cls(tenant, _clauses(agent, None if any_fleet else fleet))


def _clauses(agent: str, fleet: str | None) -> tuple[ScopeClause, ...]:
    return (ScopeClause("agent", owner=agent), ScopeClause("fleet", fleet=fleet), ScopeClause("tenant"),
            ScopeClause("restricted", reader=agent))


def visibility(p: Principal, mode: str) -> Visibility:
    """The predicate of principal `p` under pushdown `mode` (``scope``: docs/design.md §3's ``auth``; ``tenant``:
    the tenant alone). Tenant admins always get the tenant alone; an operator has no tenant, so its predicate has
    no disjunct and admits no row (its tenant ``""`` is no row's). Raises `ValueError` for another mode."""
    if mode not in ("scope", "tenant"):
        raise ValueError(f"unknown pushdown mode {mode!r}")
    if p.kind == "operator":
        return Visibility("", ())  # no tenant: no row
    if mode == "tenant" or p.kind != "agent":
        return Visibility(p.tenant, None)
    return Visibility(p.tenant, _clauses(p.uid[1], None if p.trust >= 2 else p.fleet))


def sql_branches(v: Visibility, ph: str, reads_json: str) -> list[tuple[str, tuple[Any, ...]]]:
    """The predicate as SQL conditions over the ledger's ``rows`` columns, one per disjunct (the scopes exclude
    each other, so a ``UNION ALL`` of the branches lists no row twice; each is one index range): a list of
    (condition, parameters). `ph` is the dialect's placeholder; `reads_json` its test that the JSON array column
    ``readers`` holds the string bound to the ``{ph}`` it contains. The tenant conjunct is the caller's (it is part
    of every index)."""
    if v.clauses is None:
        return [("TRUE", ())]
    if not v.clauses:
        return [("FALSE", ())]
    out: list[tuple[str, tuple[Any, ...]]] = []
    for c in v.clauses:
        assert c.scope in SCOPES  # literals of the governance model, never input: safe in the SQL text
        cond: str = f"scope = '{c.scope}'"
        args: tuple[Any, ...] = ()
        if c.owner is not None:
            cond, args = f"{cond} AND owner = {ph}", (c.owner,)
        if c.fleet is not None:
            cond, args = f"{cond} AND fleet = {ph}", (c.fleet,)
        if c.reader is not None:
            cond, args = f"{cond} AND {reads_json}", (c.reader,)
        out.append((cond, args))
    return out
