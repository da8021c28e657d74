"""Mem0 OSS REST profile (self-hosted Mem0 server, mem0 repository ``server/main.py``, ``X-API-Key`` auth).

Mapping of a Mem0 deployment onto the governance model
-----------------------------------------------------
Mem0 has no collections: one deployment is one store shared by every tenant. The sidecar names it
``MEMWARDEN_MEM0_DEPLOYMENT`` (default ``default``) and uses it as the ledger's collection key:

- ledger rows: ``(backend "mem0", collection <deployment>, row_id <Mem0 memory id>)``;
  Cedar ``Memory::"mem0:<deployment>:<memory id>"`` (tenant, fleet, owner, scope from the ledger;
  the optional ``user_id``/``run_id`` attributes carry Mem0's subject and session);
- request-level actions (``list``, ``search``, ``delete_bulk``, ``admin``) act on the caller's tenant's
  view of the deployment: ``Collection::"mem0:<deployment>/<tenant>"`` in ``Namespace::"<tenant>/<deployment>"``.

Identity: Mem0's ``agent_id`` is the memwarden agent uid ``tenant/fleet/agent``. The sidecar sets it on
every write; a client ``agent_id`` naming anyone else is 403. In requests the client may write it as the
full uid, ``fleet/agent`` (own tenant) or ``agent`` (own fleet). ``user_id`` and ``run_id`` stay data.

Governed metadata stamped into every row: ``mw_tenant, mw_fleet, mw_owner, mw_scope, mw_writer,
mw_created_at, mw_readers`` (a list of agent uids), ``mw_labels`` (a list of labels), ``mw_source``
(``mem0:add:<request id>``) and, where requested, ``mw_derived_from`` and the triple
``mw_subject/mw_predicate/mw_object``. A client may request ``mw_scope``, ``mw_fleet``, ``mw_readers``
(``"fleet/agent,..."``), ``mw_labels`` (``"pii,finance"``), ``mw_derived_from`` (parent memory ids) and the
triple, and nothing else under ``mw_``; the ledger stays the authority.

Provenance, supersession and deletion closure (docs/design.md §4) follow `sidecar.provenance`, as on Chroma:
parents must be readable; a single-valued triple supersedes the active fact (needs ``update`` on it);
superseded memories are hidden unless ``?include_superseded=true`` or ``?as_of=<UTC µs>``; a memory's
text is remembered as a keyed HMAC, and deleted text the writer could read may not come back (409);
deleting a memory tombstones its derived memories and the caller's deletable copies of its text.

Routes: every Mem0 route is mapped; ``/auth/*``, ``/api-keys``, ``/entities``, ``/requests`` are blocked
(403); anything else is unmapped (404) and never forwarded. Deployment-wide routes are deployment actions
on ``Deployment::"mem0:<deployment>"`` (operator keys only by the default policies): ``GET|POST /configure``
and ``GET /configure/providers`` for an operator (``configure``), and ``POST /reset`` by an operator
(``reset``: Mem0's own reset, then, once it succeeded, every memory tombstoned). A tenant admin's ``POST /reset``
deletes only its tenant's memories, per id (``admin``); Mem0's reset is never called for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import date, datetime, timezone
from typing import Any, Iterable, Sequence


from sidecar.backends.base import OperationActions, Route, RouteTable, operation_action
from sidecar.config import Settings
from sidecar.core import deletes, writes
from sidecar.core.operations import Capabilities
from sidecar.core.echo import set_aside, without_echo
from sidecar.core.visibility import Visibility, visibility
from sidecar.errors import (BackendAnswerTooLarge, BackendClientError, BadRequest, Conflict, Forbidden, MemwardenError, NotFound,
                            UpstreamError)
from sidecar.exchange import Exchange
from sidecar.governance import Principal, Row, agent_id, collection_entity, namespace_entity, stamped_as
from sidecar.ledger import Ledger, offloop
from sidecar.ledger.base import RowVersion
from sidecar.provenance import (FIXED_ONCE_WRITTEN, GOVERNED_PREFIX, WRITE_ONCE, Provenance, history_view,
                                provenance_metadata, split_metadata)
from sidecar.rowsize import check_row_size, row_bytes
from sidecar.stages.authorize import Authorizer, settle_rows, well_formed_rows
from sidecar.stages.canonicalize import check_filter_size
from sidecar.stages.forward import Upstream


BACKEND = "mem0"
REAPPEARANCE_CHECKS_PER_RUN = 200
ID = "{memory_id}"

ROUTES: list[tuple[str, tuple[str, ...], str]] = [
    ("POST", ("memories",), "add"),
    ("GET", ("memories",), "list"),
    ("DELETE", ("memories",), "delete_all"),
    ("GET", ("memories", ID), "get"),
    ("PUT", ("memories", ID), "update"),
    ("DELETE", ("memories", ID), "delete"),
    ("GET", ("memories", ID, "history"), "history"),
    ("POST", ("search",), "search"),
    ("POST", ("reset",), "reset"),
    ("GET", ("configure",), "configure_get"),
    ("POST", ("configure",), "configure_set"),
    ("GET", ("configure", "providers"), "providers"),
    ("POST", ("generate-instructions",), "generate_instructions"),
    # Mem0's own users, keys, entity listing and request logs: never through memwarden.
    ("GET", ("auth", "setup-status"), "blocked"),
    ("POST", ("auth", "register"), "blocked"),
    ("POST", ("auth", "login"), "blocked"),
    ("POST", ("auth", "refresh"), "blocked"),
    ("GET", ("auth", "me"), "blocked"),
    ("PATCH", ("auth", "me"), "blocked"),
    ("POST", ("auth", "change-password"), "blocked"),
    ("POST", ("auth", "onboarding-complete"), "blocked"),
    ("GET", ("api-keys",), "blocked"),
    ("POST", ("api-keys",), "blocked"),
    ("DELETE", ("api-keys", "{key_id}"), "blocked"),
    ("GET", ("entities",), "blocked"),
    ("DELETE", ("entities", "{entity_type}", "{entity_id}"), "blocked"),
    ("GET", ("requests",), "blocked"),
]
ROUTE_TABLE = RouteTable(ROUTES)  # `Mem0Profile.match`: the same answers as ``match_routes(ROUTES, ...)``
# Each operation's Cedar action (`operation_action`, the decision log's ``action``): data operations by their row
# action, the others by their request-level action; an operator's reset and configuration by the deployment's.
OPERATION_ACTIONS: OperationActions = {
    "add": "write", "list": "read", "delete_all": "delete", "get": "read", "update": "update", "delete": "delete",
    "history": "read", "search": "read", "reset": ("delete", "reset"), "configure_get": "configure",
    "configure_set": "configure", "providers": ("list", "configure"), "generate_instructions": "admin",
    "blocked": "admin",
}

IDENTITY = ("user_id", "agent_id", "run_id")
OPERATORS = {"eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "icontains"}
# Mem0 caps GET /memories at 1000 rows per call (server/main.py ALL_MEMORIES_LIMIT).
LIST_LIMIT = 1000
SEARCH_DEFAULT_TOP_K = 20  # Memory.search default
LIST_DEFAULT_TOP_K = 20  # Memory.get_all default
NOT_FOUND = "memory not found"

Scalar = (str, int, float, bool)


def _obj(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _only(body: dict[str, Any], allowed: Iterable[str]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown fields: {unknown}")


def _int(value: Any, name: str, default: int, hi: int | None = None) -> int:
    if value is None:
        return default
    if isinstance(value, str):
        if not value.isdigit():
            raise BadRequest(f"{name} must be a non-negative integer")
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (hi is not None and value > hi):
        raise BadRequest(f"{name} must be an integer in 0..{hi}" if hi else f"{name} must be a non-negative integer")
    return value


def _bool_param(value: str | None, name: str) -> bool | None:
    if value is None:
        return None
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise BadRequest(f"{name} must be true or false")


def _ident(value: Any, name: str) -> str:
    """A Mem0 entity id value: a non-empty string without whitespace (Mem0's own rule)."""
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value.strip()):
        raise BadRequest(f"{name} must be a non-empty string without whitespace")
    return value.strip()


