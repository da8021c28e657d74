"""Stages 4 and 7 — authorize the request, and the row-level decisions used by the filter stage.

Every decision goes through the PDP (`sidecar.policy_reload.PolicyHandle`, the policy set in force);
only ``Allow`` passes. A request is decided by one policy set: the one in force at its first Cedar
call (pinned on the exchange). Row decisions are one batched Cedar call per response. Rows the ledger
does not know, write reservations (``pending``) and ``deleted`` rows are dropped before Cedar is
asked; ``superseded`` rows are dropped unless the caller asked for them. Each outcome is recorded on
the exchange for the decision log (counts, reasons, evaluation errors, shadow would-denies).
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping

import structlog

from sidecar.errors import Forbidden, Unauthorized
from sidecar.exchange import Exchange
from sidecar.governance import Principal, Row, deployment_entity, fleet_entity, row_entities, stamped_as
from sidecar.ledger import Ledger, offloop
from sidecar.policy import CedarRequest, Decision, canonical_json
from sidecar.stages.canonicalize import well_formed

if TYPE_CHECKING:
    from sidecar.policy_reload import PolicyHandle

log = structlog.get_logger("memwarden.authz")
UNKNOWN_ROW, DELETED_ROW, SUPERSEDED_ROW = "unknown_row", "deleted_row", "superseded_row"
# A row whose governance as the backend answered it (the stamp written with its content) is not the ledger's: an
# update is between its backend write and its ledger write, or the two disagree after a failed one. Never served.
CHANGING_ROW = "changing_row"
_CAP = 20  # evaluation errors kept per decision-log event
_IDS = 100  # row ids kept per list of a decision-log event (`sidecar.decisionlog.IDS_MAX`)
MAX_ROW_DEPTH = 32


def tally(counts: dict[str, int], reason: str, n: int = 1) -> None:
    counts[reason] = counts.get(reason, 0) + n


def note_action(ex: Exchange, action: str) -> None:
    """Add `action` to the Cedar actions decided for `ex` (``actions``, in the order first asked)."""
    actions = ex.actions
    if action not in actions:
        actions.append(action)


def settle_rows(ex: Exchange, allowed: list[str], refused: list[tuple[str, str]]) -> None:
    """The row counts of an operation that acts on rows (write, update, delete), by the one counting rule of
    the decision log (`sidecar.decisionlog`): each row the request named or matched once, by its outcome —
    `allowed` (ids whose every decision allowed) and `refused` ((id, reason) pairs: a Cedar reason counts in
    ``rows_denied``; ``unknown_row`` in ``rows_unknown``; ``superseded_row`` in ``rows_hidden_superseded``;
    ``deleted_row`` and ``changing_row`` in ``rows_hidden_deleted``). Replaces what the request's auxiliary
    checks (the read check before an update or a delete) counted; ``row_ids`` and ``denied_row_ids`` keep
    the first `_IDS` ids of each."""
    reasons: dict[str, int] = {}
    denied = unknown = superseded = hidden = 0
    for _, reason in refused:
        reasons[reason] = reasons.get(reason, 0) + 1
        if reason == UNKNOWN_ROW:
            unknown += 1
        elif reason == SUPERSEDED_ROW:
            superseded += 1
        elif reason in (DELETED_ROW, CHANGING_ROW):
            hidden += 1
        else:
            denied += 1
    ex.rows_allowed, ex.rows_denied, ex.rows_unknown = len(allowed), denied, unknown
    ex.rows_hidden_superseded, ex.rows_hidden_deleted = superseded, hidden
    ex.row_deny_reasons = reasons
    ex.row_ids = list(allowed[:_IDS])
    ex.denied_row_ids = [i for i, _ in refused[:_IDS]]


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



# The exchange's fields a failed key re-check resets (to a new exchange's values): every field but the
# request itself (method, path, parsed input), its identity and timing, what it stripped, and the per-read
# ledger state the read's own code drops. A field added to `Exchange` is reset unless listed here.
_REQUEST_FIELDS = frozenset({"method", "raw_path", "client", "auth", "key_id", "segments", "query", "headers", "body",
                             "ledger_rows", "prefetched", "prefetched_owners", "key_recheck", "stripped_headers",
                             "request_id", "started_ns"})
_DECISION_FIELDS = tuple(f.name for f in dataclasses.fields(Exchange) if f.name not in _REQUEST_FIELDS)


class Authorizer:
    """Builds Cedar requests and entity stores from the ledger and asks the PDP."""

    def __init__(self, policy: "PolicyHandle", ledger: Ledger) -> None:
        self.policy = policy
        self.ledger = ledger
        # (method, canonical segments) -> whether the request is a read whose key re-check may ride on its
        # first ledger read (`authenticate`); set by the backend profile, which ends such requests with `settle`.
        self.deferrable: Callable[[str, list[str]], bool] = lambda method, segments: False
        # (ledger, whether it re-checks keys with its rows: has ``verified_principal`` and ``read_rows``),
        # found once per ledger object: the caching and instrumenting wrappers answer ``hasattr`` by
        # forwarding (and, on SQLite, raising AttributeError) at every call.
        self._recheck_capable: tuple[Any, bool] | None = None
        # (ledger, whether it has ``read_rows``: PostgreSQL), found once per ledger object for the same reason.
        self._read_rows_capable: tuple[Any, bool] | None = None
        # (ledger, whether it lists admitted rows with their rows in one statement, ``visible_rows``: PostgreSQL).
        self._visible_rows_capable: tuple[Any, bool] | None = None
        # The last principal `require_keyed` hashed (a frozen `Principal`: it hashes again), so a caller's
        # repeated decisions hash it once in the memo look-up, not twice per decision.
        self._hashable: Any = None

    def _has_read_rows(self) -> bool:
        """Whether the ledger reads rows, owners and a key re-check in one statement (``read_rows``)."""
        ledger = self.ledger
        capable = self._read_rows_capable
        if capable is None or capable[0] is not ledger:
            capable = self._read_rows_capable = (ledger, hasattr(ledger, "read_rows"))
        return capable[1]

    def lists_rows(self) -> bool:
        """Whether a read's ledger rows cost a round trip of their own (`prefetch`: PostgreSQL) and the ledger can
        list a filter's admitted rows together with those rows in one statement (``visible_rows``), so that
        `visible_rows` makes the read's only trip."""
        ledger = self.ledger
        capable = self._visible_rows_capable
        if capable is None or capable[0] is not ledger:
            capable = self._visible_rows_capable = (ledger, self._has_read_rows() and hasattr(ledger, "visible_rows"))
        return capable[1]

    async def visible_rows(self, ex: Exchange, backend: str, collection_id: str, tenant: str,
                           reader: tuple[str, str | None, bool] | None, limit: int) -> list[str] | None:
        """The ids of the rows of (backend, collection) the visibility filter admits (`Ledger.visible_row_ids`'s
        list), or None when more than `limit` are; read in one ledger round trip (`offloop.visible_rows`) together
        with those rows, their owners and the key re-check `authenticate` deferred, which are kept for the read in
        progress exactly as `prefetch` keeps what it reads: its later `prefetch` of any of these ids reads nothing
        more. Only where `lists_rows`. Raises `Unauthorized` (401) if the key was revoked, `LedgerUnavailable`
        (503) when the ledger cannot answer."""
        recheck = ex.key_recheck[0] if ex.key_recheck is not None else None
        listed = await offloop.visible_rows(self.ledger, backend, collection_id, tenant, reader, limit, recheck)
        if listed is None:
            return None
        ids, rows, owners, key_ok = listed
        self._rechecked(ex, key_ok)
        self._keep_prefetched(ex, backend, collection_id, ids, rows, owners)
        return ids

    @staticmethod
    def _keep_prefetched(ex: Exchange, backend: str, collection_id: str, ids: list[str], rows: dict[str, Row],
                         owners: dict[str, dict[str, Any]]) -> None:
        pre = ex.prefetched.setdefault((backend, collection_id), {})
        for i in ids:
            pre[i] = rows.get(i)  # None: not governed by the ledger (asked, not missing)
        for row in rows.values():
            ex.prefetched_owners[row.owner] = owners.get(row.owner)  # None: no such agent (asked)

    async def authenticate(self, ex: Exchange, key: str) -> Principal | None:
        """The principal of API key `key`, or None (unknown, revoked, malformed).

        Normally read from the ledger now (`offloop.authenticate`: one round trip, awaited on the
        asynchronous pool or in a worker thread on PostgreSQL). For a read the profile marks `deferrable`,
        on a ledger whose `read_rows` can re-check a key (PostgreSQL), a principal this process verified
        earlier (`CachingLedger.verified_principal`, kept under the caches' invalidation rules) is used at
        once and the key is re-checked in the same statement as the read's first ledger rows (`prefetch`)
        or, when the read fetched none, by `settle` before the answer leaves: a key revoked by any replica
        fails that very request with 401, nothing of the read is served, and the read costs one ledger
        round trip. Raises `LedgerUnavailable` (503)."""
        ledger = self.ledger
        capable = self._recheck_capable
        if capable is None or capable[0] is not ledger:
            capable = self._recheck_capable = (
                ledger, getattr(ledger, "verified_principal", None) is not None and self._has_read_rows())
        if capable[1] and self.deferrable(ex.method, ex.segments):
            p = ledger.verified_principal(key)
            if p is not None:
                ex.key_recheck = (p.key_id, key)
                return p
        return await offloop.authenticate(self.ledger, key)

    async def warm_collection(self, backend: str, collection_id: str) -> None:
        """On a ledger that does network I/O, read collection `collection_id` into the collections cache in a
        worker thread when it is not there, so the handler's own (synchronous) lookup does not block the
        event loop. Raises `LedgerUnavailable` (503)."""
        cached = getattr(self.ledger, "cached_collection", None)
        if cached is None or not offloop.blocking(self.ledger) or cached(backend, collection_id):
            return
        await offloop.call(self.ledger, self.ledger.get_collection, backend, collection_id)

    def _rechecked(self, ex: Exchange, key_ok: bool) -> None:
        """Settle a pending key re-check with its answer: 401 (and the kept principal dropped) if the key is
        no longer valid."""
        pending, ex.key_recheck = ex.key_recheck, None
        if pending is not None and not key_ok:
            forget = getattr(self.ledger, "forget_key", None)
            if forget is not None:
                forget(pending[1])
            # Logged as a first-check 401 is: unauthenticated, nothing routed, decided or counted.
            fresh = Exchange(method=ex.method, raw_path=ex.raw_path)
            for name in _DECISION_FIELDS:
                setattr(ex, name, getattr(fresh, name))
            raise Unauthorized("unknown or revoked API key")

    async def settle(self, ex: Exchange) -> None:
        """Re-check the caller's key now if `authenticate` deferred it and no `prefetch` did it (one round
        trip); raises `Unauthorized` (401) if it was revoked, `LedgerUnavailable` (503)."""
        if ex.key_recheck is not None:
            _, _, key_ok = await offloop.read_rows(self.ledger, "", "", [], ex.key_recheck[0],
                                                   has_read_rows=self._has_read_rows())
            self._rechecked(ex, key_ok)

    def pushdown(self, configured: str) -> str:
        """The visibility filter to send to the backend: `configured` (``scope`` or ``tenant``), widened to
        ``tenant`` in shadow mode, so every row of the tenant that enforcement would hide reaches Cedar and
        is served and logged as a would-deny instead of never being fetched."""
        return "tenant" if getattr(self.policy, "shadow", False) else configured

    def require_deployment(self, ex: Exchange, action: str, deployment: str) -> None:
        """Decision on a deployment-wide action (``configure``, ``reset``, ``manage_tenants``) on
        ``Deployment::"<deployment>"``; the default policies permit these to operators only."""
        self.require(ex, action, deployment_entity(deployment))

    def decide(self, ex: Exchange, requests: list[CedarRequest], entities: list[dict[str, Any]]) -> list[Decision]:
        """Ask the PDP under the exchange's policy set and record every answer on `ex`."""
        if ex.policy_set is None:
            ex.policy_set = self.policy.current
        for r in requests:
            note_action(ex, r.action)
        return self._record(ex, requests, self.policy.decide(requests, entities, ex.policy_set))

    def _record(self, ex: Exchange, requests: list[CedarRequest], decisions: list[Decision]) -> list[Decision]:
        """Record the answers to `requests` on `ex` (policies, errors, denials, shadow would-denies)."""
        errors = 0
        for r, d in zip(requests, decisions):
            ex.policies.update(d.policies)
            if d.errors:
                errors += 1
                ex.evaluation_errors.extend(e for e in d.errors if e not in ex.evaluation_errors)
                del ex.evaluation_errors[_CAP:]
            if not d.allowed:
                ex.deny_policies.update(d.policies or d.error_policies)
                ex.reason = d.reason  # the latest denial explains a refusal raised right after it
                ex.deny_action = r.action
            elif d.would_deny:
                if (r.action, r.resource) in ex.would_deny_seen:
                    continue  # decided again in this request (ledger row, then fetched row): counted once
                ex.would_deny_seen.add((r.action, r.resource))
                ex.would_deny += 1
                tally(ex.would_deny_reasons, d.reason)
                ex.deny_policies.update(p for p in d.policies if p != "shadow-mode:would-deny")
                if r.resource[0] == "Memory" and len(ex.would_deny_row_ids) < _IDS:
                    ex.would_deny_row_ids.append(r.resource[1].split(":", 2)[-1])  # "<backend>:<collection>:<row id>"
        if errors:
            log.warning("cedar_evaluation_error", request_id=ex.request_id, actions=sorted({r.action for r in requests}),
                        count=errors, policies=sorted({p for d in decisions for p in d.error_policies}),
                        policy_sha256=ex.policy_set.sha256)
        shadowed = [(r, d) for r, d in zip(requests, decisions) if d.would_deny]
        if shadowed:
            log.warning("shadow_would_deny", request_id=ex.request_id, principal=ex.principal.describe() if ex.principal else None,
                        actions=sorted({r.action for r, _ in shadowed}), count=len(shadowed),
                        reasons=sorted({d.reason for _, d in shadowed}),
                        resources=[f"{r.resource[0]}::{r.resource[1]}" for r, _ in shadowed[:_CAP]],
                        policies=sorted({p for _, d in shadowed for p in d.policies}),
                        errors=[e for _, d in shadowed for e in d.errors][:5])
        return decisions

    @staticmethod
    def request_batch(p: Principal, action: str, resource: dict[str, Any], extra: list[dict[str, Any]] | None = None
                      ) -> tuple[list[CedarRequest], list[dict[str, Any]]]:
        """The Cedar request and entity store of a request-level decision on `resource` (a Cedar JSON entity)."""
        uid = resource["uid"]
        return [CedarRequest(p.uid, action, (uid["type"], uid["id"]))], p.entities() + [resource] + list(extra or [])

    def row_batch(self, p: Principal, action: str, rows: list[Row], contexts: list[dict[str, Any]] | None = None,
                  owners: dict[str, dict[str, Any]] | None = None, extra_rows: list[Row] | None = None
                  ) -> tuple[list[CedarRequest], list[dict[str, Any]]]:
        """The Cedar requests (one per row, in order) and the shared entity store of a row decision: the
        principal with its ancestors, the rows, their fleets, their owners as the ledger knows them, and
        every fleet a context names (a redistribute's target) with its tenant. `owners`: the owners'
        entities if already looked up; `extra_rows`: rows whose fleets and owners join the store (the
        other members of the rows' governance classes, `decide_rows`)."""
        if owners is None:
            owners = self.ledger.agent_entities({r.owner for r in rows})
        entities = row_entities(p, rows, owners, extra_rows)
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
        requests = [CedarRequest(p.uid, action, r.uid, contexts[i] if contexts else None) for i, r in enumerate(rows)]
        return requests, entities

    def require(self, ex: Exchange, action: str, resource: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> None:
        """Request-level decision on `resource` (a Cedar JSON entity). Raises `Forbidden` unless Allow."""
        p = ex.principal
        assert p is not None
        uid = resource["uid"]
        self._required(ex, action, uid["type"], uid["id"], self._request_decision(ex, p, action, resource, extra))

    def require_keyed(self, ex: Exchange, action: str, resource_uid: tuple[str, str], key: tuple[Any, ...],
                      build: Callable[[], tuple[dict[str, Any], list[dict[str, Any]] | None]]) -> None:
        """``require(ex, action, *build())`` without building the entities when the answer is memoised:
        `key` (a hashable tuple) must determine what ``build()`` returns — (resource, extra), the resource's
        uid being `resource_uid` (type, id) — e.g. ``("Collection", backend, collection id, tenant,
        database)`` for `sidecar.governance.collection_entity` and its namespace; ``build`` is called only
        when Cedar has to be asked (a new key, shadow mode) or the key cannot be hashed. Raises `Forbidden`
        unless Allow."""
        p = ex.principal
        assert p is not None
        decision = None
        if getattr(self.policy, "decide_request", None) is not None:
            try:
                # hash((p, action, key)) raises iff hashing p, action or key does; p is hashed once per
                # principal object (`_hashable`: the last one that hashed; frozen, so it hashes again), the
                # memo look-up hashes the whole key anyway.
                if p is not self._hashable:
                    hash(p)
                    if type(p) is Principal:
                        self._hashable = p
                hash((action, key))
                memo_key: Any = (p, action, key)
            except TypeError:
                memo_key = None
            if memo_key is not None:
                decision = self._keyed_decision(ex, p, action, resource_uid, memo_key,
                                                lambda: self._store(p, build()))
        if decision is None:
            resource, extra = build()
            decision = self._request_decision(ex, p, action, resource, extra)
        self._required(ex, action, resource_uid[0], resource_uid[1], decision)

    @staticmethod
    def _required(ex: Exchange, action: str, rtype: str, rid: str, decision: Decision) -> None:
        # The operation's action stays the one its profile named (`Exchange.action`); one that names none
        # is logged under its first request-level action.
        if ex.action is None:
            ex.action = action
        ex.resource = f"{rtype}::{rid}"
        acts = ex.actions
        if action not in acts:
            acts.append(action)
        if not decision.allowed:
            ex.decision = "deny"
            ex.deny_action = action
            raise Forbidden(f"{action} is not permitted", reason=decision.reason)
        ex.decision = "allow"

    @staticmethod
    def _store(p: Principal, built: tuple[dict[str, Any], list[dict[str, Any]] | None]) -> list[dict[str, Any]]:
        """The entity store of `request_batch` for (resource, extra) `built`."""
        resource, extra = built
        return p.entities() + [resource] + list(extra or [])

    def _request_decision(self, ex: Exchange, p: Principal, action: str, resource: dict[str, Any],
                          extra: list[dict[str, Any]] | None) -> Decision:
        """The recorded decision of `require`. Memoised on (principal, action, canonical JSON of the resource
        and `extra`) — which determine the Cedar request and entity store `request_batch` builds (the
        principal's entities are a function of its fields) — so a repeated decision builds neither the
        principal's entities nor the store's JSON (`PolicyHandle.decide_request`)."""
        decide_request = getattr(self.policy, "decide_request", None)
        try:
            key = (p, action, canonical_json([resource, *(extra or ())])) if decide_request is not None else None
            hash(key)
        except TypeError:  # a principal that cannot be a key: the general path
            key = None
        if key is None:
            return self.decide(ex, *self.request_batch(p, action, resource, extra))[0]
        uid = resource["uid"]
        return self._keyed_decision(ex, p, action, (uid["type"], uid["id"]), key,
                                    lambda: self.request_batch(p, action, resource, extra)[1])

    def _keyed_decision(self, ex: Exchange, p: Principal, action: str, resource_uid: tuple[str, str], key: Any,
                        entities: Callable[[], list[dict[str, Any]]]) -> Decision:
        """`PolicyHandle.decide_request` of `p` doing `action` on `resource_uid` under the exchange's policy
        set, memoised on `key`, recorded on `ex` as `_record` records it. The Cedar request object is built
        only when it is needed: to ask Cedar, or to record an answer with evaluation errors or a shadow
        would-deny (`_record` reads it then); an answer without either is recorded from the decision alone."""
        if ex.policy_set is None:
            ex.policy_set = self.policy.current
        made: list[CedarRequest] = []

        def request() -> CedarRequest:
            if not made:
                made.append(CedarRequest(p.uid, action, resource_uid))
            return made[0]
        decision = self.policy.decide_request(key, action, request, entities, ex.policy_set)
        if decision.errors or decision.would_deny:
            return self._record(ex, [request()], [decision])[0]
        return self._record_request(ex, p, action, resource_uid, decision)

    @staticmethod
    def _record_request(ex: Exchange, p: Principal, action: str, resource_uid: tuple[str, str], decision: Decision
                        ) -> Decision:
        """`_record` of the one answer `decision` to `p` doing `action` on `resource_uid`, which has no
        evaluation errors and no shadow would-deny (then `_record` reads only its policies, and a denial's
        reason), without a Cedar request object. Returns `decision`."""
        ex.policies.update(decision.policies)
        if not decision.allowed:
            ex.deny_policies.update(decision.policies or decision.error_policies)
            ex.reason = decision.reason
            ex.deny_action = action
        return decision

    def decide_rows(self, ex: Exchange, action: str, rows: list[Row], contexts: list[dict[str, Any]] | None = None) -> list[Decision]:
        """One decision of `action` per row (in order). `contexts` per row, optional.

        Without contexts, and when the gate found the policy set decides rows by governance class
        (`invariants.classes`: no policy tells apart rows that agree on the attributes it reads and on
        their ancestors), rows are grouped by class key and Cedar is asked once per class not already
        known — one batched call — with the same entity store a per-row batch would have, less the other
        rows of each class (which no expression can reach: the schema has no ``Memory``-typed attribute).
        Answers without evaluation errors or shadow would-denies are kept per (principal, action, class)
        on the policy set's engine, so a reload drops them. Otherwise: one batched call, one request per row."""
        assert ex.principal is not None
        if not rows:
            return []
        if ex.policy_set is None:
            ex.policy_set = self.policy.current
        acts = ex.actions
        if action not in acts:
            acts.append(action)
        engine = ex.policy_set.engine
        attrs = getattr(engine, "row_classes", None)
        if contexts is not None or attrs is None:
            return self.decide(ex, *self.row_batch(ex.principal, action, rows, contexts, self.owners(ex, rows)))
        p = ex.principal
        owners = self.owners(ex, rows)
        by_owner = "owner" in attrs
        # Rows are first grouped by the very tuple `class_values` answered (one object per class while it is
        # kept there; a row it computes afresh gets a group of its own), by identity: an int key, where the
        # class key itself is a nested tuple hashed at every look-up. Each group's class key is then built
        # once and the groups deduplicated by key equality, in the order of their first row, as before.
        # `held` keeps every tuple alive until the end, so no identity is reused within the call.
        slot_of: dict[int, int] = {}
        held: list[tuple[Any, ...]] = []
        group_rows: list[Row] = []
        index: list[int] = []
        for row in rows:
            values = class_values(row, attrs)
            i = slot_of.get(id(values))
            if i is None:
                i = slot_of[id(values)] = len(held)
                held.append(values)
                group_rows.append(row)
            index.append(i)
        head = (p.kind, p.uid, p.trust, p.roles, action)
        memo: dict[Any, Decision] = engine.class_memo
        owner_keys: dict[str, str | None] = {}
        keys: list[Any] = []
        known: dict[Any, Decision] = {}
        wanted: dict[Any, Row] = {}
        for values, row in zip(held, group_rows):
            if by_owner:
                owner = row.owner
                okey = owner_keys.get(owner, _NO_KEY)
                if okey is _NO_KEY:
                    okey = owner_keys[owner] = canonical_json(owners[owner]) if owner in owners else None
                k = (head, values + (okey,))
            else:
                k = (head, values)
            keys.append(k)
            if k in known or k in wanted:
                continue
            d = memo.get(k)
            if d is None:
                wanted[k] = row
            else:
                known[k] = d
        if wanted:
            reps = list(wanted.values())
            requests, entities = self.row_batch(p, action, reps, None, owners, extra_rows=rows)
            for k, d in zip(wanted, self.policy.decide(requests, entities, ex.policy_set)):
                known[k] = d
                if not d.errors and not d.would_deny:
                    if len(memo) >= CLASS_MEMO_SIZE:
                        memo.clear()
                    memo[k] = d
        group_decisions = [known[k] for k in keys]
        decisions = [group_decisions[i] for i in index]
        return self._record_rows(ex, p, action, rows, decisions, group_decisions)

    def _record_rows(self, ex: Exchange, p: Principal, action: str, rows: list[Row], decisions: list[Decision],
                     distinct: list[Decision] | None = None) -> list[Decision]:
        """`_record` of `decisions` (one per row of `rows`, asked as `p` for `action`), without building the
        rows' Cedar requests when no decision has an evaluation error or a shadow would-deny (then `_record`
        reads only the decisions: their policies, and the reason of the latest denial). `distinct`: every
        decision object of `decisions`, in the order of first appearance there (repeats allowed), when the
        caller has them. Returns `decisions`."""
        if distinct is None:
            distinct = decisions
        if any(d.errors or d.would_deny for d in distinct):
            return self._record(ex, [CedarRequest(p.uid, action, r.uid) for r in rows], decisions)
        seen: dict[int, Decision] = {}
        denied = False
        for d in distinct:
            if id(d) in seen:  # rows of one class share their Decision object
                continue
            seen[id(d)] = d
            ex.policies.update(d.policies)
            if not d.allowed:
                denied = True
                ex.deny_policies.update(d.policies or d.error_policies)
        if denied:
            for d in reversed(decisions):
                if not d.allowed:
                    ex.reason = d.reason  # the latest denial's
                    break
            ex.deny_action = action
        return decisions

    async def prefetch(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str], always: bool = False) -> None:
        """Read the ledger rows of `row_ids` and their owners' agent entities in one ledger round trip
        that does not block the event loop (`sidecar.ledger.offloop.read_rows`: one statement on
        PostgreSQL's asynchronous pool, or one worker-thread trip), for the `readable_rows` calls of the
        read in progress; only on PostgreSQL (`offloop.blocking`, `offloop.asynchronous`, or inline
        with ``ledger_off_loop=false`` — still one statement). The rows are fetched now, on this
        request, never taken from an earlier one; the caller drops them (`release`) when its read ends.
        A key re-check `authenticate` deferred is made in
        the same statement (`Unauthorized`, 401, if the key was revoked). When every id's row was read on this
        request already and is still kept (`visible_rows` listed it; no re-check pending), nothing is read.
        Raises `LedgerUnavailable` (503) when the ledger cannot answer."""
        if not row_ids or not (always or offloop.asynchronous(self.ledger) or offloop.blocking(self.ledger)
                               or self._has_read_rows()):
            return
        pre = ex.prefetched.get((backend, collection_id))
        if pre is not None and ex.key_recheck is None and all(i in pre for i in row_ids):
            return  # read on this request already, not yet released (`visible_rows`): nothing more to read
        ids = list(dict.fromkeys(row_ids))
        recheck = ex.key_recheck[0] if ex.key_recheck is not None else None
        rows, owners, key_ok = await offloop.read_rows(self.ledger, backend, collection_id, ids, recheck,
                                                       has_read_rows=self._has_read_rows())
        self._rechecked(ex, key_ok)
        self._keep_prefetched(ex, backend, collection_id, ids, rows, owners)

    def start_prefetch(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str]) -> "asyncio.Task[None]":
        """`prefetch` the rows of `row_ids` (on every ledger: `always`) as a task that runs while the caller
        awaits the backend, for a read whose ids are known before the backend answers (a Chroma get by
        ids): the ledger read overlaps the backend call instead of following it. The rows are still read on
        this request, before any of them is decided. The caller awaits the task before deciding (it raises
        what `prefetch` raises: 401, 503) and `release`s the rows after; if the read ends first, it calls
        `abandon`."""
        return asyncio.ensure_future(self.prefetch(ex, backend, collection_id, row_ids, always=True))

    @staticmethod
    async def abandon(task: "asyncio.Task[None]") -> None:
        """End a `start_prefetch` task whose read failed or ended before deciding: cancelled, waited for, its
        own error dropped (the read's error is the one raised). A cancellation of the caller still propagates."""
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    def release(ex: Exchange, backend: str, collection_id: str) -> None:
        """Drop the rows `prefetch` read for (backend, collection)."""
        ex.prefetched.pop((backend, collection_id), None)
        ex.prefetched_owners.clear()

    @asynccontextmanager
    async def prefetched(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str]) -> AsyncIterator[None]:
        """``async with``: `prefetch` the rows of `row_ids` for the decisions made inside the block, and
        `release` them when it ends, however it ends. Raises what `prefetch` raises (401, 503)."""
        await self.prefetch(ex, backend, collection_id, row_ids)
        try:
            yield
        finally:
            self.release(ex, backend, collection_id)

    def owners(self, ex: Exchange, rows: list[Row]) -> dict[str, dict[str, Any]]:
        """The agent entities of the owners of `rows` that the ledger knows: those `prefetch` read for the
        read in progress when it read them all, else one ledger call."""
        uids = {r.owner for r in rows}
        pre = ex.prefetched_owners
        if uids and all(u in pre for u in uids):
            return {u: pre[u] for u in uids if pre[u] is not None}
        return self.ledger.agent_entities(uids)

    def readable(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str],
                 include_superseded: bool = False, as_of: int | None = None, count: bool = True,
                 stamps: Mapping[str, Any] | None = None, refusals: list[tuple[str, str]] | None = None) -> set[str]:
        """The subset of `row_ids` the principal may read now (ledger lookup + one batched ``read``)."""
        return set(self.readable_rows(ex, backend, collection_id, row_ids, include_superseded, as_of, count, stamps,
                                      refusals))

    def readable_rows(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str],
                      include_superseded: bool = False, as_of: int | None = None, count: bool = True,
                      stamps: Mapping[str, Any] | None = None, refusals: list[tuple[str, str]] | None = None
                      ) -> dict[str, Row]:
        """Like `readable`, returning the ledger rows. By default only ``active`` rows are servable;
        `include_superseded` adds superseded ones; `as_of` (UTC µs) serves the rows that were current
        then (created by then and not yet superseded). Deleted and pending rows are never servable.
        `stamps` (id → the metadata the backend answered with the row's content, when the answer depends on
        content): a ledger row whose governance is not the one that metadata was stamped under
        (`sidecar.governance.stamped_as`) is withheld (`CHANGING_ROW`: never decided on, never served).

        With `count` (the rows a response is made of, not auxiliary checks such as links to other rows)
        the outcome of every id is added to the exchange: ``rows_allowed``, ``rows_denied`` (Cedar),
        ``rows_hidden_superseded``, ``rows_hidden_deleted`` (tombstoned, pending or changing), ``rows_unknown``
        (not governed by the ledger), and their reasons in ``row_deny_reasons``; the refused ids (Cedar's denials,
        then the withheld ids) to ``denied_row_ids`` (up to `_IDS`). `refusals`, when given, gets an (id, reason)
        pair for every id not readable (`settle_rows` takes them)."""
        if not row_ids:
            return {}
        pre = ex.prefetched.get((backend, collection_id))
        if pre is not None and all(i in pre for i in row_ids):
            known = {i: pre[i] for i in row_ids if pre[i] is not None}
        else:
            known = self.ledger.get_rows(backend, collection_id, row_ids)
        if count:
            seen = ex.ledger_rows
            for i, r in known.items():
                seen[(backend, collection_id, i)] = r
        # One pass over the ids: the servable rows go to Cedar; every other id is withheld with its reason.
        candidates: list[Row] = []
        withheld: list[str] = []
        withheld_ids: list[str] = []
        current = as_of is None  # then an active row is servable (`servable`), without the call
        for i in dict.fromkeys(row_ids):
            row = known.get(i)
            if row is None:
                withheld.append(UNKNOWN_ROW)
                withheld_ids.append(i)
            elif not ((current and row.status == "active") or servable(row, include_superseded, as_of)):
                withheld.append(SUPERSEDED_ROW if row.status == "superseded" else DELETED_ROW)
                withheld_ids.append(i)
            elif stamps is not None and not stamped_as(stamps.get(row.row_id), row):
                withheld.append(CHANGING_ROW)
                withheld_ids.append(i)
            else:
                candidates.append(row)
        decisions = self.decide_rows(ex, "read", candidates)
        allowed = {row.row_id: row for row, d in zip(candidates, decisions) if d.allowed}
        if withheld:
            ex.reason = withheld[-1]
        if refusals is not None:
            refusals.extend((row.row_id, d.reason) for row, d in zip(candidates, decisions) if not d.allowed)
            refusals.extend(zip(withheld_ids, withheld))
        if count:
            reasons = ex.row_deny_reasons
            for reason in withheld:
                reasons[reason] = reasons.get(reason, 0) + 1
            ex.rows_allowed += len(allowed)
            refused = ex.denied_row_ids
            if len(allowed) < len(candidates):
                for row, d in zip(candidates, decisions):
                    if not d.allowed:
                        ex.rows_denied += 1
                        reasons[d.reason] = reasons.get(d.reason, 0) + 1
                        if len(refused) < _IDS:
                            refused.append(row.row_id)
            if withheld:
                refused.extend(withheld_ids[:max(0, _IDS - len(refused))])
                unknown, superseded = withheld.count(UNKNOWN_ROW), withheld.count(SUPERSEDED_ROW)
                ex.rows_unknown += unknown
                ex.rows_hidden_superseded += superseded
                ex.rows_hidden_deleted += len(withheld) - unknown - superseded
        return allowed

