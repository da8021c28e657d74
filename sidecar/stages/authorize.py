"""Stages 4 and 7 — authorize the request, and the row-level decisions used by the filter stage.

Every decision goes through the PDP (`sidecar.policy.PolicyEngine`); only ``Allow`` passes.
Row decisions are one batched Cedar call per response. Rows the ledger does not know, write
reservations (``pending``) and ``deleted`` rows are dropped before Cedar is asked; ``superseded``
rows are dropped unless the caller asked for them.
"""

from __future__ import annotations

from typing import Any, Callable

import structlog

from sidecar.errors import Forbidden
from sidecar.exchange import Exchange
from sidecar.governance import Row, deployment_entity, fleet_entity, row_entities
from sidecar.ledger import Ledger
from sidecar.policy import CedarRequest, Decision, PolicyEngine
from sidecar.stages.canonicalize import well_formed

MAX_ROW_DEPTH = 32


def well_formed_rows(ex: Exchange, backend: str, rows: list[Any], id_of: Callable[[Any], Any],
                     max_depth: int = MAX_ROW_DEPTH) -> list[Any]:
    """The rows of a backend answer that can be served: an object with a non-empty string id (`id_of`),
    nested at most `max_depth` levels, with finite numbers and no lone surrogates. Every other row is
    dropped, counted in ``ex.rows_malformed`` (``memwarden_rows_total{result="malformed"}``) and logged
    by id (never content), so one malformed row never fails a response for the rows it does not concern."""
    good: list[Any] = []
    bad: list[str] = []
    for row in rows:
        rid = id_of(row) if isinstance(row, dict) else None
        if isinstance(rid, str) and rid and well_formed(row, max_depth):
            good.append(row)
        else:
            bad.append(rid[:200] if isinstance(rid, str) else f"<{type(rid).__name__}>")
    if bad:
        ex.rows_malformed += len(bad)
        structlog.get_logger("memwarden.filter").warning(
            "malformed_backend_rows", request_id=ex.request_id, backend=backend, count=len(bad), row_ids=bad[:20])
    return good


class Authorizer:
    """Builds Cedar requests and entity stores from the ledger and asks the PDP."""

    def __init__(self, engine: PolicyEngine, ledger: Ledger) -> None:
        self.engine = engine
        self.ledger = ledger

    def require(self, ex: Exchange, action: str, resource: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> None:
        """Request-level decision on `resource` (a Cedar JSON entity). Raises `Forbidden` unless Allow."""
        assert ex.principal is not None
        uid = resource["uid"]
        ex.action, ex.resource = action, f'{uid["type"]}::{uid["id"]}'
        entities = ex.principal.entities() + [resource] + list(extra or [])
        decision = self.engine.decide([CedarRequest(ex.principal.uid, action, (uid["type"], uid["id"]))], entities)[0]
        ex.policies.update(decision.policies)
        if not decision.allowed:
            ex.decision = "deny"
            raise Forbidden(f"{action} is not permitted")
        ex.decision = "allow"

    def require_deployment(self, ex: Exchange, action: str, deployment: str) -> None:
        """Decision on a deployment-wide action (``configure``, ``reset``, ``manage_tenants``) on
        ``Deployment::"<deployment>"``; the default policies permit these to operators only."""
        self.require(ex, action, deployment_entity(deployment))

    def decide_rows(self, ex: Exchange, action: str, rows: list[Row], contexts: list[dict[str, Any]] | None = None) -> list[Decision]:
        """One batched decision of `action` per row (in order). `contexts` per row, optional."""
        assert ex.principal is not None
        if not rows:
            return []
        owners = self.ledger.agent_entities({r.owner for r in rows})
        entities = row_entities(ex.principal, rows, owners)
        # Fleets named in a context (redistribute's target_fleet) with their tenant, so that policies
        # can test ``context.target_fleet in principal.tenant``; fleet ids are tenant-qualified.
        known = {(e["uid"]["type"], e["uid"]["id"]) for e in entities}
        for ctx in contexts or []:
            for value in ctx.values():
                target = value.get("__entity") if isinstance(value, dict) else None
                if isinstance(target, dict) and target.get("type") == "Fleet" and ("Fleet", target.get("id")) not in known:
                    tenant, _, fleet = str(target.get("id")).partition("/")
                    entities.append(fleet_entity(tenant, fleet))
                    known.add(("Fleet", str(target.get("id"))))
        requests = [
            CedarRequest(ex.principal.uid, action, r.uid, contexts[i] if contexts else None) for i, r in enumerate(rows)
        ]
        decisions = self.engine.decide(requests, entities)
        for d in decisions:
            ex.policies.update(d.policies)
        return decisions

    def readable(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str],
                 include_superseded: bool = False, as_of: int | None = None) -> set[str]:
        """The subset of `row_ids` the principal may read now (ledger lookup + one batched ``read``)."""
        return set(self.readable_rows(ex, backend, collection_id, row_ids, include_superseded, as_of))

    def readable_rows(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str],
                      include_superseded: bool = False, as_of: int | None = None) -> dict[str, Row]:
        """Like `readable`, returning the ledger rows. By default only ``active`` rows are servable;
        `include_superseded` adds superseded ones; `as_of` (UTC µs) serves the rows that were current
        then (created by then and not yet superseded). Deleted and pending rows are never servable."""
        if not row_ids:
            return {}
        known = self.ledger.get_rows(backend, collection_id, row_ids)
        candidates = [known[i] for i in dict.fromkeys(row_ids) if i in known and servable(known[i], include_superseded, as_of)]
        decisions = self.decide_rows(ex, "read", candidates)
        allowed = {row.row_id: row for row, d in zip(candidates, decisions) if d.allowed}
        unique = len(set(row_ids))
        ex.rows_allowed += len(allowed)
        ex.rows_denied += unique - len(allowed)
        return allowed


def servable(row: Row, include_superseded: bool = False, as_of: int | None = None) -> bool:
    """Whether a ledger row may be served at all (before Cedar): see `Authorizer.readable_rows`."""
    if row.status not in ("active", "superseded"):
        return False
    if as_of is not None:
        return row.created_at <= as_of and (row.superseded_at is None or row.superseded_at > as_of)
    return row.status == "active" or include_superseded