def _expired(expiration_date: Any, today: date) -> bool:
    """Whether a memory with this ``expiration_date`` is expired on `today` (UTC), as Mem0 decides it for its lists
    and search (mem0 ``Memory.get_all``/``search``: a date before today; none, or one that is not an ISO date, is
    not expired)."""
    if not expiration_date:
        return False
    try:
        return date.fromisoformat(str(expiration_date)) < today
    except ValueError:
        return False


def or_of(v: Visibility) -> list[dict[str, Any]] | None:
    """The disjunction of `v` (`sidecar.core.visibility`) as Mem0 ``filters``' ``OR`` over the stamped metadata
    (`Mem0Profile._stamp`): one condition object per disjunct, ``mw_scope`` with ``mw_owner``, ``mw_fleet`` or
    ``mw_readers`` (a list: Mem0 matches a member); None when `v` is the tenant alone (the caller adds ``mw_tenant``)."""
    if not v.clauses:  # the tenant alone; or no disjunct, an operator's, whose tenant "" is no row's
        return None
    out: list[dict[str, Any]] = []
    for c in v.clauses:
        cond: dict[str, Any] = {"mw_scope": c.scope}
        if c.owner is not None:
            cond["mw_owner"] = c.owner
        if c.fleet is not None:
            cond["mw_fleet"] = c.fleet
        if c.reader is not None:
            cond["mw_readers"] = c.reader
        out.append(cond)
    return out


class Filter:
    """A client's Mem0 ``filters`` (plus deprecated top-level ids), compiled for pushdown.

    ``pushed`` is sent to Mem0 (with the caller's visibility added by `Mem0Profile._search_filters`);
    ``post`` are the identity-field operators Mem0 cannot evaluate (``ne``/``in``/``nin`` on
    ``user_id``/``agent_id``/``run_id``), evaluated by the sidecar on every returned row. A filter that
    cannot be expressed exactly is refused (400), never approximated.
    """

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.identity_eq: dict[str, str] = {}
        self.post: list[tuple[str, str, set[str]]] = []
        self.any_of: list[dict[str, Any]] | None = None
        self.none_of: list[dict[str, Any]] | None = None

    def matches(self, row: dict[str, Any]) -> bool:
        for field, op, values in self.post:
            value = row.get(field)
            if op == "in" and value not in values:
                return False
            if op in ("ne", "nin") and value in values:
                return False
        return True


class Mem0Client:
    """The Mem0 calls the core makes (`sidecar.core.operations.Deleter`): one memory a delete; Mem0's 404 there
    counts as done. It holds the rows of one deployment (ledger collection)."""

    capabilities = Capabilities(server_ids=True, metadata_merge=True, history=True)

    def __init__(self, upstream: Upstream, deployment: str) -> None:
        self.upstream = upstream
        self.deployment = deployment

    def holds(self, collection: str) -> bool:
        return collection == self.deployment  # another deployment's copy stays pending for its reconciler

    async def delete(self, collection: str, ids: Sequence[str]) -> None:
        for mid in ids:
            try:
                await self.upstream.call("DELETE", ["memories", mid])
            except BackendClientError as exc:
                if exc.status != 404:  # already gone in Mem0: the delete is done
                    raise

    async def present(self, collection: str, ids: Sequence[str]) -> list[str]:
        """Those of `ids` Mem0 holds (one ``GET /memories/{id}`` each: Mem0 has no batch get; 200 null is missing)."""
        back = []
        for mid in ids:
            found = await self.upstream.call("GET", ["memories", mid])
            if isinstance(found, dict) and found.get("id") == mid:
                back.append(mid)
        return back