CLASS_MEMO_SIZE = 65536  # class decisions kept per policy set (cleared when full)


def _class_values(row: Row, attrs: frozenset[str]) -> tuple[Any, ...]:
    """A row's governance class under a policy set that reads `attrs` of the resource, without the owner's
    entity data: the values of those attributes in the row's Cedar entity (absent ones as a marker, values
    other than str/int/bool as canonical JSON), after its ancestors (tenant, fleet). The caller appends the
    owner's entity JSON when ``owner`` is in `attrs`."""
    entity = row.entity()["attrs"]
    values: list[Any] = [row.tenant, row.fleet]
    for name in sorted(attrs):
        value = entity.get(name, _ABSENT)
        values.append(value if isinstance(value, (str, int, bool)) else canonical_json(value))
    return tuple(values)


CLASS_VALUES_SIZE = 65536  # `class_values` answers kept (cleared when full)
_CLASS_VALUES: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def class_values(row: Row, attrs: frozenset[str]) -> tuple[Any, ...]:
    """`_class_values(row, attrs)` (the class key without the owner's data), kept per (`attrs`, the row fields its
    Cedar entity is made of: tenant, fleet, owner, scope, status, readers, labels, subject, predicate, object),
    so rows of one class do not each build their entity and its JSON. Kept only for a row with no Cedar
    attributes in `extra` and whose fields are exact ``str`` (the triple's may be None; readers and labels
    tuples of ``str``), where equal fields mean an equal entity: any other row is computed afresh."""
    extra = row.extra
    if type(extra) is not dict or extra.get("cedar"):
        return _class_values(row, attrs)
    fields = (attrs, row.tenant, row.fleet, row.owner, row.scope, row.status, row.readers, row.labels,
              row.subject, row.predicate, row.object)
    try:
        hit = _CLASS_VALUES.get(fields)
    except TypeError:  # an unhashable field (a list): not a ledger row's shape
        return _class_values(row, attrs)
    if hit is not None:
        return hit
    values = _class_values(row, attrs)
    if _plain(fields):
        if len(_CLASS_VALUES) >= CLASS_VALUES_SIZE:
            _CLASS_VALUES.clear()
        _CLASS_VALUES[fields] = values
    return values


def _plain(fields: tuple[Any, ...]) -> bool:
    """Whether `class_values`' fields are exact ``str`` (the triple's may be None; readers and labels tuples of
    ``str``): values Python compares equal only when their JSON is the same."""
    _, tenant, fleet, owner, scope, status, readers, labels, subject, predicate, obj = fields
    return (type(tenant) is str and type(fleet) is str and type(owner) is str and type(scope) is str
            and type(status) is str and type(readers) is tuple and type(labels) is tuple
            and all(type(x) is str for x in readers) and all(type(x) is str for x in labels)
            and all(x is None or type(x) is str for x in (subject, predicate, obj)))


_ABSENT = "\x00absent"
_NO_KEY: Any = object()  # `decide_rows`: an owner whose key is not computed yet


def servable(row: Row, include_superseded: bool = False, as_of: int | None = None) -> bool:
    """Whether a ledger row may be served at all (before Cedar): see `Authorizer.readable_rows`."""
    if row.status not in ("active", "superseded"):
        return False
    if as_of is not None:
        return row.created_at <= as_of and (row.superseded_at is None or row.superseded_at > as_of)
    return row.status == "active" or include_superseded
