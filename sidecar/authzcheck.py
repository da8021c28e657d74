"""``memwarden authz check``: one ad-hoc authorization question, answered as the sidecar would, offline.

The policy set is admitted through the same gate as the sidecar's (`sidecar.policy_reload.admit`, so a
set the sidecar would refuse answers nothing) and the principal, rows, owners and collections are read
from the same ledger; the Cedar requests and entity stores are built by the same code as the
sidecar's (`sidecar.stages.authorize.Authorizer`). The backend is never called.

A check (the JSON request form, cf. Cerbos ``CheckResources`` / ``opa eval --input``)::

    {"key_id": "<key id>",
     "resources": [{"row": "<row id>", "collection": "<collection uuid>",     # a row (Memory)
                    "actions": ["read", "update"],
                    "context": {"target_fleet": "blue", "target_scope": "tenant"},  # redistribute
                    "include_superseded": false},
                   {"collection": "<uuid>", "actions": ["search", "list"]},      # a collection
                   {"database": "default_database", "tenant": "acme", "actions": ["admin"]}]}  # a namespace

``collection`` is the Chroma collection UUID (Mem0: omitted, the deployment). ``write`` asks about a new
row: ``row`` must not exist; ``scope`` (default ``fleet``), ``fleet``, ``readers`` (``fleet/agent``
list) and ``labels`` (a list of label names) describe it. The principal's roles are its key's. The answer: ``{"policy_sha256", "principal", "results": [{"action", "resource",
"decision", "reason", "policies", "errors", "request", "entities"}]}`` — ``request`` and ``entities`` are
exactly what Cedar saw (none when the sidecar decides before asking Cedar: an unknown, deleted or
pending row, a superseded row without ``include_superseded``, a collection of another tenant, an
unknown or revoked key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.config import Settings
from sidecar.governance import Principal, Row, agent_id, collection_entity, namespace_entity, ref
from sidecar.ledger import Ledger, now_us
from sidecar.ledger.base import check_names
from sidecar.metrics import Metrics
from sidecar.policy import CedarRequest
from sidecar.policy_reload import PolicyHandle
from sidecar.stages.authorize import DELETED_ROW, SUPERSEDED_ROW, UNKNOWN_ROW, Authorizer

ROW_ACTIONS = ("read", "write", "update", "delete", "redistribute")
REQUEST_ACTIONS = ("search", "list", "delete_bulk", "admin", "create_collection")  # create_collection: on a namespace


class CheckError(ValueError):
    """A malformed check (the message names the field)."""


@dataclass
class Answer:
    action: str
    resource: str
    decision: str
    reason: str | None = None
    policies: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    request: dict[str, Any] | None = None
    entities: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "resource": self.resource, "decision": self.decision, "reason": self.reason,
                "policies": list(self.policies), "errors": list(self.errors), "request": self.request,
                "entities": self.entities}


class Checker:
    """Answers checks against one admitted policy set and one ledger (see the module docstring)."""

    def __init__(self, settings: Settings, ledger: Ledger) -> None:
        self.settings = settings
        self.ledger = ledger
        self.policy = PolicyHandle(settings.policies_dir, Metrics(), invariants_dir=settings.invariants_dir,
                                   check_timeout_s=settings.policy_check_timeout_s)
        self.authz = Authorizer(self.policy, ledger)
        self.backend = settings.backend

    def principal(self, key_id: str) -> Principal | None:
        """The active key's principal, as authentication would make it; None if unknown or revoked."""
        for k in self.ledger.list_keys():
            if k.key_id == key_id and k.revoked_at is None:
                return k.principal()
        return None

    def _ask(self, action: str, resource: str, requests: list[CedarRequest], entities: list[dict[str, Any]]) -> Answer:
        d = self.policy.decide(requests, entities)[0]
        return Answer(action, resource, "allow" if d.allowed else "deny", d.reason or None, d.policies, d.errors,
                      requests[0].to_json(), entities)

    def check(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Answer a check document (module docstring). Raises `CheckError` for a malformed one."""
        if not isinstance(doc, dict) or not isinstance(doc.get("key_id"), str):
            raise CheckError("key_id (a string) is required")
        items = doc.get("resources")
        if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
            raise CheckError("resources must be a non-empty list of objects")
        p = self.principal(doc["key_id"])
        results: list[Answer] = []
        for item in items:
            actions = item.get("actions")
            if not isinstance(actions, list) or not actions or not all(isinstance(a, str) for a in actions):
                raise CheckError("each resource needs actions: a non-empty list of action names")
            for action in actions:
                results.append(self._one(p, action, item))
        return {"policy_sha256": self.policy.digest, "principal": p.describe() if p else None,
                "results": [r.to_json() for r in results]}

    def _one(self, p: Principal | None, action: str, item: dict[str, Any]) -> Answer:
        row_id = item.get("row")
        if action in ROW_ACTIONS and not isinstance(row_id, str):
            raise CheckError(f"{action} needs row (a row id)")
        if action not in ROW_ACTIONS + REQUEST_ACTIONS:
            raise CheckError(f"unknown action {action!r} (one of {', '.join(ROW_ACTIONS + REQUEST_ACTIONS)})")
        collection = self._collection(item)
        if p is None:
            return Answer(action, "-", "deny", "not_authenticated")
        if action in REQUEST_ACTIONS:
            return self._request_level(p, action, item, collection)
        assert isinstance(row_id, str)
        uid = f"Memory::{self.backend}:{collection}:{row_id}"
        rec = self.ledger.get_collection(self.backend, collection) if self.backend == "chroma" else None
        if self.backend == "chroma" and (rec is None or rec.tenant != p.tenant):
            return Answer(action, uid, "deny", "unknown_collection")
        row = self.ledger.get_rows(self.backend, collection, [row_id]).get(row_id)
        if action == "write":
            if row is not None:
                return Answer(action, uid, "error", "conflict")
            row = self._new_row(p, collection, row_id, item)
        elif row is None:
            return Answer(action, uid, "deny", UNKNOWN_ROW)
        elif row.status not in ("active", "superseded"):
            return Answer(action, uid, "deny", DELETED_ROW)
        elif action == "read" and row.status == "superseded" and not item.get("include_superseded"):
            return Answer(action, uid, "deny", SUPERSEDED_ROW)
        ctx = self._context(p, item) if action == "redistribute" else None
        requests, entities = self.authz.row_batch(p, action, [row], [ctx] if ctx is not None else None)
        return self._ask(action, uid, requests, entities)

    def _collection(self, item: dict[str, Any]) -> str:
        coll = item.get("collection")
        if self.backend == "mem0":
            if coll not in (None, self.settings.mem0_deployment):
                raise CheckError(f"collection: the Mem0 profile has one collection, {self.settings.mem0_deployment!r}")
            return self.settings.mem0_deployment
        if item.get("database") is not None and coll is None:
            return ""
        if not isinstance(coll, str) or not coll:
            raise CheckError("collection (the Chroma collection UUID) is required")
        return coll

    def _request_level(self, p: Principal, action: str, item: dict[str, Any], collection: str) -> Answer:
        database = item.get("database")
        if database is not None:
            if not isinstance(database, str) or not database:
                raise CheckError("database must be a non-empty string")
            tenant = item.get("tenant", p.tenant)
            if not isinstance(tenant, str) or not tenant:
                raise CheckError("tenant must be a non-empty string")
            resource = namespace_entity(tenant, database)
            requests, entities = self.authz.request_batch(p, action, resource)
            return self._ask(action, f"Namespace::{tenant}/{database}", requests, entities)
        if self.backend == "mem0":
            resource = collection_entity(self.backend, f"{collection}/{p.tenant}", p.tenant, collection)
            extra = [namespace_entity(p.tenant, collection)]
        else:
            rec = self.ledger.get_collection(self.backend, collection)
            if rec is None or rec.tenant != p.tenant:
                return Answer(action, f"Collection::{self.backend}:{collection}", "deny", "unknown_collection")
            resource = collection_entity(self.backend, rec.collection_id, rec.tenant, rec.database)
            extra = [namespace_entity(rec.tenant, rec.database)]
        requests, entities = self.authz.request_batch(p, action, resource, extra)
        return self._ask(action, f'{resource["uid"]["type"]}::{resource["uid"]["id"]}', requests, entities)

    def _new_row(self, p: Principal, collection: str, row_id: str, item: dict[str, Any]) -> Row:
        scope = item.get("scope", "fleet")
        fleet = item.get("fleet", p.fleet or "")
        readers = item.get("readers", [])
        labels = item.get("labels", [])
        if not isinstance(scope, str) or not isinstance(fleet, str) or not isinstance(readers, list) \
                or not isinstance(labels, list):
            raise CheckError("scope and fleet must be strings, readers a list of fleet/agent, labels a list of names")
        try:
            labels = list(check_names("label", labels))
        except ValueError as exc:
            raise CheckError(str(exc)) from None
        uids = []
        for r in readers:
            f, sep, a = str(r).partition("/")
            if not sep or not f or not a:
                raise CheckError("readers must be fleet/agent")
            uids.append(agent_id(p.tenant, f, a))
        return Row(self.backend, collection, row_id, p.tenant, fleet, p.uid[1], scope, p.uid[1], now_us(),
                   readers=tuple(uids), labels=tuple(labels))

    def _context(self, p: Principal, item: dict[str, Any]) -> dict[str, Any]:
        ctx = item.get("context")
        if not isinstance(ctx, dict) or not isinstance(ctx.get("target_fleet"), str) \
                or not isinstance(ctx.get("target_scope"), str):
            raise CheckError("redistribute needs context: {target_fleet: <fleet of your tenant>, target_scope}")
        return {"target_fleet": ref("Fleet", f"{p.tenant}/{ctx['target_fleet']}"), "target_scope": ctx["target_scope"]}
