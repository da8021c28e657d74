"""Stages 4 and 7 — authorize the request, and the row-level decisions used by the filter stage.

Every decision goes through the PDP (`sidecar.policy.PolicyEngine`); only ``Allow`` passes.
Row decisions are one batched Cedar call per response. Rows the ledger does not know, write
reservations (``pending``) and ``deleted`` rows are dropped before Cedar is asked; ``superseded``
rows are dropped unless the caller asked for them.
"""

from __future__ import annotations

from typing import Any

from sidecar.errors import Forbidden
from sidecar.exchange import Exchange
from sidecar.governance import Row, row_entities
from sidecar.ledger import Ledger
from sidecar.policy import CedarRequest, Decision, PolicyEngine


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

    def decide_rows(self, ex: Exchange, action: str, rows: list[Row], contexts: list[dict[str, Any]] | None = None) -> list[Decision]:
        """One batched decision of `action` per row (in order). `contexts` per row, optional."""
        assert ex.principal is not None
        if not rows:
            return []
        owners = self.ledger.agent_entities({r.owner for r in rows})
        entities = row_entities(ex.principal, rows, owners)
        requests = [
            CedarRequest(ex.principal.uid, action, r.uid, contexts[i] if contexts else None) for i, r in enumerate(rows)
        ]
        decisions = self.engine.decide(requests, entities)
        for d in decisions:
            ex.policies.update(d.policies)
        return decisions

    def readable(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str],
                 include_superseded: bool = False) -> set[str]:
        """The subset of `row_ids` the principal may read now (ledger lookup + one batched ``read``)."""
        if not row_ids:
            return set()
        known = self.ledger.get_rows(backend, collection_id, row_ids)
        servable = ("active", "superseded") if include_superseded else ("active",)
        candidates = [known[i] for i in dict.fromkeys(row_ids) if i in known and known[i].status in servable]
        decisions = self.decide_rows(ex, "read", candidates)
        allowed = {row.row_id for row, d in zip(candidates, decisions) if d.allowed}
        unique = len(set(row_ids))
        ex.rows_allowed += len(allowed)
        ex.rows_denied += unique - len(allowed)
        return allowed