class Mem0Profile:
    """Mem0 REST routes → Cedar actions, ledger updates and row filtering."""

    name = BACKEND

    def __init__(self, settings: Settings, upstream: Upstream, ledger: Ledger, authz: Authorizer) -> None:
        self.settings = settings
        self.upstream = upstream
        self.ledger = ledger
        self.authz = authz
        self.coll = settings.mem0_deployment
        self.deployment = f"{BACKEND}:{settings.mem0_deployment}"  # Deployment::"mem0:<deployment>"
        self._reappearance = deletes.Cursor()  # where the next run's reappearance checks go on
        self.prov = Provenance(BACKEND, settings.policies_dir, ledger, authz)
        self.client = Mem0Client(upstream, settings.mem0_deployment)

    health_segments = ["configure", "providers"]

    def match(self, method: str, segments: list[str]) -> Route | None:
        return ROUTE_TABLE.match(method, segments)

    async def handle(self, ex: Exchange, route: Route) -> tuple[int, Any]:
        ex.operation = route.op
        ex.action = operation_action(OPERATION_ACTIONS, route.op, ex.principal.kind if ex.principal else None)
        return await getattr(self, f"op_{route.op}")(ex, route.params)  # type: ignore[no-any-return]

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _p(ex: Exchange) -> Principal:
        assert ex.principal is not None
        return ex.principal

    def _require(self, ex: Exchange, action: str) -> None:
        """Request-level decision on the caller's tenant's view of the deployment."""
        p = self._p(ex)
        coll = collection_entity(BACKEND, f"{self.coll}/{p.tenant}", p.tenant, self.coll)
        self.authz.require(ex, action, coll, [namespace_entity(p.tenant, self.coll)])

    def _agent_ref(self, p: Principal, value: Any, name: str = "agent_id") -> str:
        """A client's agent reference → agent uid: ``t/f/a`` as is, ``f/a`` in the caller's tenant,
        ``a`` in the caller's fleet."""
        text = _ident(value, name)
        parts = text.split("/")
        if len(parts) == 3 and all(parts):
            return text
        if len(parts) == 2 and all(parts):
            return agent_id(p.tenant, parts[0], parts[1])
        if len(parts) == 1 and p.fleet:
            return agent_id(p.tenant, p.fleet, text)
        raise BadRequest(f"{name} must be tenant/fleet/agent, fleet/agent or an agent of your fleet")

    def _agent_filter(self, p: Principal, value: Any) -> str:
        """A filter's ``agent_id`` value → what Mem0 stores: the agent uid (`_agent_ref`), or the value as it is when
        adopted memories of the tenant are listed under it (`memwarden adopt mem0` keeps Mem0's agent_id) and it
        names no memwarden agent of the tenant (the uid wins when both exist; a list asks under both)."""
        raw = _ident(value, "agent_id")
        adopted = ("agent_id", raw) in self.ledger.listing_keys(BACKEND, self.coll, p.tenant)
        try:
            uid = self._agent_ref(p, raw)
        except BadRequest:
            if adopted:
                return raw
            raise
        return raw if adopted and uid not in self._tenant_agents(p) else uid

    def _tenant_agents(self, p: Principal) -> list[str]:
        return sorted({agent_id(k.tenant, k.fleet, k.agent) for k in self.ledger.list_keys(p.tenant)
                       if k.kind == "agent" and k.fleet and k.agent})

    async def _call(self, method: str, segments: list[str], *, json_body: Any = None,
                    params: dict[str, str] | None = None, idempotent: bool = False) -> Any:
        """One Mem0 call. Mem0's 4xx come back as `BackendClientError` with its status and memwarden's own message
        (`Upstream.call`: a backend's text is never echoed). `idempotent`: a read-only POST (search), which the
        transport may re-send on a fresh connection (`Upstream.call`)."""
        return await self.upstream.call(method, segments, json_body=json_body, params=params, idempotent=idempotent)

    def _servable(self, ids: list[str]) -> dict[str, Row]:
        rows = self.ledger.get_rows(BACKEND, self.coll, ids)
        return {i: r for i, r in rows.items() if r.status in ("active", "superseded")}

    def _readable_or_404(self, ex: Exchange, memory_id: str, include_superseded: bool = False,
                         as_of: int | None = None, stamp: Any = None) -> Row:
        """The ledger row of `memory_id` if the caller may read it (a superseded one only with
        `include_superseded`, or the one current at `as_of`); 404 (one message) otherwise. `stamp`: the memory's
        metadata as Mem0 answered it, which must have been stamped under the row's governance (`stamped_as`)."""
        allowed = self.authz.readable_rows(ex, BACKEND, self.coll, [memory_id], include_superseded, as_of,
                                           stamps=None if stamp is None else {memory_id: stamp})
        if memory_id not in allowed:
            ex.decision = "deny"
            raise NotFound(NOT_FOUND)
        ex.decision = "allow"
        return allowed[memory_id]

    async def _readable_or_404_off_loop(self, ex: Exchange, memory_id: str, include_superseded: bool = False,
                                        as_of: int | None = None, stamp: Any = None) -> Row:
        """`_readable_or_404` with its ledger read made in one trip off the event loop (PostgreSQL)."""
        async with self.authz.prefetched(ex, BACKEND, self.coll, [memory_id]):
            return self._readable_or_404(ex, memory_id, include_superseded, as_of, stamp)

    def _requested(self, p: Principal, meta: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split client metadata into (plain, requested governance); 400 on other ``mw_`` or identity keys."""
        return split_metadata(p, meta, not_object="metadata must be an object", reserved=(*IDENTITY, "actor_id"))

    @staticmethod
    def _stamp(plain: dict[str, Any], row: Row) -> dict[str, Any]:
        out = dict(plain)
        out.update({"mw_tenant": row.tenant, "mw_fleet": row.fleet, "mw_owner": row.owner, "mw_scope": row.scope,
                    "mw_writer": row.writer, "mw_created_at": row.created_at, "mw_readers": list(row.readers),
                    "mw_labels": list(row.labels)})
        out.update(provenance_metadata(row))
        return out

    def _view(self, ex: Exchange, row: Row) -> dict[str, Any]:
        """The governed metadata a read of `row` shows this caller (the stamp and the supersession links it may see)."""
        shown = [{"id": row.row_id, "metadata": self._stamp({}, row)}]
        self.prov.decorate(ex, self.coll, shown, id_key="id", meta_key="metadata")
        return shown[0]["metadata"]

    async def _decorate(self, ex: Exchange, rows: list[dict[str, Any]]) -> None:
        """Add ``mw_supersedes_id`` / ``mw_superseded_by`` to returned memories' metadata where the linked
        memory is readable by the caller (`Provenance.links`; its ledger reads off the loop)."""
        await offloop.call(self.ledger, self.prov.decorate, ex, self.coll, rows, id_key="id", meta_key="metadata")

    def _decide_all(self, ex: Exchange, action: str, rows: list[Row], contexts: list[dict[str, Any]] | None = None) -> list[str]:
        """Ids of `rows` Cedar denies for `action`."""
        decisions = self.authz.decide_rows(ex, action, rows, contexts)
        return [r.row_id for r, d in zip(rows, decisions) if not d.allowed]

    # -- writes -----------------------------------------------------------------------------
    async def op_add(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        p = self._p(ex)
        body = _obj(ex.body)
        _only(body, ("messages", "user_id", "agent_id", "run_id", "metadata", "expiration_date", "infer",
                     "memory_type", "prompt"))
        if p.kind != "agent":
            raise Forbidden("tenant admin keys cannot own memories; write with an agent key")
        if body.get("agent_id") is not None and self._agent_ref(p, body["agent_id"]) != p.uid[1]:
            ex.decision = "deny"
            raise Forbidden("agent_id names another agent; memwarden sets agent_id to the caller")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a non-empty list of {role, content} objects")
        if body.get("memory_type") is not None:
            raise BadRequest("memory_type (procedural memory) is not available through memwarden")
        # Each message may become a memory (infer=false: each non-system one) carrying the add's metadata.
        for n, m in enumerate(messages):
            check_row_size(f"message {n}", row_bytes(m.get("content"), body.get("metadata")), self.settings.max_row_bytes)
        infer = body.get("infer")
        if infer is not None and not isinstance(infer, bool):
            raise BadRequest("infer must be a boolean")
        infer = True if infer is None else infer  # Mem0's default
        if infer and self.settings.mem0_infer == "refuse":
            raise BadRequest("infer=true is refused by this memwarden deployment; send infer=false")
        if not infer and body.get("prompt") is not None:
            raise BadRequest("prompt is only used with infer=true")
        cedar_attrs: dict[str, str] = {}
        for key in ("user_id", "run_id"):
            if body.get(key) is not None:
                value = _ident(body[key], key)
                if value == "*":
                    raise BadRequest(f"{key} cannot be the wildcard '*'")
                cedar_attrs[key] = value
        plain, requested = self._requested(p, body.get("metadata"))
        # The text Mem0 stores with infer=false: each non-system message (infer=true: checked again on its events).
        texts = [m["content"] for m in messages if m.get("role") != "system" and isinstance(m.get("content"), str)]

        def decide() -> Row:
            # Every memory of this add gets the template's governance and provenance; its id and content
            # HMAC come from Mem0's events.
            template = self.prov.new_row(ex, self.coll, f"pending:{ex.request_id}", requested, None,
                                         extra={"cedar": cedar_attrs} if cedar_attrs else {})
            # The write decision comes first: a principal that may not write learns nothing from the
            # provenance checks (which parent or fact exists, which content was deleted).
            denied = self._decide_all(ex, "write", [template])
            if denied:
                ex.decision, ex.deny_action = "deny", "write"
                raise Forbidden("write is not permitted")
            self.prov.check_parents(ex, [template])
            self.prov.check_supersession(ex, [template])
            self.prov.check_forgotten(ex, [self.prov.set_content(dataclasses.replace(template), t) for t in texts])
            return template
        template = await offloop.call(self.ledger, decide)  # its ledger reads off the loop (PostgreSQL)
        candidates: dict[str, Row] = {}
        if infer:
            candidates = await self._confine_infer(ex, p, cedar_attrs)
        ex.decision = "allow"
        forwarded: dict[str, Any] = {"messages": messages, "agent_id": p.uid[1], "metadata": self._stamp(plain, template),
                                     "infer": infer, **cedar_attrs}
        for key in ("expiration_date", "prompt"):
            if body.get(key) is not None:
                forwarded[key] = body[key]
        resp = await self._call("POST", ["memories"], json_body=forwarded)
        if not isinstance(resp, dict) or not isinstance(resp.get("results"), list):
            raise UpstreamError("unexpected backend answer")
        return 200, await self._record_events(ex, p, template, resp, candidates, infer)

    async def _confine_infer(self, ex: Exchange, p: Principal, attrs: dict[str, str]) -> dict[str, Row]:
        """infer=true: Mem0's LLM may update or delete any memory matching the add's entity ids, i.e. the
        caller's own rows (agent_id is always the caller) narrowed by user_id/run_id. Every such row must be
        governed, live and updatable and deletable by the caller; otherwise the call cannot be confined (4xx)."""
        q = {"agent_id": p.uid[1], **attrs, "top_k": str(LIST_LIMIT), "show_expired": "true"}
        resp = await self._call("GET", ["memories"], params=q)
        rows = self._results(ex, resp, strict=True)
        if len(rows) >= LIST_LIMIT:
            raise BadRequest("infer=true cannot be confined: too many memories in scope; send infer=false")
        ids = [r["id"] for r in rows]

        def confine() -> dict[str, Row]:
            known = self._servable(ids)
            if len(known) != len(set(ids)):
                raise Conflict("infer=true cannot be confined: memories in scope are deleted or not governed; send infer=false")
            batch = list(known.values())
            if self._decide_all(ex, "update", batch) or self._decide_all(ex, "delete", batch):
                ex.decision = "deny"  # `deny_action`: the action denied (update, else delete)
                raise Forbidden("infer=true may change memories you cannot update or delete; send infer=false")
            return known
        return await offloop.call(self.ledger, confine)

    def _with_text(self, row: Row, text: Any) -> Row:
        """`row` with `text` (an event's memory) as its content; no content when Mem0 sent no text."""
        if isinstance(text, str):
            return self.prov.set_content(row, text)
        row.content_hmac, row.content_legacy = None, ()
        return row

    async def _record_events(self, ex: Exchange, p: Principal, template: Row, resp: dict[str, Any],
                             candidates: dict[str, Row], infer: bool) -> dict[str, Any]:
        """Ledger updates for Mem0's add events: ADD → new row (the template's governance and provenance,
        the event text's content HMAC; a single-valued triple supersedes on activation), UPDATE → must be
        a confined candidate (its content HMAC follows the new text), DELETE → tombstone with the deletion
        closure. An event outside the confinement is tombstoned (fail closed); so is, with infer=true, an
        ADD or UPDATE whose text is deleted content the caller could read, and the add then answers 409."""
        added: list[Row] = []
        updated: list[Row] = []
        out: list[dict[str, Any]] = []
        gone: list[Row] = []  # DELETE events on confined rows: the caller's own deletes
        tomb: list[str] = []  # fail closed
        deleted_in_mem0: list[str] = []
        for event in resp["results"]:
            if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not event["id"]:
                raise UpstreamError("unexpected backend answer")
            kind = event.get("event")
            mid = event["id"]
            text = event.get("memory")
            if kind == "ADD":
                added.append(self._with_text(dataclasses.replace(template, row_id=mid), text))
                out.append(event)
            elif kind == "DELETE":
                deleted_in_mem0.append(mid)
                if mid in candidates:
                    gone.append(candidates[mid])
                else:
                    tomb.append(mid)
            elif kind == "UPDATE" and mid in candidates:
                updated.append(self._with_text(dataclasses.replace(candidates[mid]), text))
                out.append(event)
            elif kind == "NONE" and mid in candidates:
                continue
            else:
                tomb.append(mid)  # Mem0 touched a row outside the confinement: never serve it again
        # infer=false texts were checked before forwarding; the LLM's own texts only now.
        refused = {r.row_id for r in await offloop.call(self.ledger, self.prov.forgotten, ex, added + updated)} if infer else set()
        if refused:
            tomb += [r.row_id for r in added + updated if r.row_id in refused]
            added = [r for r in added if r.row_id not in refused]
            updated = [r for r in updated if r.row_id not in refused]
            out = [e for e in out if e["id"] not in refused]
        closed: list[tuple[str, str]] = []
        # Every ledger call below runs off the event loop on PostgreSQL (`_off`), one after the other, in
        # the order and with the errors of the synchronous code.
        if gone:
            closed += await offloop.call(self.ledger, self.prov.tombstone, ex, self.coll, gone, self.settings.deletion_closure)
        if tomb:
            closed += await offloop.call(self.ledger, self.ledger.tombstone, BACKEND, self.coll, tomb, p.uid[1], ex.request_id,
                                      closure=self.settings.deletion_closure)
        if deleted_in_mem0:
            await offloop.call(self.ledger, self.ledger.mark_backend_deleted, BACKEND, self.coll, deleted_in_mem0)
        withdrawn: MemwardenError | None = None
        if added:
            # Mem0 chose the ids, so the rows (and their lineage edges) reach the ledger only now
            # (`sidecar.core.writes.activate_new`).
            withdrawn, tombstoned = await writes.activate_new(self, ex, self.coll, added, self.client)
            closed += tombstoned
            if withdrawn is not None:
                added_ids = {r.row_id for r in added}
                out = [e for e in out if e["id"] not in added_ids]
                added = []
        if updated:
            await writes.govern(self, ex, self.coll, updated, held=[], failpoint=False)
        done = set(deleted_in_mem0)
        await self._backend_delete(list(dict.fromkeys(r for c, r in closed if c == self.coll and r not in done)))
        if withdrawn is not None:
            ex.decision = "deny"
            raise withdrawn
        ex.row_ids = [r.row_id for r in added]
        ex.rows_allowed = len(out)
        if refused:
            ex.decision = "deny"
            raise Conflict("this content was deleted and may not be written again; the memories made of it were removed")
        return {**resp, "results": out}

    async def op_update(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        p = self._p(ex)
        mid = params["memory_id"]
        body = _obj(ex.body)
        _only(body, ("text", "metadata", "expiration_date"))
        if not body:
            raise BadRequest("At least one of text, metadata, or expiration_date must be provided.")
        if "text" in body and body["text"] is not None and not isinstance(body["text"], str):
            raise BadRequest("text must be a string")
        check_row_size("the memory", row_bytes(body.get("text"), body.get("metadata")), self.settings.max_row_bytes)
        # Governed keys a read showed may come back unchanged (`sidecar.core.echo`), checked once the row is readable.
        kept, claimed = set_aside(body.get("metadata"))
        plain, requested = self._requested(p, kept)
        text = body.get("text")

        def decide() -> tuple[Row, Row, bool]:
            nonlocal requested
            row = self._readable_or_404(ex, mid, include_superseded=True)
            if claimed or any(k in requested for k in WRITE_ONCE):
                requested = without_echo(claimed, requested, self._view(ex, row))
            if any(k in requested for k in WRITE_ONCE):
                raise BadRequest(FIXED_ONCE_WRITTEN)
            new = writes.with_governance(row, requested)
            if isinstance(text, str):
                self.prov.set_content(new, text)
                self.prov.check_forgotten(ex, [new])
            writes.decide_changes(self, ex, [(row, new)], [mid])
            moved = writes.moves(row, new)
            if moved:
                self.prov.check_move(ex, [(row, new)])
            return row, new, moved
        # The row and its owner in one ledger trip (PostgreSQL), the checks' own ledger reads off the loop.
        async with self.authz.prefetched(ex, BACKEND, self.coll, [mid]):
            row, new, moved = await offloop.call(self.ledger, decide)
        # One update of a memory at a time (`sidecar.core.updates`): another one meanwhile is 409.
        return await writes.holding(self, ex, self.coll, {mid: row},
                                    lambda: self._update_held(ex, mid, body, plain, text, new, moved))

    async def _update_held(self, ex: Exchange, mid: str, body: dict[str, Any], plain: dict[str, Any], text: Any,
                           new: Row, moved: bool) -> tuple[int, Any]:
        """The rest of `op_update`, holding the memory's update marker: Mem0's update, then the ledger's — the new
        governance and content HMAC, and the version this update wrote into Mem0's history (`_history_event`), so that
        its history entry is served under the governance it was written under (`op_history`)."""
        ex.decision = "allow"
        settle_rows(ex, [mid], [])
        forwarded: dict[str, Any] = {k: body[k] for k in ("text", "expiration_date") if k in body}
        # The new governance is stamped only when it changes (Mem0 merges metadata into the memory's): an update
        # that keeps it leaves the stamp as it is, so it commutes with another update in flight, whose new stamp it
        # would otherwise overwrite with the old governance (`stamped_as`; `ChromaProfile._write` alike).
        if "metadata" in body or moved:
            meta = dict(plain)
            if moved:
                meta.update({"mw_scope": new.scope, "mw_fleet": new.fleet, "mw_readers": list(new.readers),
                             "mw_labels": list(new.labels)})
            forwarded["metadata"] = meta
        result = await self._call("PUT", ["memories", mid], json_body=forwarded)
        # Every Mem0 update writes a history entry (a metadata-only one too): each is recorded as a version.
        event = await self._history_event(mid, new)
        await writes.govern(self, ex, self.coll, [new], held=[mid], history={mid: event},
                            failpoint=moved or isinstance(text, str))
        return 200, result

    async def _history_event(self, mid: str, new: Row) -> str | None:
        """The id of the history entry the update of `mid` just made (this request holds its update marker): the
        memory's newest entry (latest ``updated_at``, Mem0's microsecond time), when it is an UPDATE that no recorded
        version names and whose new text is the memory's content now (`new`'s content HMAC). None otherwise, or when
        Mem0 does not answer: that entry is then served only where every governance the memory had allows
        (`op_history`)."""
        try:
            entries = await self._call("GET", ["memories", mid, "history"])
            known = await offloop.call(self.ledger, self.ledger.row_versions, BACKEND, self.coll, mid)
        except MemwardenError:
            return None
        if not isinstance(entries, list):
            return None
        timed = [e for e in entries if isinstance(e, dict) and isinstance(e.get("updated_at"), str)]
        if not timed:
            return None
        latest = max(e["updated_at"] for e in timed)
        newest = [e for e in timed if e["updated_at"] == latest]
        if len(newest) != 1:
            return None
        e = newest[0]
        recorded = {v.event_id for v in known if v.event_id}
        if (e.get("event") != "UPDATE" or not isinstance(e.get("id"), str) or e["id"] in recorded
                or not isinstance(e.get("new_memory"), str) or new.content_hmac is None
                or self.prov.digest(e["new_memory"]) != new.content_hmac):
            return None
        return str(e["id"])

    # -- reads ------------------------------------------------------------------------------
    async def op_get(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        mid = params["memory_id"]
        self._require(ex, "list")
        view = history_view(ex.query)
        row = await self._readable_or_404_off_loop(ex, mid, *view)
        try:
            result = await self._call("GET", ["memories", mid])
        except BackendClientError as exc:
            if exc.status == 404:  # readable by policy, missing in Mem0: not an access decision
                raise NotFound(NOT_FOUND, reason="backend_not_found", decision="error") from exc
            raise
        if result is None:  # Mem0 answers 200 null for a missing id
            raise NotFound(NOT_FOUND, reason="backend_not_found", decision="error")
        if not isinstance(result, dict) or result.get("id") != mid or not well_formed_rows(
                ex, BACKEND, [result], lambda r: r.get("id"), self.settings.max_json_depth + 1):
            raise UpstreamError("unexpected backend answer")
        if not stamped_as(result.get("metadata"), row):
            # An update landed between the ledger read and Mem0's answer (`stamped_as`): decided again on the
            # ledger as it is now, against the stamp Mem0 answered; still another governance, 404 (changing_row).
            ex.rows_allowed -= 1  # counted again by the second decision
            await self._readable_or_404_off_loop(ex, mid, *view, stamp=result.get("metadata"))
        await self._decorate(ex, [result])
        ex.row_ids = [mid]
        return 200, result

    async def op_history(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        mid = params["memory_id"]
        self._require(ex, "list")
        view = history_view(ex.query)
        row = await self._readable_or_404_off_loop(ex, mid, *view)
        result = await self._call("GET", ["memories", mid, "history"])
        if not isinstance(result, list):
            raise UpstreamError("unexpected backend answer")
        # The history holds the memory's latest text, whose stamp is the memory's: asked after the history, so a
        # text the history holds was written before it. Decided as `op_get` decides it: 404 while the stamp
        # disagrees with the ledger row (an update between its two writes, or killed there).
        now = await self._call("GET", ["memories", mid])
        stamp = now.get("metadata") if isinstance(now, dict) and now.get("id") == mid else None
        if not stamped_as(stamp, row):
            ex.rows_allowed -= 1  # counted again by the second decision
            row = await self._readable_or_404_off_loop(ex, mid, *view, stamp=stamp)
        # Only this memory's own live entries: a DELETE entry (is_deleted) never leaves the sidecar.
        entries = [dict(e) for e in result if isinstance(e, dict) and e.get("memory_id") == mid
                   and not e.get("is_deleted") and e.get("event") != "DELETE"]
        # Each entry under the governance it was written under, not the memory's now (a widening does not open its past).
        entries = await self._entries_as_written(ex, mid, row, entries)
        # A past text of this memory that is also a deleted memory's content, which the caller could
        # read, is redacted (null) — the same rule as the 409 on writes, so it is no oracle to others.
        texts = sorted({t for e in entries for t in (e.get("old_memory"), e.get("new_memory")) if isinstance(t, str)})
        as_rows = [self.prov.set_content(dataclasses.replace(row), t) for t in texts]
        flagged = {id(r) for r in await offloop.call(self.ledger, self.prov.forgotten, ex, as_rows)}
        hidden = {t for t, r in zip(texts, as_rows) if id(r) in flagged}
        if hidden:
            for e in entries:
                for field in ("old_memory", "new_memory"):
                    if isinstance(e.get(field), str) and e[field] in hidden:
                        e[field] = None
        ex.row_ids = [mid]
        return 200, entries

    async def _entries_as_written(self, ex: Exchange, mid: str, row: Row, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Those of `entries` (the memory's history, in Mem0's order) the caller may read under the governance each was
        written under (`Ledger.row_versions`): the ADD entry under the memory's ``created`` version (the memory's
        governance now when it has no version: never updated), an UPDATE entry under the version naming it. An entry
        no version names (written before the ledger recorded versions, by an update that died before its ledger write,
        or around the sidecar) is served only where every governance the memory had, and has now, allows. A served
        entry's ``old_memory`` is shown only when it is the ``new_memory`` of an entry served to the caller (it was
        written under the previous entry's governance); otherwise it is null."""
        versions = await offloop.call(self.ledger, self.ledger.row_versions, BACKEND, self.coll, mid)

        def as_written(v: RowVersion) -> Row:
            return dataclasses.replace(row, fleet=v.fleet, owner=v.owner, scope=v.scope, readers=v.readers, labels=v.labels)

        named = {v.event_id: as_written(v) for v in versions if v.event_id}
        created = as_written(versions[0]) if versions and versions[0].kind == "created" else None
        every = [as_written(v) for v in versions] + [row]

        def governance(e: dict[str, Any]) -> list[Row]:
            if not versions:
                return [row]
            if e.get("event") == "ADD" and created is not None:
                return [created]
            hit = named.get(e.get("id")) if isinstance(e.get("id"), str) else None
            return [hit] if hit is not None else every

        wanted = [governance(e) for e in entries]
        distinct: dict[tuple[Any, ...], Row] = {}
        for rows in wanted:
            for r in rows:
                distinct.setdefault((r.fleet, r.owner, r.scope, r.readers, r.labels), r)
        keys = list(distinct)
        # One Memory entity per governance: each its own uid (``<id>@<n>``), so one entity store holds them all.
        asked = [dataclasses.replace(distinct[k], row_id=f"{mid}@{n}") for n, k in enumerate(keys)]
        decisions = await offloop.call(self.ledger, self.authz.decide_rows, ex, "read", asked)
        allowed = {k for k, d in zip(keys, decisions) if d.allowed}
        served = [e for e, rows in zip(entries, wanted)
                  if all((r.fleet, r.owner, r.scope, r.readers, r.labels) in allowed for r in rows)]
        shown = {e.get("new_memory") for e in served if isinstance(e.get("new_memory"), str)}
        for e in served:
            if isinstance(e.get("old_memory"), str) and e["old_memory"] not in shown:
                e["old_memory"] = None
        return served

    def _results(self, ex: Exchange, resp: Any, *, strict: bool = False) -> list[dict[str, Any]]:
        """The memories of a Mem0 list/search answer. A malformed answer is 502; a malformed memory in
        it is dropped, counted and logged (`well_formed_rows`) — or, with `strict` (infer confinement,
        which must see every row Mem0's LLM may change), fails the request (502)."""
        if not isinstance(resp, dict) or not isinstance(resp.get("results"), list):
            raise UpstreamError("unexpected backend answer")
        rows: list[dict[str, Any]] = resp["results"]
        good = well_formed_rows(ex, BACKEND, rows, lambda r: r.get("id"), self.settings.max_json_depth + 1)
        if strict and len(good) != len(rows):
            raise UpstreamError("unexpected backend answer")
        return good

    async def _list_rows(self, ex: Exchange, query: dict[str, str], show_expired: bool,
                         purpose: str = "read") -> list[dict[str, Any]]:
        """Every Mem0 row of the caller's tenant matching the client's ids, in Mem0's order, before row-level
        filtering: one GET /memories per agent — for a read (`purpose` ``read``) each agent owning a row the caller's
        visibility filter admits (`Ledger.visible_owners`: an agent whose rows the caller may not read is never asked
        for them), for a delete (``delete``) every agent of the tenant — or for the one agent named (for a read, only
        when it owns such a row); without a named agent also one per entity id under which adopted memories of the
        tenant are listed (`Ledger.listing_keys`); with one, also that agent_id as Mem0 stores it when adopted
        memories of the tenant are listed under it. Each call stands alone (`_lookup`): an agent's answer over
        ``BACKEND_MAX_RESPONSE_BYTES`` is made again memory by memory (`_owner_rows`), so rows the caller may not
        read never cost it the list."""
        p = self._p(ex)
        base: dict[str, str] = {"top_k": str(LIST_LIMIT), "show_expired": "true" if show_expired else "false"}
        for key in ("user_id", "run_id"):
            if query.get(key) not in (None, "*"):
                base[key] = _ident(query[key], key)
        named = query.get("agent_id")
        reader = visibility(p, self.authz.pushdown(self.settings.pushdown)).reader
        lookups: list[dict[str, str]] = []
        if named not in (None, "*"):
            # An adopted memory kept the agent_id Mem0 gave it (`memwarden adopt mem0`): an agent_id the tenant's
            # adopted memories are listed under names those memories too, as Mem0 itself would answer.
            raw = _ident(named, "agent_id")
            adopted = ("agent_id", raw) in await offloop.call(self.ledger, self.ledger.listing_keys, BACKEND, self.coll, p.tenant)
            try:
                agents = [self._agent_ref(p, named)]
            except BadRequest:
                if not adopted:
                    raise
                agents = []  # not a memwarden agent reference (e.g. a tenant admin naming a bare id)
            if adopted and raw not in agents:
                lookups.append({**base, "agent_id": raw})
            agents = [a for a in agents if a.startswith(p.tenant + "/")]  # another tenant's agent: nothing of it
            if purpose == "read" and agents:
                owners = await offloop.call(self.ledger, self.ledger.visible_owners, BACKEND, self.coll, p.tenant, reader)
                agents = [a for a in agents if a in owners]
        else:
            if purpose == "read":
                agents = await offloop.call(self.ledger, self.ledger.visible_owners, BACKEND, self.coll, p.tenant, reader)
            else:
                agents = await offloop.call(self.ledger, self._tenant_agents, p)
            # Adopted memories (`memwarden adopt mem0`) keep the entity ids Mem0 gave them: list under those too.
            for field, value in await offloop.call(self.ledger, self.ledger.listing_keys, BACKEND, self.coll, p.tenant):
                if base.get(field, value) == value:
                    lookups.append({**base, field: value})
        calls = [({**base, "agent_id": a}, a) for a in agents] + [(q, None) for q in lookups]
        answers = await asyncio.gather(*(self._lookup(ex, q, owner, reader if purpose == "read" else None,
                                                      purpose == "read", show_expired) for q, owner in calls))
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for answer in answers:
            for row in answer:
                if row["id"] not in seen:
                    seen.add(row["id"])
                    rows.append(row)
        return rows

    async def _lookup(self, ex: Exchange, query: dict[str, str], owner: str | None,
                      reader: tuple[str, str | None, bool] | None, read: bool, show_expired: bool) -> list[dict[str, Any]]:
        """One GET /memories of `_list_rows` (`query`), its memories (`_results`). When the answer is over
        ``BACKEND_MAX_RESPONSE_BYTES`` and the call lists agent `owner`'s memories: `_owner_rows` instead. Raises
        `BackendAnswerTooLarge` (502, naming the limit) for a call of an adopted entity id."""
        try:
            return self._results(ex, await self._call("GET", ["memories"], params=query))
        except BackendAnswerTooLarge:
            if owner is None:
                raise
        return await self._owner_rows(ex, query, owner, reader, read, show_expired)

    OWNER_ROWS_CONCURRENCY = 8  # GET /memories/{id} calls in flight at once for one `_owner_rows`

    async def _owner_rows(self, ex: Exchange, query: dict[str, str], owner: str,
                          reader: tuple[str, str | None, bool] | None, read: bool, show_expired: bool) -> list[dict[str, Any]]:
        """The answer of GET /memories for `query` (agent `owner`'s memories, narrowed by ``user_id``/``run_id``,
        expired ones only with `show_expired`) made memory by memory, for an agent whose memories together are over
        ``BACKEND_MAX_RESPONSE_BYTES``: the rows of `owner` the ledger lists under `reader`'s visibility filter
        (`Ledger.visible_row_ids_of`; None: the tenant's), for a read (`read`) only those the caller may read now
        (decided again, with their stamps, by the caller), in the order the ledger made them, each fetched by
        ``GET /memories/{id}`` — one row per answer, below the limit as every row written under ``MAX_ROW_BYTES`` is
        — and kept when Mem0's list would hold it (its ``agent_id``, ``user_id`` and ``run_id``; an
        ``expiration_date`` before today, UTC, is expired: mem0 ``Memory.get_all``), at most `LIST_LIMIT` as Mem0's
        list. Raises `BackendAnswerTooLarge` when there are more than ``MAX_SCAN_ROWS`` such rows."""
        p = self._p(ex)
        ids = await offloop.call(self.ledger, self.ledger.visible_row_ids_of, BACKEND, self.coll, p.tenant, reader,
                                 owner, self.settings.max_scan_rows)
        if ids is None:
            raise BackendAnswerTooLarge(self.upstream.max_response_bytes)
        if read and ids:
            include_superseded, as_of = history_view(ex.query)
            async with self.authz.prefetched(ex, BACKEND, self.coll, ids):  # one ledger trip off the loop (PostgreSQL)
                known = self.authz.readable_rows(ex, BACKEND, self.coll, ids, include_superseded, as_of, count=False)
        else:
            known = await offloop.call(self.ledger, self._servable, ids)
        ordered = sorted(known.values(), key=lambda r: (r.created_at, r.row_id))
        today = datetime.now(timezone.utc).date()

        def listed(m: Any, mid: str) -> bool:
            if not isinstance(m, dict) or m.get("id") != mid or m.get("agent_id") != query["agent_id"]:
                return False
            if any(key in query and m.get(key) != query[key] for key in ("user_id", "run_id")):
                return False
            return show_expired or not _expired(m.get("expiration_date"), today)

        async def one(mid: str) -> Any:
            try:
                return await self._call("GET", ["memories", mid])
            except BackendClientError as exc:
                if exc.status == 404:
                    return None  # gone from Mem0 meanwhile
                raise

        out: list[dict[str, Any]] = []
        step = self.OWNER_ROWS_CONCURRENCY
        for start in range(0, len(ordered), step):
            batch = [r.row_id for r in ordered[start:start + step]]
            got = await asyncio.gather(*(one(mid) for mid in batch))
            out += [m for mid, m in zip(batch, got) if listed(m, mid)]
            if len(out) >= LIST_LIMIT:
                break
        return well_formed_rows(ex, BACKEND, out[:LIST_LIMIT], lambda r: r.get("id"), self.settings.max_json_depth + 1)

    async def op_list(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self._require(ex, "list")
        q = ex.query
        _only(q, ("user_id", "agent_id", "run_id", "top_k", "show_expired", "include_superseded", "as_of"))
        include_superseded, as_of = history_view(q)
        named = any(q.get(k) not in (None, "*") for k in IDENTITY)
        top_k = _int(q.get("top_k"), "top_k", LIST_DEFAULT_TOP_K if named else LIST_LIMIT, LIST_LIMIT)
        show_expired = bool(_bool_param(q.get("show_expired"), "show_expired"))
        rows = await self._list_rows(ex, q, show_expired)
        ids = [r["id"] for r in rows]
        stamps = {r["id"]: r.get("metadata") for r in rows}
        async with self.authz.prefetched(ex, BACKEND, self.coll, ids):  # one ledger trip off the loop (PostgreSQL)
            allowed = self.authz.readable(ex, BACKEND, self.coll, ids, include_superseded, as_of,
                                          stamps=stamps)
        kept = [r for r in rows if r["id"] in allowed][:top_k]
        await self._decorate(ex, kept)
        ex.row_ids = [r["id"] for r in kept]
        return 200, {"results": kept}

    def _compile(self, p: Principal, filters: Any, top: dict[str, Any]) -> Filter:
        """Validate the client's filters (Mem0's metadata-filter language) into a `Filter`."""
        if filters is None:
            filters = {}
        if not isinstance(filters, dict):
            raise BadRequest("filters must be an object")
        check_filter_size(filters, "filters", self.settings.max_filter_clauses)
        f = Filter()
        clauses: list[tuple[str, Any]] = []
        for key, value in filters.items():
            if key == "AND":
                if not isinstance(value, list) or not value or not all(isinstance(c, dict) for c in value):
                    raise BadRequest("AND must be a non-empty list of conditions")
                for cond in value:
                    clauses += [(k, v) for k, v in cond.items()]
            elif key in ("OR", "NOT"):
                if not isinstance(value, list) or not value or not all(isinstance(c, dict) and c for c in value):
                    raise BadRequest(f"{key} must be a non-empty list of conditions")
                items = [{k: self._simple(p, k, v) for k, v in cond.items()} for cond in value]
                if key == "OR":
                    f.any_of = items
                else:
                    f.none_of = items
            else:
                clauses.append((key, value))
        for key, value in top.items():
            if value is not None:
                clauses.append((key, value))
        for key, value in clauses:
            self._clause(p, f, key, value)
        return f

    def _check_field(self, key: Any) -> None:
        if not isinstance(key, str) or not key or key.startswith("$") or key in ("AND", "OR", "NOT"):
            raise BadRequest(f"filter key {key!r} is not supported (nested logical operators cannot be expressed exactly)")
        if key.startswith(GOVERNED_PREFIX):
            raise BadRequest(f"{key} is governed by memwarden and cannot be filtered on")

    def _simple(self, p: Principal, key: str, value: Any) -> Any:
        """A condition inside OR/NOT: identity fields by plain equality only."""
        self._check_field(key)
        if key in IDENTITY:
            if isinstance(value, dict) and set(value) == {"eq"}:
                value = value["eq"]
            if not isinstance(value, str) or value == "*":
                raise BadRequest(f"{key} inside OR/NOT must be a plain id")
            return self._agent_filter(p, value) if key == "agent_id" else _ident(value, key)
        self._check_value(key, value)
        return value

    @staticmethod
    def _check_value(key: str, value: Any) -> None:
        if isinstance(value, dict):
            if not value or not set(value) <= OPERATORS:
                raise BadRequest(f"unsupported filter operator(s) for {key}: {sorted(set(value) - OPERATORS)}")
            for op, v in value.items():
                ok = (isinstance(v, list) and v and all(isinstance(x, Scalar) for x in v)) if op in ("in", "nin") \
                    else isinstance(v, Scalar)
                if not ok:
                    raise BadRequest(f"bad value for {key}.{op}")
        elif isinstance(value, list):
            if not value or not all(isinstance(x, Scalar) for x in value):
                raise BadRequest(f"bad value for {key}")
        elif not isinstance(value, Scalar):
            raise BadRequest(f"bad value for {key}")

    def _clause(self, p: Principal, f: Filter, key: str, value: Any) -> None:
        self._check_field(key)
        self._check_value(key, value)
        if key in IDENTITY:
            def norm(v: Any) -> str:
                return self._agent_filter(p, v) if key == "agent_id" else _ident(v, key)

            if value == "*":
                return  # wildcard: no constraint; the caller's visibility still applies
            if isinstance(value, list):
                value = {"in": value}
            if not isinstance(value, dict):
                value = {"eq": value}
            for op, v in value.items():
                if op == "eq":
                    if not isinstance(v, str):
                        raise BadRequest(f"{key} must be a string id")
                    ident = norm(v)
                    if f.identity_eq.get(key, ident) != ident:
                        raise BadRequest(f"conflicting conditions on {key}")
                    f.identity_eq[key] = ident
                elif op in ("ne", "in", "nin"):
                    values = v if isinstance(v, list) else [v]
                    if not all(isinstance(x, str) for x in values):
                        raise BadRequest(f"{key} values must be string ids")
                    f.post.append((key, op, {norm(x) for x in values}))
                else:
                    raise BadRequest(f"operator {op} is not supported on {key}")
            return
        if key not in f.fields:
            f.fields[key] = value
            return
        old = f.fields[key]
        a = old if isinstance(old, dict) else {"eq": old} if not isinstance(old, list) else {"in": old}
        b = value if isinstance(value, dict) else {"eq": value} if not isinstance(value, list) else {"in": value}
        if set(a) & set(b):
            raise BadRequest(f"conflicting conditions on {key} cannot be expressed exactly")
        f.fields[key] = {**a, **b}

    def _search_filters(self, p: Principal, f: Filter) -> dict[str, Any]:
        """Mem0 ``filters``: the client's conditions AND the caller's visibility (tenant always; the scope
        predicate of docs/design.md §3 as ``OR`` when pushdown=scope — never in shadow mode — and the client
        used no ``OR``)."""
        out: dict[str, Any] = dict(f.identity_eq)
        if not any(k in out for k in IDENTITY):
            out["agent_id"] = "*"  # Mem0 requires one entity key; "*" constrains nothing
        out.update(f.fields)
        out["mw_tenant"] = p.tenant
        if f.any_of is not None:
            out["OR"] = f.any_of
        else:
            ors = or_of(visibility(p, self.authz.pushdown(self.settings.pushdown)))
            if ors is not None:
                out["OR"] = ors
        if f.none_of is not None:
            out["NOT"] = f.none_of
        return out

    async def op_search(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        p = self._p(ex)
        self._require(ex, "search")
        body = _obj(ex.body)
        _only(body, ("query", "filters", "top_k", "threshold", "explain", "show_expired", *IDENTITY))
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise BadRequest("query must be a non-empty string")
        k = _int(body.get("top_k"), "top_k", SEARCH_DEFAULT_TOP_K)
        include_superseded, as_of = history_view(ex.query)
        compiled = await offloop.call(self.ledger, self._compile, p, body.get("filters"), {key: body.get(key) for key in IDENTITY})
        if k == 0:
            return 200, {"results": []}
        req: dict[str, Any] = {"query": query, "filters": self._search_filters(p, compiled)}
        for key in ("threshold", "explain", "show_expired"):
            if body.get(key) is not None:
                req[key] = body[key]
        fetch = max(k * self.settings.overfetch_factor, 1)
        # id → the ledger row it was allowed on, or None (denied or withheld). A refill is a new Mem0 answer: a
        # memory allowed on an earlier one is kept only while its stamp still agrees with that row, else decided
        # again (an update landed between the two answers).
        decided: dict[str, Row | None] = {}
        ceiling = self.settings.max_scan_rows  # a larger fetch was over BACKEND_MAX_RESPONSE_BYTES: below it
        while True:
            try:
                resp = await self._call("POST", ["search"], json_body={**req, "top_k": fetch}, idempotent=True)
            except BackendAnswerTooLarge:
                if fetch <= k:
                    raise  # the k best matches alone are over the limit
                # Large memories among the over-fetched: asked again for fewer (no fewer than k).
                ceiling, fetch = fetch - 1, max(k, fetch // 2)
                continue
            rows = self._results(ex, resp)
            matching = [r for r in rows if compiled.matches(r)]
            stamps = {r["id"]: r.get("metadata") for r in matching}
            wanted = [i for i, meta in stamps.items()
                      if i not in decided or (decided[i] is not None and not stamped_as(meta, decided[i]))]
            if wanted:
                async with self.authz.prefetched(ex, BACKEND, self.coll, wanted):  # one ledger trip off the loop (PostgreSQL)
                    allowed = self.authz.readable_rows(ex, BACKEND, self.coll, wanted, include_superseded, as_of,
                                                       stamps=stamps)
                decided.update({i: allowed.get(i) for i in wanted})
            kept = [r for r in matching if decided[r["id"]] is not None]
            if len(kept) >= k or len(rows) < fetch or fetch >= ceiling:
                break  # at the ceiling: the readable memories found so far (a larger answer is over the limit)
            fetch = min(fetch * 2, ceiling)  # refill: Mem0 search has no offset
        kept = kept[:k]
        await self._decorate(ex, kept)
        ex.row_ids = [r["id"] for r in kept]
        return 200, {"results": kept}

    # -- deletes ----------------------------------------------------------------------------
    async def _backend_delete(self, ids: list[str]) -> int:
        """Delete tombstoned memories of this deployment in Mem0, per id, confirming each in the ledger
        (`sidecar.core.deletes.backend_delete`). Returns the number confirmed."""
        return await deletes.backend_delete(self, self.client, [(self.coll, mid) for mid in ids])

    async def op_delete(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        mid = params["memory_id"]
        # Cedar's delete decides (an owner may delete a restricted row it cannot read); a denied delete is
        # 404 unless the caller can read the row, so missing, foreign and deleted ids answer alike.
        decided = await offloop.call(self.ledger, deletes.decide, self, ex, self.coll, [mid], by_ids=True)
        if not decided.allowed:
            if decided.refused[-1][1] in deletes.BEFORE_CEDAR:
                raise NotFound(NOT_FOUND, reason="unknown_row")
            raise NotFound(NOT_FOUND)
        await deletes.delete_rows(self, ex, self.coll, decided.allowed, self.client)
        return 200, {"message": "Memory deleted successfully"}

    async def _delete_matching(self, ex: Exchange, rows: list[dict[str, Any]]) -> int:
        ids = list(dict.fromkeys(r["id"] for r in rows))
        decided = await offloop.call(self.ledger, deletes.decide, self, ex, self.coll, ids, by_ids=False)
        return await deletes.delete_rows(self, ex, self.coll, decided.allowed, self.client)

    async def op_delete_all(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self._require(ex, "delete_bulk")
        q = ex.query
        _only(q, IDENTITY)
        if not any(q.get(k) not in (None, "*") for k in IDENTITY):
            raise BadRequest("At least one identifier is required.")
        rows = await self._list_rows(ex, q, show_expired=True, purpose="delete")
        n = await self._delete_matching(ex, rows)
        return 200, {"message": "All relevant memories deleted", "deleted": n}

    async def op_reset(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        # Mem0's /reset drops every tenant's memories: only an operator's reset (a deployment action) calls it;
        # once Mem0 answered 2xx every memory of the deployment is tombstoned (its backend delete confirmed). A
        # refused or failed reset changes nothing in the ledger. A tenant admin resets its tenant, per id (deletes:
        # tombstoned first, as every delete).
        p = self._p(ex)
        if p.kind == "operator":
            await deletes.reset(self, ex, self.deployment, self.coll, lambda: self._call("POST", ["reset"]))
            return 200, {"message": "All memories reset"}
        self._require(ex, "admin")
        rows = await self._list_rows(ex, {}, show_expired=True, purpose="delete")
        n = await self._delete_matching(ex, rows)
        return 200, {"message": "All memories reset", "deleted": n}

    # -- deployment configuration and the rest ------------------------------------------------
    async def op_configure_get(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        # The shared deployment's configuration (vector store, LLM, embedder of every tenant): a deployment action.
        self.authz.require_deployment(ex, "configure", self.deployment)
        return 200, await self._call("GET", ["configure"])

    async def op_configure_set(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self.authz.require_deployment(ex, "configure", self.deployment)
        return 200, await self._call("POST", ["configure"], json_body=_obj(ex.body))

    async def op_providers(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        # The providers Mem0 supports (static, no deployment state): any tenant principal (list) or an operator.
        if self._p(ex).kind == "operator":
            self.authz.require_deployment(ex, "configure", self.deployment)
        else:
            self._require(ex, "list")
        return 200, await self._call("GET", ["configure", "providers"])

    async def op_generate_instructions(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        # A tenant admin's request (admin): it reads and changes no deployment state and no other tenant's
        # data — the deployment's LLM turns the caller's use_case into instructions it returns.
        self._require(ex, "admin")
        body = _obj(ex.body)
        _only(body, ("use_case",))
        return 200, await self._call("POST", ["generate-instructions"], json_body=body)

    async def op_blocked(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        raise Forbidden("this operation is not available through memwarden", reason="blocked_route")

    async def reconcile(self) -> int:
        """Retry Mem0 deletes of tombstones not yet confirmed (deletion closures included), then look for
        tombstoned memories that reappeared in Mem0 (a lost delete, a restore): each is logged as an
        alert and deleted again; never served either way (the ledger says deleted). Mem0 has no batch
        get, so each run checks at most `REAPPEARANCE_CHECKS_PER_RUN` confirmed tombstones, one
        ``GET /memories/{id}`` each, resuming where the previous run stopped (wrapping around).
        Returns the number of Mem0 deletes issued."""
        done = await deletes.retry_pending(self, self.client)  # this deployment's (`Mem0Client.holds`)
        return done + await deletes.recheck(self, self.client, self._reappearance, REAPPEARANCE_CHECKS_PER_RUN)

    def lineage_collection(self, ex: Exchange) -> str:
        """The deployment's collection (``?collection`` may name only it), after the ``list`` decision."""
        if ex.query.get("collection", self.coll) != self.coll:
            raise NotFound(NOT_FOUND, reason="unknown_collection")
        self._require(ex, "list")
        return self.coll
