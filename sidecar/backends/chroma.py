"""Chroma HTTP API v2 profile (chromadb 1.x server, ``/api/v2/...``; routes as used by the official
`chromadb.HttpClient`, chromadb/api/fastapi.py).

Governance on top of Chroma:
- Tenants in the path must be the caller's; collection UUIDs must be registered to the caller's
  tenant (and the path's database) in the ledger, else 404 on every data route — Chroma's data routes
  resolve a collection by UUID alone. Opening an existing collection (get by name or id, get_or_create
  of an existing name) is Cedar ``list`` on it; creating one is ``create_collection`` on the namespace.
  A collection Chroma holds that the ledger does not know is 409 ("adopt it first"), never adopted.
- Writes (add, upsert) stamp governed metadata (``mw_*``) and record the row in the ledger; the
  client may request ``mw_scope``, ``mw_fleet``, ``mw_readers`` and ``mw_labels`` (and on a new row its
  parents and triple) but never set the other ``mw_*`` keys.
- Reads (get, query, count) AND the caller's visibility filter into ``where`` (pushdown), then pass
  every returned row through one batched Cedar ``read``; query over-fetches and refills to
  ``n_results``; get applies ``offset``/``limit`` over readable rows; count counts readable rows.
- Deletes are per row (Cedar ``delete``), tombstoned durably before Chroma is called.
- Deployment-wide routes are decided as deployment actions on ``Deployment::"chroma"`` (operator keys
  only by the default policies): ``/reset`` (``reset``: Chroma's reset, then, once it succeeded, every row
  tombstoned and every collection unregistered),
  and for an operator key tenant and database management of any tenant (``manage_tenants``) and the
  server's heartbeat/version (``configure``). An operator key has no tenant and no data route.
- fork, search, functions and any other route are not forwarded.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Sequence

import structlog

from sidecar.backends.base import OperationActions, Route, RouteTable, operation_action
from sidecar.config import Settings
from sidecar.core import deletes, writes
from sidecar.core.operations import Capabilities
from sidecar.core.echo import READER_FLAG, refuse_claims, set_aside, without_echo
from sidecar.core.visibility import Visibility, visibility
from sidecar.errors import BackendAnswerTooLarge, BackendClientError, BackendServerError, BadRequest, Conflict, Forbidden, LedgerUnavailable, NotFound, PayloadTooLarge, UpstreamError
from sidecar.exchange import Exchange
from sidecar.governance import Principal, Row, collection_entity, namespace_entity, stamped_as
from sidecar.ledger import CollectionIntent, CollectionRecord, Ledger, now_us, offloop
from sidecar.planner import QueryPlanner
from sidecar.rowsize import check_row_size, row_bytes
from sidecar.provenance import (FIXED_ONCE_WRITTEN, WRITE_ONCE, Provenance, content_keys, history_view, provenance_metadata,
                                row_text, split_metadata)
from sidecar.stages.authorize import CHANGING_ROW, DELETED_ROW, UNKNOWN_ROW, Authorizer, settle_rows, well_formed_rows
from sidecar.stages.canonicalize import check_filter_size, nests_within, well_formed
from sidecar.stages.forward import Upstream

BACKEND = "chroma"
# Collection metadata key carrying the nonce of the create that made the collection (`CollectionIntent`).
INTENT_KEY = "mw_create_intent"
DEPLOYMENT = "chroma"  # Deployment::"chroma": the Chroma server behind this sidecar
T = ("api", "v2", "tenants", "{tenant}")
D = T + ("databases", "{database}")
C = D + ("collections", "{collection}")

# Reads whose key re-check is made in the statement of their first ledger rows (`ChromaProfile.deferrable`).
DEFERRED_KEY_CHECK = frozenset({"get", "query", "count"})
# Routes whose ``{collection}`` is a collection id (the others name a collection).
BY_COLLECTION_ID = frozenset({"get_collection_by_id", "add", "upsert", "update", "get", "query", "delete", "count",
                              "collection_info"})
ROUTES: list[tuple[str, tuple[str, ...], str]] = [
    ("GET", ("api", "v2", "heartbeat"), "system"),
    ("GET", ("api", "v2", "version"), "system"),
    ("GET", ("api", "v2", "healthcheck"), "system"),
    ("GET", ("api", "v2", "pre-flight-checks"), "system"),
    ("GET", ("api", "v2", "auth", "identity"), "identity"),
    ("POST", ("api", "v2", "reset"), "reset"),
    ("POST", ("api", "v2", "tenants"), "create_tenant"),
    ("GET", T, "get_tenant"),
    ("PATCH", T, "admin_tenant"),
    ("POST", T + ("databases",), "create_database"),
    ("GET", T + ("databases",), "list_databases"),
    ("GET", D, "get_database"),
    ("DELETE", D, "delete_database"),
    ("GET", D + ("collections",), "list_collections"),
    ("POST", D + ("collections",), "create_collection"),
    ("GET", D + ("collections_count",), "count_collections"),
    ("GET", D + ("collections", "by-id", "{collection}"), "get_collection_by_id"),
    ("GET", C, "get_collection_by_name"),
    ("PUT", C, "modify_collection"),
    ("DELETE", C, "delete_collection"),
    ("POST", C + ("add",), "add"),
    ("POST", C + ("upsert",), "upsert"),
    ("POST", C + ("update",), "update"),
    ("POST", C + ("get",), "get"),
    ("POST", C + ("query",), "query"),
    ("POST", C + ("delete",), "delete"),
    ("GET", C + ("count",), "count"),
    ("GET", C + ("indexing_status",), "collection_info"),
]
ROUTE_TABLE = RouteTable(ROUTES)  # `ChromaProfile.match`: the same answers as ``match_routes(ROUTES, ...)``
# Each operation's Cedar action (`operation_action`): data operations by their row action (an add is a write, a
# get, query or count a read), the others by their request-level action.
OPERATION_ACTIONS: OperationActions = {
    "system": ("list", "configure"), "identity": ("list", "configure"), "reset": "reset",
    "create_tenant": ("admin", "manage_tenants"), "get_tenant": ("list", "manage_tenants"), "admin_tenant": "admin",
    "create_database": ("admin", "manage_tenants"), "list_databases": ("list", "manage_tenants"),
    "get_database": ("list", "manage_tenants"), "delete_database": "admin", "list_collections": "list",
    "create_collection": "create_collection", "count_collections": "list", "get_collection_by_id": "list",
    "get_collection_by_name": "list", "modify_collection": "admin", "delete_collection": "admin",
    "collection_info": "list", "add": "write", "upsert": "write", "update": "update", "get": "read",
    "query": "read", "count": "read", "delete": "delete",
}

# Governed metadata keys the sidecar stamps (the client may request `sidecar.provenance.REQUESTABLE`).
STAMPED = ("mw_tenant", "mw_fleet", "mw_owner", "mw_scope", "mw_writer", "mw_created_at", "mw_readers", "mw_labels",
           "mw_source", "mw_derived_from", "mw_subject", "mw_predicate", "mw_object")
READER_PREFIX = READER_FLAG  # "mw_r:<agent uid>": true on a restricted row for each reader (Chroma filters test keys)
# Governed keys a client filter may test: their stored value is exactly what a reader of the row is shown.
# ``mw_derived_from`` is stored with every parent but shown narrowed to the parents the caller may read,
# so a filter on it would confirm a hidden parent's id; ``mw_supersedes_id``/``mw_superseded_by`` are
# never stored (added to responses where readable). Filters on those, or on any other ``mw_`` key, are 400.
FILTERABLE = frozenset(STAMPED) - {"mw_derived_from"}


def check_client_where(where: Any, name: str = "where") -> None:
    """Refuse (400) a client ``where`` that tests a governed key whose stored value is not what the
    caller may see (`FILTERABLE`), at any depth of ``$and``/``$or``/``$not``/operators."""
    stack = [where]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(key, str) and key.startswith("mw_") and key not in FILTERABLE \
                        and not key.startswith(READER_PREFIX):
                    raise BadRequest(f"{name} may not filter on {key}: its stored value names rows you may not read "
                                     "(use the lineage endpoint for parents)")
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def visibility_where(p: Principal, mode: str) -> dict[str, Any]:
    """The caller's visibility filter in Chroma's ``where`` language (pushdown): `where_of` the one predicate
    (`sidecar.core.visibility.visibility`, mode ``scope`` or ``tenant``). Cedar still decides every returned row."""
    return where_of(visibility(p, mode))


def where_of(v: Visibility) -> dict[str, Any]:
    """`v` over the stamped metadata (`stamp`): ``mw_tenant``, then one ``$and`` per disjunct of ``mw_scope`` with
    ``mw_owner``, ``mw_fleet`` or the reader's ``mw_r:<uid>`` flag. Exact: the stamp holds every column the
    predicate reads, as the ledger has it."""
    tenant = {"mw_tenant": {"$eq": v.tenant}}
    if not v.clauses:  # the tenant alone; or no disjunct, an operator's, whose tenant "" is no row's
        return tenant
    ors: list[dict[str, Any]] = []
    for c in v.clauses:
        conds: list[dict[str, Any]] = [{"mw_scope": {"$eq": c.scope}}]
        if c.owner is not None:
            conds.append({"mw_owner": {"$eq": c.owner}})
        if c.fleet is not None:
            conds.append({"mw_fleet": {"$eq": c.fleet}})
        if c.reader is not None:
            conds.append({READER_PREFIX + c.reader: {"$eq": True}})
        ors.append(conds[0] if len(conds) == 1 else {"$and": conds})
    return {"$and": [tenant, {"$or": ors}]}


def visibility_reader(p: Principal, mode: str) -> tuple[str, str | None, bool] | None:
    """The reader side of `visibility_where(p, mode)` as `Ledger.visible_row_ids` takes it (`Visibility.reader`)."""
    return visibility(p, mode).reader


def and_where(*clauses: Any) -> dict[str, Any] | None:
    parts = [c for c in clauses if c]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else {"$and": parts}


def stamp(metadata: dict[str, Any] | None, row: Row, previous: Row | None = None) -> dict[str, Any]:
    """`metadata` with every governed key set from the ledger row (client values already rejected).

    `previous` is the row as Chroma holds it (an update or upsert of an existing id): Chroma merges the
    metadata of an update into what it stores, so a governed key the row no longer has (``mw_labels`` or
    ``mw_readers`` emptied, a reader's ``mw_r:`` flag) is sent as null, which deletes it (Chroma 1.x)."""
    out = dict(metadata or {})
    out.update({
        "mw_tenant": row.tenant, "mw_fleet": row.fleet, "mw_owner": row.owner, "mw_scope": row.scope,
        "mw_writer": row.writer, "mw_created_at": row.created_at,
    })
    out.update(provenance_metadata(row))
    if row.readers:
        out["mw_readers"] = ",".join(row.readers)
        for reader in row.readers:
            out[READER_PREFIX + reader] = True
    if row.labels:
        out["mw_labels"] = ",".join(row.labels)
    if previous is not None:
        if previous.readers and not row.readers:
            out["mw_readers"] = None
        for reader in set(previous.readers) - set(row.readers):
            out[READER_PREFIX + reader] = None
        if previous.labels and not row.labels:
            out["mw_labels"] = None
    return out


def stamped_include(include: Any, filtered: bool = False) -> tuple[Any, bool, bool]:
    """A read's `include` as sent to Chroma so that each row's stamp comes back with its content: (include to send,
    whether the answer depends on content (its rows are checked with `stamped_as`), whether ``metadatas`` was added
    (then dropped from the rows and ``included`` before the answer leaves)). An answer depends on content when its
    `include` names any column (documents, embeddings, metadatas, uris, data, distances: a distance is computed from
    the embedding; a name Chroma does not know is refused by it, 400) or, with `filtered`, when Chroma chose or ranked
    its rows by content: a query, a get with a client ``where`` or ``where_document`` — even ids alone then tell what
    the content matched. No `include` is Chroma's default, which holds ``metadatas`` (get and query, API v2); one
    that is not a list is sent as it is (Chroma refuses it, 400); only an empty one of an unfiltered get (ids
    alone) depends on no content."""
    if include is None:
        return None, True, False
    if type(include) is not list:
        return include, True, False
    if "metadatas" in include:
        return include, True, False
    if not include and not filtered:
        return include, False, False
    return [*include, "metadatas"], True, True


def _unstamped(rows: list[dict[str, Any]], included: Any) -> Any:
    """Drop the ``metadatas`` `stamped_include` added: from each row, in place, and from Chroma's ``included``
    (returned)."""
    for r in rows:
        r.pop("metadatas", None)
    return [k for k in included if k != "metadatas"] if type(included) is list else included


# Columns of a row's content (Chroma's include names): fetched only for rows that will be served (`content_include`).
CONTENT_COLUMNS = frozenset({"documents", "embeddings", "uris", "data"})
INCLUDE_NAMES = CONTENT_COLUMNS | {"metadatas", "distances"}
DEFAULT_GET_INCLUDE = ("metadatas", "documents")  # Chroma's get without include (API v2)


def content_include(send: Any, default: tuple[str, ...]) -> tuple[Any, list[str] | None]:
    """The two phases of a read whose include (`send`, as `stamped_include` makes it; None: Chroma's `default`)
    names content (`CONTENT_COLUMNS`): (include of the first fetch — the rows' ids with their governance stamp,
    ``metadatas``, and ``distances`` when asked —, include of the second — a ``get`` by the ids of the rows that
    will be served: their content with their stamp again). (`send`, None) — one phase — when it names no content
    or is not a list of include names Chroma knows (then Chroma refuses it, 400, as it would unsplit)."""
    include = list(default) if send is None else send
    if type(include) is not list or not all(type(c) is str and c in INCLUDE_NAMES for c in include) \
            or not any(c in CONTENT_COLUMNS for c in include):
        return send, None
    first = [c for c in include if c not in CONTENT_COLUMNS]
    second = [c for c in include if c != "distances"]
    for phase in (first, second):
        if "metadatas" not in phase:
            phase.append("metadatas")
    return first, second


def _governed(meta: Any) -> dict[str, Any]:
    """The governed keys (``mw_*``, the stamp) of a row's metadata as Chroma answered it."""
    return {k: v for k, v in meta.items() if k.startswith("mw_")} if type(meta) is dict else {}


def _obj(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _ids(value: Any, *, required: bool, limit: int) -> list[str] | None:
    """A request's ``ids``: a list of unique non-empty strings, at most `limit` (413 above, nothing
    forwarded). Raises `BadRequest` otherwise."""
    if value is None:
        if required:
            raise BadRequest("ids are required")
        return None
    if isinstance(value, list) and len(value) > limit:
        raise PayloadTooLarge(f"{len(value)} ids is over the limit of {limit} per request (MEMWARDEN_MAX_IDS)")
    if not isinstance(value, list) or not all(isinstance(i, str) and i for i in value):
        raise BadRequest("ids must be a list of non-empty strings")
    if len(set(value)) != len(value):
        raise BadRequest("ids must be unique")
    return value


def _column(body: dict[str, Any], key: str, n: int) -> list[Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        raise BadRequest(f"{key} must be a list with one entry per id")
    return value


def _nonneg_int(value: Any, name: str, default: int | None) -> int | None:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{name} must be a non-negative integer")
    return value


def _columns(resp: dict[str, Any], n: int) -> dict[str, list[Any]]:
    """The columns of a Chroma result that rows are made of: its lists of length n, but ``included``."""
    return {k: v for k, v in resp.items() if isinstance(v, list) and len(v) == n and k != "included"}


def _columns_to_rows(resp: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Chroma's columnar get result → one dict per row (only list columns of length n)."""
    return _rows_of(_columns(resp, n), n)


def _rows_of(cols: dict[str, list[Any]], n: int) -> list[dict[str, Any]]:
    """One dict per row of `cols` (`_columns`: lists of length n), keys in column order."""
    if not cols:
        return [{} for _ in range(n)]
    names = list(cols)
    return [dict(zip(names, values)) for values in zip(*cols.values())]


# The columns of a query answer, in Chroma's order; ``ids`` is always a list.
QUERY_COLUMNS = ("ids", "distances", "documents", "metadatas", "embeddings", "uris")
DEFAULT_QUERY_INCLUDE = ("metadatas", "documents", "distances")


def _query_result(ranked: list[list[dict[str, Any]]], include: Any, included: Any) -> dict[str, Any]:
    """The columnar answer of a query: per column of `QUERY_COLUMNS`, one list per query embedding of
    its rows' values (``None`` for a row without it) — or ``None`` when no row has the column and the
    request's `include` (default `DEFAULT_QUERY_INCLUDE`) does not name it; then ``included``: Chroma's
    `included` or else the request's include."""
    if include is None:
        include = list(DEFAULT_QUERY_INCLUDE)
    keys: set[str] = set()
    for rows in ranked:
        for r in rows:
            keys.update(r)
    out: dict[str, Any] = {}
    for key in QUERY_COLUMNS:
        if key == "ids" or key in keys or key in include:
            out[key] = [[r.get(key) for r in rows] for rows in ranked]
        else:
            out[key] = None
    out["included"] = included if included is not None else include
    return out


class ChromaClient:
    """The Chroma calls the core makes (`sidecar.core.operations.Deleter`): rows are deleted by collection UUID, many
    ids a call; Chroma deletes missing ids with 200."""

    capabilities = Capabilities(batch_delete=True, id_list_filter=True, metadata_merge=True, count=True)

    def __init__(self, upstream: Upstream, ledger: Ledger) -> None:
        self.upstream = upstream
        self.ledger = ledger

    def holds(self, collection: str) -> bool:
        return True

    async def delete(self, collection: str, ids: Sequence[str]) -> None:
        """Chroma's delete of `ids` in collection `collection`; nothing to call when the ledger no longer registers
        the collection (deleted with it)."""
        rec = await offloop.call(self.ledger, self.ledger.get_collection, BACKEND, collection)
        if rec is not None:
            await self.upstream.call("POST", ["api", "v2", "tenants", rec.tenant, "databases", rec.database,
                                              "collections", rec.collection_id, "delete"], json_body={"ids": list(ids)})

    async def present(self, collection: str, ids: Sequence[str]) -> list[str]:
        """Those of `ids` Chroma holds in `collection` (one get, ids alone); none when the ledger no longer registers
        the collection."""
        rec = await offloop.call(self.ledger, self.ledger.get_collection, BACKEND, collection)
        if rec is None:
            return []
        got = await self.upstream.call("POST", ["api", "v2", "tenants", rec.tenant, "databases", rec.database,
                                                "collections", rec.collection_id, "get"],
                                       json_body={"ids": list(ids), "include": []}, idempotent=True)
        back = got.get("ids") if isinstance(got, dict) else None
        return list(back) if isinstance(back, list) else []


class ChromaProfile:
    """Chroma v2 routes → Cedar actions, ledger updates and row filtering."""

    name = BACKEND

    def __init__(self, settings: Settings, upstream: Upstream, ledger: Ledger, authz: Authorizer) -> None:
        self.settings = settings
        self.upstream = upstream
        self.ledger = ledger
        self.authz = authz
        self.prov = Provenance(BACKEND, settings.policies_dir, ledger, authz)
        self.client = ChromaClient(upstream, ledger)
        self.content_keys = content_keys(settings.chroma_content_keys)
        authz.deferrable = self.deferrable
        # collection id → monotonic time until which its reads use the where filter, not an id list (`_pushdown`)
        self._id_plan_off: dict[str, float] = {}
        self.planner = QueryPlanner(settings.query_plan, settings.overfetch_factor, settings.max_scan_rows,
                                    lambda collection_id: ledger.visibility_counts(BACKEND, collection_id))

    def match(self, method: str, segments: list[str]) -> Route | None:
        return ROUTE_TABLE.match(method, segments)

    def deferrable(self, method: str, segments: list[str]) -> bool:
        """Whether the request is a pure read (`DEFERRED_KEY_CHECK`: get, query, count — they change nothing in
        the ledger or the backend) whose key re-check may ride on its first ledger read
        (`Authorizer.authenticate`); `handle` settles it before any answer."""
        route = self.match(method, segments)
        return route is not None and route.op in DEFERRED_KEY_CHECK

    async def handle(self, ex: Exchange, route: Route) -> tuple[int, Any]:
        ex.operation = route.op
        ex.action = operation_action(OPERATION_ACTIONS, route.op, ex.principal.kind if ex.principal else None)
        handler = getattr(self, f"op_{route.op}")
        try:
            if route.op in BY_COLLECTION_ID:
                await self.authz.warm_collection(BACKEND, route.params["collection"])  # off the loop (PostgreSQL)
            result = await handler(ex, route.params)
        except LedgerUnavailable:
            raise  # 503 already: asking the ledger again would only wait for it twice
        except Exception:
            await self.authz.settle(ex)  # a revoked key is answered 401, whatever else went wrong
            raise
        await self.authz.settle(ex)
        return result

    # -- helpers ------------------------------------------------------------------------------
    def _p(self, ex: Exchange) -> Principal:
        assert ex.principal is not None
        return ex.principal

    def _collection(self, ex: Exchange, params: dict[str, str]) -> CollectionRecord:
        """The registered collection named by UUID in the path; 404 unless it is the caller's."""
        p = self._p(ex)
        rec = self.ledger.get_collection(BACKEND, params["collection"])
        if rec is None or rec.tenant != p.tenant or rec.tenant != params["tenant"] or rec.database != params["database"]:
            raise NotFound("collection not found", reason="unknown_collection")
        return rec

    def _coll_entity(self, rec: CollectionRecord) -> dict[str, Any]:
        return collection_entity(BACKEND, rec.collection_id, rec.tenant, rec.database)

    def _require_collection(self, ex: Exchange, params: dict[str, str], action: str) -> CollectionRecord:
        """The collection of `_collection`, once `action` on it is permitted: the request-level decision on its
        `collection_entity` with its namespace, memoised on the fields they are made of (`Authorizer.require_keyed`:
        the entities are built only when Cedar is asked). Raises `NotFound` (404), `Forbidden` (403)."""
        rec = self._collection(ex, params)
        cid, tenant, database = rec.collection_id, rec.tenant, rec.database
        if not (type(cid) is str and type(tenant) is str and type(database) is str):  # equal keys, equal JSON: str only
            self.authz.require(ex, action, self._coll_entity(rec), [namespace_entity(tenant, database)])
            return rec
        self.authz.require_keyed(ex, action, ("Collection", f"{BACKEND}:{cid}"), ("Collection", BACKEND, cid, tenant, database),
                                 lambda: (self._coll_entity(rec), [namespace_entity(tenant, database)]))
        return rec

    def _require_namespace(self, ex: Exchange, tenant: str, database: str, action: str) -> None:
        self.authz.require(ex, action, namespace_entity(tenant, database))

    def _data_segments(self, rec: CollectionRecord, op: str) -> list[str]:
        return ["api", "v2", "tenants", rec.tenant, "databases", rec.database, "collections", rec.collection_id, op]

    def _db_segments(self, tenant: str, database: str | None = None) -> list[str]:
        segs = ["api", "v2", "tenants", tenant, "databases"]
        return segs + [database] if database is not None else segs

    # -- system, identity, tenants, databases -----------------------------------------------
    def _namespace_or_deployment(self, ex: Exchange, tenant: str, database: str, action: str) -> None:
        """A tenant's namespace action, or for an operator key ``manage_tenants`` on the deployment
        (an operator manages every tenant's namespace and no tenant's data)."""
        if self._p(ex).kind == "operator":
            self.authz.require_deployment(ex, "manage_tenants", DEPLOYMENT)
        else:
            self._require_namespace(ex, tenant, database, action)

    async def op_system(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        p = self._p(ex)
        if p.kind == "operator":
            self.authz.require_deployment(ex, "configure", DEPLOYMENT)
        else:
            self._require_namespace(ex, p.tenant, "*", "list")
        return 200, await self.upstream.call("GET", ex.segments)

    async def op_identity(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        # Answered by the sidecar: the backend's identity is the sidecar's, never the caller's.
        p = self._p(ex)
        if p.kind == "operator":
            self.authz.require_deployment(ex, "configure", DEPLOYMENT)
            return 200, {"user_id": p.describe(), "tenant": "default_tenant", "databases": []}
        self._require_namespace(ex, p.tenant, "*", "list")
        return 200, {"user_id": p.uid[1], "tenant": p.tenant, "databases": ["*"]}

    async def op_reset(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        """Chroma's reset wipes every tenant: a deployment action (operators only by default). Chroma's own reset is
        called first; only once it answered 2xx is every governed row tombstoned (its backend delete confirmed) and
        every collection unregistered. When Chroma refuses (its ``allow_reset`` is off: 403) or fails, the answer is
        its error and the ledger is unchanged: every row stays served and every collection registered. A sidecar
        that stops between Chroma's reset and the ledger's leaves registered collections Chroma no longer holds
        (reads of them fail, nothing is served): the operator resets again."""
        return 200, await deletes.reset(self, ex, DEPLOYMENT, None, lambda: self.upstream.call("POST", ex.segments))

    async def op_create_tenant(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        body = _obj(ex.body)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("name is required")
        self._namespace_or_deployment(ex, name, "*", "admin")
        return 200, await self.upstream.call("POST", ex.segments, json_body={"name": name})

    async def op_get_tenant(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self._namespace_or_deployment(ex, params["tenant"], "*", "list")
        return 200, await self.upstream.call("GET", ex.segments)

    async def op_admin_tenant(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self._require_namespace(ex, params["tenant"], "*", "admin")
        return 200, await self.upstream.call("PATCH", ex.segments, json_body=ex.body)

    async def op_create_database(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        body = _obj(ex.body)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("name is required")
        self._namespace_or_deployment(ex, params["tenant"], name, "admin")
        return 200, await self.upstream.call("POST", ex.segments, json_body={"name": name})

    async def op_list_databases(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self._namespace_or_deployment(ex, params["tenant"], "*", "list")
        return 200, await self.upstream.call("GET", ex.segments, params=ex.query or None)

    async def op_get_database(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self._namespace_or_deployment(ex, params["tenant"], params["database"], "list")
        return 200, await self.upstream.call("GET", ex.segments)

    async def op_delete_database(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        tenant, database = params["tenant"], params["database"]
        self._require_namespace(ex, tenant, database, "admin")
        for rec in self.ledger.list_collections(BACKEND, tenant, database):
            self.ledger.delete_collection(BACKEND, rec.collection_id, self._p(ex).uid[1], ex.request_id)
        return 200, await self.upstream.call("DELETE", ex.segments)

    # -- collections ------------------------------------------------------------------------
    def _known_collection(self, ex: Exchange, tenant: str, database: str, coll: Any,
                          recovered: list[CollectionRecord] | None = None) -> CollectionRecord:
        """The ledger record of `coll` (Chroma's JSON for a collection found in tenant/database).

        Raises `Conflict` (409, "adopt it first") when Chroma holds the collection in the caller's tenant and
        database but the ledger does not know it — an existing collection is never adopted silently — and
        `NotFound` (404) when it is registered to another tenant or database or is not the caller's."""
        if not isinstance(coll, dict) or not isinstance(coll.get("id"), str):
            raise NotFound("collection not found", reason="unknown_collection")
        p = self._p(ex)
        rec = self.ledger.get_collection(BACKEND, coll["id"])
        if rec is None and tenant == p.tenant and coll.get("tenant") == tenant and coll.get("database") == database:
            rec = self._recover(coll)
            if rec is not None and recovered is not None:
                recovered.append(rec)
        if rec is None:
            if tenant == p.tenant and coll.get("tenant") == tenant and coll.get("database") == database:
                name = coll.get("name") if isinstance(coll.get("name"), str) else coll["id"]
                raise Conflict(
                    f"collection {name!r} exists in Chroma but is not governed by memwarden; adopt it first: "
                    f"memwarden adopt chroma --rules RULES.toml (a [[collection]] with tenant = {tenant!r}, "
                    f"database = {database!r}, name = {name!r})", reason="unadopted_collection")
            raise NotFound("collection not found", reason="unknown_collection")
        if rec.tenant != p.tenant or rec.tenant != tenant or rec.database != database:
            raise NotFound("collection not found", reason="unknown_collection")
        return rec

    def _recover(self, coll: dict[str, Any]) -> CollectionRecord | None:
        """The collection a create through the sidecar made but did not register (it crashed, or the ledger failed,
        between Chroma's create and the registration): registered now, for the creator of the intent, if `coll`
        carries the nonce of a recorded `CollectionIntent` of its tenant, database and name. None otherwise — a
        collection made around the sidecar carries no recorded nonce and stays unadopted (409)."""
        meta = coll.get("metadata")
        nonce = meta.get(INTENT_KEY) if isinstance(meta, dict) else None
        if not isinstance(nonce, str) or not nonce:
            return None
        intent = self.ledger.collection_intent(BACKEND, nonce)
        if intent is None or (intent.tenant, intent.database, intent.name) != (coll.get("tenant"), coll.get("database"), coll.get("name")):
            return None
        rec = CollectionRecord(BACKEND, coll["id"], intent.tenant, intent.database, intent.name, intent.created_by, intent.created_at)
        try:
            self.ledger.resolve_collection_intent(intent, rec)
        except Exception:
            # registered concurrently (another request recovered it first): the ledger's record stands
            again = self.ledger.get_collection(BACKEND, coll["id"])
            if again is None:
                raise
            return again
        structlog.get_logger("memwarden.collections").info(
            "collection_create_recovered", backend=BACKEND, collection=coll["id"], created_by=intent.created_by)
        return rec

    async def _open_collection(self, ex: Exchange, tenant: str, database: str, name: str,
                               recovered: list[CollectionRecord] | None = None) -> tuple[CollectionRecord, Any] | None:
        """Chroma's collection `name` in tenant/database, opened by the caller: its ledger record and JSON
        after Cedar ``list`` on the collection (opening an existing collection is a read-level decision).
        None when Chroma has no collection of that name (its 404); 409/404 as `_known_collection`."""
        try:
            coll = await self.upstream.call("GET", self._db_segments(tenant, database) + ["collections", name])
        except BackendClientError as exc:
            if exc.status == 404:
                return None
            raise
        rec = self._known_collection(ex, tenant, database, coll, recovered)
        self.authz.require(ex, "list", self._coll_entity(rec), [namespace_entity(rec.tenant, rec.database)])
        return rec, coll

    async def op_list_collections(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        tenant, database = params["tenant"], params["database"]
        self._require_namespace(ex, tenant, database, "list")
        offset = _nonneg_int(int(ex.query["offset"]) if ex.query.get("offset", "").isdigit() else None, "offset", 0) or 0
        limit = int(ex.query["limit"]) if ex.query.get("limit", "").isdigit() else None
        if ("offset" in ex.query and not ex.query["offset"].isdigit()) or ("limit" in ex.query and not ex.query["limit"].isdigit()):
            raise BadRequest("limit and offset must be non-negative integers")
        result = await self.upstream.call("GET", ex.segments)
        if not isinstance(result, list):
            raise UpstreamError("unexpected backend answer")
        owned = {r.collection_id for r in self.ledger.list_collections(BACKEND, tenant, database)} if tenant == self._p(ex).tenant else set()
        visible = [c for c in result if isinstance(c, dict) and c.get("id") in owned]
        ex.rows_allowed, ex.rows_denied = len(visible), len(result) - len(visible)
        visible = [_public(c) for c in visible[offset:]]
        return 200, visible if limit is None else visible[:limit]

    async def op_count_collections(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        tenant, database = params["tenant"], params["database"]
        self._require_namespace(ex, tenant, database, "list")
        result = await self.upstream.call("GET", self._db_segments(tenant, database) + ["collections"])
        owned = {r.collection_id for r in self.ledger.list_collections(BACKEND, tenant, database)} if tenant == self._p(ex).tenant else set()
        return 200, sum(1 for c in (result or []) if isinstance(c, dict) and c.get("id") in owned)

    async def op_create_collection(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        """Chroma create_collection / get_or_create_collection (POST .../collections).

        ``get_or_create`` on a collection that exists: a read-level decision (`_open_collection`), Chroma's
        collection JSON is answered and nothing is changed (its metadata and configuration stay as they are).
        A new collection needs Cedar ``create_collection`` on the namespace; it is created with
        ``get_or_create`` false, so what the sidecar registers is always the collection Chroma just made. A
        name Chroma already holds that the ledger does not know is 409 ("adopt it first"), never adopted."""
        tenant, database = params["tenant"], params["database"]
        body = _obj(ex.body)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("name is required")
        get_or_create = body.get("get_or_create") is True
        self._require_namespace(ex, tenant, database, "list")
        if get_or_create:
            opened = await self._open_collection(ex, tenant, database, name)
            if opened is not None:
                return 200, _public(opened[1])
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("metadata must be an object or null")
        if any(isinstance(k, str) and k.startswith("mw_") for k in metadata or {}):
            raise BadRequest("collection metadata keys starting with mw_ are governed by memwarden and cannot be set")
        self._require_namespace(ex, tenant, database, "create_collection")
        # Crash-safe: the intent is durable before Chroma is called and its nonce goes into the new collection's
        # metadata; a crash before the registration below is completed when the collection is next opened.
        intent = CollectionIntent(BACKEND, secrets.token_hex(16), tenant, database, name, self._p(ex).uid[1], now_us())
        self.ledger.record_collection_intent(intent)
        try:
            coll = await self.upstream.call("POST", ex.segments, json_body={
                **body, "metadata": {**(metadata or {}), INTENT_KEY: intent.nonce}, "get_or_create": False})
        except BackendClientError as exc:
            self.ledger.resolve_collection_intent(intent, None)  # Chroma refused: it made nothing
            if exc.status != 409:
                raise
            # It exists (created since we looked, or a plain create of an existing name): opening it may
            # complete an earlier create of this caller that crashed before its registration.
            recovered: list[CollectionRecord] = []
            opened = await self._open_collection(ex, tenant, database, name, recovered)
            if opened is None:
                raise
            if not get_or_create and not (recovered and recovered[0].created_by == self._p(ex).uid[1]):
                raise  # a plain create of an existing name is Chroma's 409, unless it completes the caller's own
            return 200, _public(opened[1])
        if not isinstance(coll, dict) or not isinstance(coll.get("id"), str):
            raise UpstreamError("unexpected backend answer")
        if self.ledger.get_collection(BACKEND, coll["id"]) is not None:
            raise UpstreamError("backend reused a collection id")
        if "register-collection" in self.settings.failpoints:
            raise RuntimeError("failpoint register-collection: the ledger registration failed")
        self.ledger.resolve_collection_intent(intent, CollectionRecord(
            BACKEND, coll["id"], tenant, database, name, intent.created_by, intent.created_at))
        return 200, _public(coll)

    async def op_get_collection_by_name(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        tenant, database = params["tenant"], params["database"]
        self._require_namespace(ex, tenant, database, "list")
        coll = await self.upstream.call("GET", ex.segments)
        rec = self._known_collection(ex, tenant, database, coll)
        self.authz.require(ex, "list", self._coll_entity(rec), [namespace_entity(rec.tenant, rec.database)])
        return 200, _public(coll)

    async def op_get_collection_by_id(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        tenant, database = params["tenant"], params["database"]
        if self.ledger.get_collection(BACKEND, params["collection"]) is None:
            # Not governed: 409 only if Chroma holds it in the caller's tenant and the path's database.
            self._require_namespace(ex, tenant, database, "list")
            try:
                coll = await self.upstream.call("GET", ex.segments)
            except BackendClientError as exc:
                raise NotFound("collection not found", reason="unknown_collection") from exc
            self._known_collection(ex, tenant, database, coll)
        self._require_collection(ex, params, "list")
        coll = await self.upstream.call("GET", ex.segments)
        self._known_collection(ex, tenant, database, coll)
        return 200, _public(coll)

    async def op_modify_collection(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        rec = self._require_collection(ex, params, "admin")
        meta = _obj(ex.body).get("new_metadata")
        if isinstance(meta, dict) and any(isinstance(k, str) and k.startswith("mw_") for k in meta):
            raise BadRequest("collection metadata keys starting with mw_ are governed by memwarden and cannot be set")
        return 200, await self.upstream.call("PUT", self._data_segments(rec, "")[:-1], json_body=_obj(ex.body))

    async def op_delete_collection(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        # Chroma deletes collections by name: resolve the name to the UUID first.
        tenant, database = params["tenant"], params["database"]
        self._require_namespace(ex, tenant, database, "list")
        coll = await self.upstream.call("GET", ex.segments)
        own = self._known_collection(ex, tenant, database, coll)
        rec = self._require_collection(ex, {**params, "collection": own.collection_id}, "admin")
        self.ledger.delete_collection(BACKEND, rec.collection_id, self._p(ex).uid[1], ex.request_id)
        return 200, await self.upstream.call("DELETE", ex.segments)

    async def op_collection_info(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        self._require_collection(ex, params, "list")
        return 200, await self.upstream.call("GET", ex.segments)

    # -- writes -----------------------------------------------------------------------------
    def _requested(self, p: Principal, meta: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split client metadata into (plain, requested governance); 400 on any other ``mw_`` key."""
        return split_metadata(p, meta, not_object="each metadata must be an object or null")

    def _new_row(self, ex: Exchange, rec: CollectionRecord, row_id: str, requested: dict[str, Any],
                 document: Any) -> Row:
        return self.prov.new_row(ex, rec.collection_id, row_id, requested, document)

    def _views(self, ex: Exchange, rec: CollectionRecord, rows: list[Row]) -> dict[str, dict[str, Any]]:
        """Per row, its governed metadata as this caller is shown it on a read (stamp, supersession links,
        readable parents): what an echo of the row's metadata may carry unchanged."""
        shown = [{"ids": r.row_id, "metadatas": stamp(None, r)} for r in rows]
        self._decorate(ex, rec, shown)
        return {d["ids"]: {k: v for k, v in d["metadatas"].items() if k.startswith("mw_")} for d in shown}

    async def _write(self, ex: Exchange, params: dict[str, str], op: str) -> tuple[int, Any]:
        """add / upsert / update: authorise every row, reserve new ids, stamp, forward, then commit."""
        p = self._p(ex)
        # The collection lookup too: it misses the cache while an invalidation is being read (PostgreSQL).
        rec = await offloop.call(self.ledger, self._require_collection, ex, params, "list")
        body = _obj(ex.body)
        ids = _ids(body.get("ids"), required=True, limit=self.settings.max_ids)
        assert ids is not None
        metas = _column(body, "metadatas", len(ids))
        for key in ("embeddings", "documents", "uris"):
            _column(body, key, len(ids))
        allowed_keys = {"ids", "embeddings", "metadatas", "documents", "uris"}
        if set(body) - allowed_keys:
            raise BadRequest(f"unknown fields: {sorted(set(body) - allowed_keys)}")
        self._check_row_sizes(body, ids, metas)
        if p.kind != "agent" and op != "update":
            raise Forbidden("tenant admin keys cannot own rows; write with an agent key")
        # Governed keys a client can only echo back (what a read showed it, e.g. a client that round-trips a
        # row's whole metadata on update, as mem0's Chroma store does): set aside, checked against the row below.
        pre = [set_aside(metas[i] if metas else None) for i in range(len(ids))]
        if op == "add":
            refuse_claims(pre)
        split = [self._requested(p, meta) for meta, _ in pre]
        documents = body.get("documents") or [None] * len(ids)
        # A row's content: its document, else the metadata key its client keeps the text in (mem0's Memory: `data`).
        texts = [row_text(documents[i], split[i][0], self.content_keys) for i in range(len(ids))]
        # Each synchronous step below that reads or writes the ledger (Cedar decisions read owners) runs
        # through `_off` — a worker thread on PostgreSQL — one after the other, in the order and with the
        # errors it had on the event loop.
        if op != "update":
            def decide_write() -> None:
                # The write decision first, on every id as a new row: a principal that may not write learns
                # nothing from what follows (which ids exist, which parent, fact or content is known).
                as_new = [self._new_row(ex, rec, row_id, split[i][1], texts[i]) for i, row_id in enumerate(ids)]
                decisions = self.authz.decide_rows(ex, "write", as_new)
                denied = [(r.row_id, d.reason) for r, d in zip(as_new, decisions) if not d.allowed]
                if denied:
                    ex.decision, ex.deny_action = "deny", "write"
                    settle_rows(ex, [r.row_id for r, d in zip(as_new, decisions) if d.allowed], denied)
                    raise Forbidden(f"write is not permitted for {len(denied)} of {len(ids)} rows")
            await offloop.call(self.ledger, decide_write)

        known = await offloop.call(self.ledger, self.ledger.get_rows, BACKEND, rec.collection_id, ids)
        if op == "add" and known:
            raise Conflict("ids already exist")
        if op == "update" and len(known) != len(ids):
            settle_rows(ex, [], [(i, UNKNOWN_ROW) for i in dict.fromkeys(ids) if i not in known])
            raise NotFound("record not found", reason="unknown_row")
        if any(r.status not in ("active", "superseded") for r in known.values()):
            # tombstoned or reserved ids never come back; for the caller they do not exist
            if op == "update":
                settle_rows(ex, [], [(i, DELETED_ROW) for i in dict.fromkeys(ids) if known[i].status not in ("active", "superseded")])
            raise Conflict("ids already exist") if op != "update" else NotFound("record not found", reason="deleted_row")
        new_ids = [i for i in ids if i not in known]
        if new_ids:
            present = await self.upstream.call("POST", self._data_segments(rec, "get"),
                                               json_body={"ids": new_ids, "include": []}, idempotent=True)
            if isinstance(present, dict) and present.get("ids"):
                raise Conflict("ids exist in the backend but are not governed by memwarden")

        def check_existing() -> None:
            # Existing rows must be readable (else they do not exist for the caller), then updatable.
            existing = [known[i] for i in ids if i in known]
            refusals: list[tuple[str, str]] = []
            visible = self.authz.readable(ex, BACKEND, rec.collection_id, [r.row_id for r in existing], include_superseded=True,
                                          refusals=refusals)
            if len(visible) != len(existing):
                ex.decision = "deny"
                refused = {i for i, _ in refusals}
                settle_rows(ex, [i for i in dict.fromkeys(ids) if i not in refused], refusals)
                raise NotFound("record not found")
            refuse_claims([pre[i] for i, row_id in enumerate(ids) if row_id not in known])
            echoed = [i for i, row_id in enumerate(ids) if row_id in known and (pre[i][1] or any(k in split[i][1] for k in WRITE_ONCE))]
            if echoed:
                views = self._views(ex, rec, [known[ids[i]] for i in echoed])
                for i in echoed:
                    split[i] = (split[i][0], without_echo(pre[i][1], split[i][1], views[ids[i]]))
        await offloop.call(self.ledger, check_existing)
        # An update of existing rows holds their update markers until its ledger write (`sidecar.core.updates`):
        # another update of one of them meanwhile is 409, and this one decides on the rows as they are now.
        existing = [i for i in dict.fromkeys(ids) if i in known]
        return await writes.holding(self, ex, rec.collection_id, {i: known[i] for i in existing}, lambda: self._write_rows(
            ex, rec, op, body, ids, metas, pre, split, documents, texts, known, new_ids, existing))

    async def _write_rows(self, ex: Exchange, rec: CollectionRecord, op: str, body: dict[str, Any], ids: list[str],
                          metas: list[Any] | None, pre: list[Any], split: list[tuple[dict[str, Any], dict[str, Any]]],
                          documents: list[Any], texts: list[str | None], known: dict[str, Row], new_ids: list[str],
                          held: list[str]) -> tuple[int, Any]:
        """The rest of `_write`, once the rows are decided readable (this request holds the update markers of the
        existing rows, `held`, released by its ledger write or, when it changes none, at its end): the write
        transaction of `sidecar.core.writes.write_rows` around Chroma's write."""
        await self._stored_documents(rec, ids, known, documents, texts)
        def decide_changes() -> tuple[dict[str, Row], list[Row]]:
            final: dict[str, Row] = {}
            changed: list[Row] = []
            pairs: list[tuple[Row, Row]] = []  # (existing row, the row after this write)
            for i, row_id in enumerate(ids):
                requested = split[i][1]
                if row_id in known:
                    if any(k in requested for k in WRITE_ONCE):
                        raise BadRequest(FIXED_ONCE_WRITTEN)
                    row = known[row_id]
                    updated = writes.with_governance(row, requested)
                    new_text = texts[i] is not None
                    if writes.moves(row, updated) or new_text:
                        if new_text:
                            self.prov.set_content(updated, texts[i])
                        final[row_id] = updated
                        changed.append(updated)
                    else:
                        final[row_id] = row
                    pairs.append((row, final[row_id]))
                else:
                    final[row_id] = self._new_row(ex, rec, row_id, requested, texts[i])
            writes.decide_changes(self, ex, pairs, ids)  # "write" of the new rows was decided in `_write`
            self.prov.check_forgotten(ex, [final[ids[i]] for i in range(len(ids)) if texts[i] is not None and ids[i] in known])
            self.prov.check_move(ex, [(known[r.row_id], r) for r in changed])
            return final, changed
        final, changed = await offloop.call(self.ledger, decide_changes)
        ex.decision = "allow"
        settle_rows(ex, list(dict.fromkeys(ids)), [])

        forwarded = dict(body)
        # Stamped: new rows, and existing rows whose governance this write changes. An existing row whose governance
        # stays gets the client's own metadata only (None: none; Chroma merges it into the row's): its stamp is left
        # as it is, so this write commutes with another update of the row in flight, whose new stamp it would
        # otherwise overwrite with the old governance and so pair that update's content with it (`stamped_as`).
        regoverned = {r.row_id for r in changed if writes.moves(known[r.row_id], r)}
        if metas is not None or new_ids or regoverned:
            forwarded["metadatas"] = [
                stamp(split[i][0] if (metas and metas[i] is not None) or ids[i] in new_ids else None, final[ids[i]],
                      known.get(ids[i]))
                if ids[i] in new_ids or ids[i] in regoverned else
                (split[i][0] if metas and metas[i] is not None else None)
                for i in range(len(ids))
            ]
        await writes.write_rows(self, ex, rec.collection_id, [final[i] for i in new_ids], changed, held=held,
                                forward=lambda: self.upstream.call("POST", self._data_segments(rec, op), json_body=forwarded),
                                client=self.client)
        ex.rows_allowed = len(ids)
        return 200, True if op != "add" else True

    def _check_row_sizes(self, body: dict[str, Any], ids: list[str], metas: list[Any] | None) -> None:
        """413 (`check_row_size`, nothing decided or written) when a row of the write — its document, uri and
        metadata (`sidecar.rowsize.row_bytes`) — is over ``MAX_ROW_BYTES``."""
        limit = self.settings.max_row_bytes
        documents, uris = body.get("documents"), body.get("uris")
        for i, row_id in enumerate(ids):
            size = row_bytes(documents[i] if documents else None, uris[i] if uris else None, metas[i] if metas else None)
            check_row_size(f"row {row_id[:64]!r}", size, limit)

    async def _stored_documents(self, rec: CollectionRecord, ids: list[str], known: dict[str, Row],
                                documents: list[Any], texts: list[str | None]) -> None:
        """For existing rows whose new content would come from metadata (no document sent): a row Chroma holds
        with a document keeps that document as its content, so its text is left as it is (`texts[i] = None`:
        unchanged). One Chroma get of those ids, only when there are any."""
        from_meta = [i for i, row_id in enumerate(ids) if row_id in known and texts[i] is not None
                     and not isinstance(documents[i], str)]
        if not from_meta:
            return
        resp = await self.upstream.call("POST", self._data_segments(rec, "get"),
                                        json_body={"ids": [ids[i] for i in from_meta], "include": ["documents"]},
                                        idempotent=True)
        if not isinstance(resp, dict) or not isinstance(resp.get("ids"), list):
            raise UpstreamError("unexpected backend answer")
        docs = resp.get("documents") or [None] * len(resp["ids"])
        with_document = {i for i, d in zip(resp["ids"], docs) if isinstance(d, str)}
        for i in from_meta:
            if ids[i] in with_document:
                texts[i] = None

    async def op_add(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        return await self._write(ex, params, "add")

    async def op_upsert(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        return await self._write(ex, params, "upsert")

    async def op_update(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        return await self._write(ex, params, "update")

    # -- reads ------------------------------------------------------------------------------
    def _keep(self, ex: Exchange, rec: CollectionRecord) -> Any:
        """``keep(batch_ids, stamps=None) -> set``: the ids the caller may read now. `stamps` (id → the metadata
        Chroma answered for it, when the answer holds content): a row stamped under other governance than its
        ledger row's is withheld (`stamped_as`, ``changing_row``)."""
        include_superseded, as_of = history_view(ex.query)

        def keep(batch: list[str], stamps: dict[str, Any] | None = None) -> set[str]:
            return self.authz.readable(ex, BACKEND, rec.collection_id, batch, include_superseded, as_of, stamps=stamps)
        return keep

    async def _reread_changing(self, ex: Exchange, rec: CollectionRecord, stamps: dict[str, Any]) -> None:
        """Read again, now that Chroma has answered, the ledger rows this request read before it did (an early read:
        `Authorizer.start_prefetch`, `Authorizer.visible_rows`) that disagree with the stamp their content came back
        with (`stamped_as`): an update that landed in between. What still disagrees is withheld (`_keep`)."""
        pre = ex.prefetched.get((BACKEND, rec.collection_id))
        if not pre:
            return
        stale = [i for i, meta in stamps.items() if (row := pre.get(i)) is not None and not stamped_as(meta, row)]
        if stale:
            for i in stale:
                del pre[i]
            await self.authz.prefetch(ex, BACKEND, rec.collection_id, stale, always=True)

    def _decorate(self, ex: Exchange, rec: CollectionRecord, rows: list[dict[str, Any]]) -> None:
        """Add ``mw_supersedes_id`` / ``mw_superseded_by`` to returned metadata where the linked row is
        readable by the caller (`Provenance.links`)."""
        self.prov.decorate(ex, rec.collection_id, rows, id_key="ids", meta_key="metadatas")

    def _rows(self, ex: Exchange, resp: dict[str, Any], n: int, exact: bool = False) -> list[dict[str, Any]]:
        """`_columns_to_rows`, without the rows whose shape cannot be served (`well_formed_rows`).

        When every id is a non-empty ``str`` and the row columns as a whole are `well_formed` one level
        deeper (a row holds the columns' items one level up: a column passes exactly when each of its
        items passes in its row), every row is, and none is checked on its own; otherwise each row is.
        `exact`: `resp` is (made of) values orjson decoded (`Upstream.call`'s ``exact``), for which
        `well_formed` is `nests_within`: only the nesting is checked."""
        depth = self.settings.max_json_depth + 1
        cols = _columns(resp, n)
        rows = _rows_of(cols, n)
        ids = cols.get("ids")
        if ids is not None and all(type(i) is str and i for i in ids) and (
                nests_within(cols, depth + 1) if exact else well_formed(cols, depth + 1)):
            return rows
        return well_formed_rows(ex, BACKEND, rows, lambda r: r.get("ids"), depth)

    def _query_rows(self, ex: Exchange, resp: dict[str, Any], m: int, exact: bool = False) -> list[list[dict[str, Any]]]:
        """Per query embedding of a Chroma query answer for `m` of them (``resp["ids"]``: `m` lists), its
        ranked rows (`_rows`, `exact` as there): query ``j`` holds item ``j`` of every column that is a list of
        `m` lists (``included`` aside), keyed in the answer's order; an item that is not a list leaves the column out."""
        cols = [(key, v) for key, v in resp.items() if isinstance(v, list) and key != "included" and len(v) == m]
        out: list[list[dict[str, Any]]] = []
        for j in range(m):
            sub = {key: v[j] for key, v in cols}  # an item that is not a list is no column of `_rows`
            out.append(self._rows(ex, sub, len(resp["ids"][j]), exact))
        return out

    def _check_filters(self, body: dict[str, Any]) -> None:
        for name in ("where", "where_document"):
            if body.get(name) is not None:
                check_filter_size(body[name], name, self.settings.max_filter_clauses)
        if body.get("where") is not None:
            check_client_where(body["where"])

    def _where(self, ex: Exchange, client_where: Any, mode: str | None = None) -> dict[str, Any] | None:
        if client_where is not None and not isinstance(client_where, dict):
            raise BadRequest("where must be an object")
        return and_where(client_where, visibility_where(self._p(ex), mode or self.authz.pushdown(self.settings.pushdown)))

    ID_PLAN_BACKOFF_S = 60.0  # after the backend failed an id-list read of a collection, its where filter for this long

    async def _pushdown(self, ex: Exchange, rec: CollectionRecord, client_where: Any, client_ids: list[str] | None,
                        where: dict[str, Any] | None, mode: str, early: bool = False) -> tuple[Any, list[str] | None, bool]:
        """How a read reaches the backend under the caller's visibility filter (docs/design.md §2.7): (where, ids,
        by_ids). `where` is the client's filter ANDed with `visibility_where` (`_where`), the metadata form.

        When at most ``ID_PUSHDOWN_MAX`` rows of the collection are admitted — first by the planner's counts where
        it keeps them (`QueryPlanner.admitted_rows`, no ledger read when they say more), then by the rows
        themselves — the ledger lists their ids (`Ledger.visible_row_ids`: the same predicate over its own columns,
        read now) and the backend gets (the client's own where, those ids), intersected with the client's ids in
        their order: Chroma resolves an id list at a cost that does not grow with the other rows it stores, and a
        metadata filter at one that does. Every row the backend returns is still decided by the ledger and Cedar;
        the id list admits exactly the rows `visibility_where` admits over the same governance (the stamped
        metadata is written from the ledger's row), so recall is the filter's. Otherwise (`where`, client ids).

        `early`: the read would read the rows of the whole list while the backend answers anyway (`_scan`'s early
        read: a get without ids, client filter or limit, and a count). Then, on PostgreSQL, when the counts say at
        most ``ID_PUSHDOWN_INLINE_MAX`` rows are admitted, the statement that lists them reads them too
        (`Authorizer.visible_rows`) and the read decides on those rows: one ledger round trip in all. A query and a
        filtered get read the rows the backend returned after it answered, never before: an update that rewrites a
        row's content and narrows its scope may land in between, and its new content must not be decided on the old
        scope (the early reads share that window: docs/design.md, known gap). Raises `Unauthorized` (401) when the statement finds the caller's key
        revoked."""
        limit = self.settings.id_pushdown_max
        if limit <= 0:
            return where, client_ids, False
        off = self._id_plan_off.get(rec.collection_id)
        if off is not None:
            if time.monotonic() < off:
                return where, client_ids, False
            self._id_plan_off.pop(rec.collection_id, None)
        p = self._p(ex)
        estimate = self.planner.admitted_rows(p, rec.collection_id, wide=mode == "tenant")
        if estimate is not None and estimate > limit:
            return where, client_ids, False
        reader = visibility_reader(p, mode)
        visible = None
        inline = min(self.settings.id_pushdown_inline_max, limit)
        if early and inline > 0 and estimate is not None and estimate <= inline and self.authz.lists_rows():
            # few rows: listed and read in one statement, kept for this read's decisions (one ledger round trip)
            visible = await self.authz.visible_rows(ex, BACKEND, rec.collection_id, p.tenant, reader, inline)
        if visible is None:
            visible = await offloop.call(self.ledger, self.ledger.visible_row_ids, BACKEND, rec.collection_id,
                                         p.tenant, reader, limit)
        if visible is None:
            return where, client_ids, False
        if client_ids is not None:
            admitted = set(visible)
            visible = [i for i in client_ids if i in admitted]
        return client_where, visible, True

    def _id_list_expected(self, ex: Exchange, rec: CollectionRecord, mode: str) -> bool:
        """Whether `_pushdown` is expected to send the ledger's id list (no ledger read: the planner's counts say at
        most ``ID_PUSHDOWN_MAX`` rows are admitted, and the collection's id-list reads did not fail lately)."""
        limit = self.settings.id_pushdown_max
        off = self._id_plan_off.get(rec.collection_id)
        if limit <= 0 or (off is not None and time.monotonic() < off):
            return False
        estimate = self.planner.admitted_rows(self._p(ex), rec.collection_id, wide=mode == "tenant")
        return estimate is not None and estimate <= limit

    def _id_plan_failed(self, rec: CollectionRecord) -> None:
        """The backend answered an id-list read of `rec` with a 5xx (Chroma does when a listed id is not stored, e.g.
        a row deleted straight in Chroma): its reads use the where filter for `ID_PLAN_BACKOFF_S`."""
        if len(self._id_plan_off) > 4096:
            self._id_plan_off.clear()
        self._id_plan_off[rec.collection_id] = time.monotonic() + self.ID_PLAN_BACKOFF_S
        structlog.get_logger("memwarden.planner").warning("id_pushdown_failed", collection=rec.collection_id,
                                                          fallback="where", seconds=self.ID_PLAN_BACKOFF_S)

    async def _scan(self, ex: Exchange, rec: CollectionRecord, *, ids: list[str] | None, where: Any,
                    where_document: Any, include: Any, offset: int, limit: int | None,
                    keep: Any, early: bool = True, filtered: bool = False,
                    guarded: bool = False) -> tuple[list[dict[str, Any]], list[str] | None]:
        """Page through Chroma get and keep rows for which ``keep(batch_ids[, stamps]) -> set`` holds.

        Applies `offset`/`limit` over kept rows. Returns (rows, included). `early`: the ledger rows of `ids` (at
        most a page of them) may be read while Chroma answers the first page. When the answer depends on content
        (`include` asks for some, or `filtered`: the client filtered by it), each row's stamp is fetched with it
        (`stamped_include`) and `keep` gets them (`_keep`); a row read early whose stamp disagrees is read again
        first (`_reread_changing`). When `include` names content (documents, embeddings, uris) and the fetch is not
        `guarded` (under the caller's own visibility filter, pushdown ``scope``), rows named before Chroma is asked
        (`ids`, read `early`) are decided first and only the readable ones fetched (`_scan_named`); otherwise the
        pages hold ids and stamps only and the content of the rows kept is fetched after (`content_include`,
        `_with_content`): a row the caller may not read never has its content fetched.
        """
        if limit == 0:
            return [], None
        send, checked, added = stamped_include(include, filtered)
        first, content = content_include(send, DEFAULT_GET_INCLUDE)
        if content is not None and guarded:
            first, content = send, None  # every row fetched is one the caller's visibility filter admits: one phase
        if content is not None and early and ids and len(ids) <= self.settings.page_rows:
            rows, included = await self._scan_named(ex, rec, ids=ids, where=where, where_document=where_document,
                                                    include=content, offset=offset, limit=limit)
        else:
            rows, included = await self._scan_rows(ex, rec, ids=ids, where=where, where_document=where_document,
                                                   include=first, content=content, checked=checked, offset=offset,
                                                   limit=limit, keep=keep, early=early)
        if content is not None and included is not None:  # what Chroma names for the whole include, unsplit
            included = list(dict.fromkeys([*content, *first]))
        return rows, _unstamped(rows, included) if added else included

    async def _scan_named(self, ex: Exchange, rec: CollectionRecord, *, ids: list[str], where: Any, where_document: Any,
                          include: list[str], offset: int, limit: int | None) -> tuple[list[dict[str, Any]], list[str] | None]:
        """`_scan` of rows named before Chroma is asked (a client's ids, or the id list of the tenant filter), at
        most a page, whose read includes content: decided on the ledger first (their rows read now, one trip), and
        Chroma asked in one fetch, with `include` (content and stamps), for the rows the caller may read — the
        content of a row it may not read is never fetched. The answer's rows are decided again on the same ledger
        rows against their stamps (`_reread_changing` for those that disagree); a row withheld then, or one Chroma
        did not return, is taken back out of the decision log's allowed count."""
        include_superseded, as_of = history_view(ex.query)
        await self.authz.prefetch(ex, BACKEND, rec.collection_id, ids, always=True)  # off the loop (PostgreSQL)
        try:
            readable = self.authz.readable(ex, BACKEND, rec.collection_id, ids, include_superseded, as_of)
        except BaseException:
            self.authz.release(ex, BACKEND, rec.collection_id)
            raise
        asked = [i for i in ids if i in readable]
        if not asked:
            self.authz.release(ex, BACKEND, rec.collection_id)
            return [], None
        seen: set[str] = set()

        def keep(batch: list[str], stamps: dict[str, Any] | None = None) -> set[str]:
            # counted above; what the stamps withhold now is taken back (`changing_row`)
            allowed = self.authz.readable(ex, BACKEND, rec.collection_id, batch, include_superseded, as_of,
                                          count=False, stamps=stamps)
            seen.update(batch)
            changing = len(set(batch) - allowed)
            if changing:
                ex.rows_allowed -= changing
                ex.rows_hidden_deleted += changing
                ex.row_deny_reasons[CHANGING_ROW] = ex.row_deny_reasons.get(CHANGING_ROW, 0) + changing
                ex.reason = CHANGING_ROW
            return allowed
        try:
            # the rows read above stay kept for the decision on the answer (`_scan_rows` reads only what is missing)
            return await self._scan_rows(ex, rec, ids=asked, where=where, where_document=where_document, include=include,
                                         checked=True, offset=offset, limit=limit, keep=keep, early=False)
        finally:
            self.authz.release(ex, BACKEND, rec.collection_id)
            ex.rows_allowed -= len(set(asked) - seen)  # not in Chroma, or not matching the client's filter

    async def _scan_rows(self, ex: Exchange, rec: CollectionRecord, *, ids: list[str] | None, where: Any,
                         where_document: Any, include: Any, checked: bool, offset: int, limit: int | None,
                         keep: Any, early: bool, content: list[str] | None = None) -> tuple[list[dict[str, Any]], list[str] | None]:
        """`_scan` with the include to send; `checked`: rows are kept by their stamps too; `content`: the include
        of the second phase (`content_include`), fetched for the kept rows only. A page Chroma answers over
        ``BACKEND_MAX_RESPONSE_BYTES`` is asked again at half the size, down to one row (`BackendAnswerTooLarge`
        then)."""
        page = self.settings.page_rows
        kept: list[dict[str, Any]] = []
        skipped = 0
        backend_offset = 0
        included = None
        # Ids named by the client: their ledger rows are read while Chroma answers (`start_prefetch`).
        early = self.authz.start_prefetch(ex, BACKEND, rec.collection_id, ids) if early and ids and len(ids) <= page \
            else None
        try:
            while backend_offset < self.settings.max_scan_rows:
                req: dict[str, Any] = {"ids": ids, "where": where, "where_document": where_document,
                                       "limit": page, "offset": backend_offset}
                if include is not None:
                    req["include"] = include
                exact: list[bool] = []
                try:
                    resp = await self.upstream.call("POST", self._data_segments(rec, "get"), json_body=req,
                                                    idempotent=True, exact=exact)
                except BackendAnswerTooLarge:
                    if page <= 1:
                        raise
                    page //= 2  # rows with large metadata: the same offset again, in smaller pages
                    continue
                if not isinstance(resp, dict) or not isinstance(resp.get("ids"), list):
                    raise UpstreamError("unexpected backend answer")
                included = resp.get("included", included)
                fetched = len(resp["ids"])
                batch = self._rows(ex, resp, fetched, exact == [True])
                batch_ids = [r["ids"] for r in batch]
                stamps = {r["ids"]: r.get("metadatas") for r in batch} if checked else None
                if early is not None:  # the rows of every id asked (a superset of the batch), read by now
                    task, early = early, None
                    try:
                        await task
                        if stamps:
                            await self._reread_changing(ex, rec, stamps)
                        allowed = keep(batch_ids, stamps) if checked else keep(batch_ids)
                    finally:
                        self.authz.release(ex, BACKEND, rec.collection_id)
                else:
                    # `Authorizer.prefetched` written out (no async context manager per page on the hot path)
                    await self.authz.prefetch(ex, BACKEND, rec.collection_id, batch_ids)  # off the loop (PostgreSQL)
                    try:
                        if stamps and ex.prefetched.get((BACKEND, rec.collection_id)):
                            await self._reread_changing(ex, rec, stamps)  # rows `visible_rows` read with the list
                        allowed = keep(batch_ids, stamps) if checked else keep(batch_ids)
                    finally:
                        self.authz.release(ex, BACKEND, rec.collection_id)
                served = [row for row in batch if row["ids"] in allowed]
                if skipped < offset:
                    n = min(offset - skipped, len(served))
                    skipped += n
                    served = served[n:]
                while served:
                    room = len(served) if limit is None else limit - len(kept)
                    chunk, served = served[:room], served[room:]
                    if content is not None:
                        withheld, named = await self._with_content(ex, rec, chunk, content, where, where_document)
                        chunk = [r for r in chunk if r["ids"] not in withheld]
                        included = [] if named and included is None else included
                    kept += chunk
                    if limit is not None and len(kept) >= limit:
                        return kept, included
                if fetched < page:
                    break
                backend_offset += page
            return kept, included
        finally:
            if early is not None:  # the read failed (or ended) before deciding: nothing of the early read is used
                await self.authz.abandon(early)
                self.authz.release(ex, BACKEND, rec.collection_id)

    async def _with_content(self, ex: Exchange, rec: CollectionRecord, rows: list[dict[str, Any]], include: list[str],
                            where: Any, where_document: Any) -> tuple[set[str], bool]:
        """The second phase of a read (`content_include`): the content columns of `include` for `rows` — decided
        readable on the first phase's ids and stamps — in one Chroma ``get`` by their ids (under the read's own
        `where` and `where_document`, so a row whose content stopped matching meanwhile is not served), put into
        each row in place with the stamp it came back with. A row whose stamp changed since the first phase (an
        update landed in between) is decided again on the ledger row now (`stamped_as`, ``changing_row``); a row
        Chroma no longer holds or that is withheld on that second decision is not served. Several rows of `rows`
        may share an id (a query's lists). Returns (ids withheld, whether Chroma's answer named its ``included``
        columns). An answer over
        ``BACKEND_MAX_RESPONSE_BYTES`` is asked again for each half of the ids; over it for one row (rows the caller
        may read), `BackendAnswerTooLarge`."""
        ids = list(dict.fromkeys(r["ids"] for r in rows))
        got: dict[str, dict[str, Any]] = {}
        named = False
        pending = [ids]
        while pending:
            part = pending.pop()
            exact: list[bool] = []
            try:
                resp = await self.upstream.call("POST", self._data_segments(rec, "get"), idempotent=True, exact=exact,
                                                json_body={"ids": part, "where": where, "where_document": where_document,
                                                           "include": include})
            except BackendAnswerTooLarge:
                if len(part) <= 1:
                    raise
                pending += [part[len(part) // 2:], part[:len(part) // 2]]
                continue
            if not isinstance(resp, dict) or not isinstance(resp.get("ids"), list):
                raise UpstreamError("unexpected backend answer")
            named = named or type(resp.get("included")) is list
            for r in self._rows(ex, resp, len(resp["ids"]), exact == [True]):
                got[r["ids"]] = r
        changed = list(dict.fromkeys(r["ids"] for r in rows if r["ids"] in got and _governed(
            got[r["ids"]].get("metadatas")) != _governed(r.get("metadatas"))))
        again: set[str] = set()
        if changed:
            include_superseded, as_of = history_view(ex.query)
            await self.authz.prefetch(ex, BACKEND, rec.collection_id, changed)  # off the loop (PostgreSQL)
            try:
                again = self.authz.readable(ex, BACKEND, rec.collection_id, changed, include_superseded, as_of,
                                            count=False, stamps={i: got[i].get("metadatas") for i in changed})
            finally:
                self.authz.release(ex, BACKEND, rec.collection_id)
        missing = {i for i in ids if i not in got}
        withheld = missing | {i for i in changed if i not in again}
        for r in rows:
            c = got.get(r["ids"])
            if c is not None and r["ids"] not in withheld:
                r.update((k, c[k]) for k in include if k in c)
        if withheld:
            reasons = ex.row_deny_reasons
            for reason, n in ((DELETED_ROW, len(missing)), (CHANGING_ROW, len(withheld) - len(missing))):
                if n:
                    reasons[reason] = reasons.get(reason, 0) + n
                    ex.reason = reason
            ex.rows_allowed -= len(withheld)
            ex.rows_hidden_deleted += len(withheld)
        return withheld, named

    @staticmethod
    def _rows_to_columns(rows: list[dict[str, Any]], template: list[str], included: Any) -> dict[str, Any]:
        out: dict[str, Any] = {k: [r[k] for r in rows] for k in template}
        for k in ("ids", "embeddings", "documents", "uris", "metadatas"):
            out.setdefault(k, [] if k == "ids" else None)
        out["included"] = included if included is not None else []
        return out

    async def op_get(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        rec = self._require_collection(ex, params, "list")
        body = _obj(ex.body)
        self._check_filters(body)
        ids = _ids(body.get("ids"), required=False, limit=self.settings.max_ids)
        include = body.get("include")
        offset = _nonneg_int(body.get("offset"), "offset", 0) or 0
        limit = _nonneg_int(body.get("limit"), "limit", None)
        # With explicit ids the rows are already named: Cedar filters them and no pushdown is needed
        # for recall (Chroma's filtered get costs more than the ids lookup).
        client_where = body.get("where")
        if ids is None:
            rows, included = await self._scan_pushed(ex, rec, client_where, body.get("where_document"), include,
                                                     offset, limit, self._keep(ex, rec))
        else:
            if client_where is not None and not isinstance(client_where, dict):
                raise BadRequest("where must be an object")
            rows, included = await self._scan(
                ex, rec, ids=ids, where=client_where, where_document=body.get("where_document"),
                include=include, offset=offset, limit=limit, keep=self._keep(ex, rec),
                filtered=client_where is not None or body.get("where_document") is not None)
        self._decorate(ex, rec, rows)
        template = list(rows[0].keys()) if rows else ["ids"] + [k for k in (include or ["metadatas", "documents"]) if k in ("embeddings", "documents", "uris", "metadatas")]
        ex.row_ids = [r["ids"] for r in rows]
        return 200, self._rows_to_columns(rows, template, included)

    async def op_count(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        rec = self._require_collection(ex, params, "list")
        rows, _ = await self._scan_pushed(ex, rec, None, None, [], 0, None, self._keep(ex, rec))
        return 200, len(rows)

    async def _scan_pushed(self, ex: Exchange, rec: CollectionRecord, client_where: Any, where_document: Any,
                           include: Any, offset: int, limit: int | None,
                           keep: Any) -> tuple[list[dict[str, Any]], list[str] | None]:
        """`_scan` of a get without ids or a count, under the caller's visibility filter in the form `_pushdown`
        chooses; a backend 5xx on an id list is answered by the same scan under the metadata filter
        (`_id_plan_failed`). Raises `BadRequest` (400) for a `client_where` that is not an object."""
        mode = self.authz.pushdown(self.settings.pushdown)
        where = self._where(ex, client_where, mode)
        # an id list's rows are read early (while Chroma answers, or with the list itself: `_pushdown`) only when the
        # read will use them all: no client filter and no page shorter than the list
        whole = client_where is None and where_document is None
        b_where, b_ids, by_ids = await self._pushdown(ex, rec, client_where, None, where, mode,
                                                      early=whole and limit is None)
        early = b_ids is not None and whole and (limit is None or offset + limit >= len(b_ids))
        try:
            return await self._scan(ex, rec, ids=b_ids, where=b_where, where_document=where_document, include=include,
                                    offset=offset, limit=limit, keep=keep, early=early, filtered=not whole,
                                    guarded=mode == "scope")
        except BackendServerError:
            if not by_ids:
                raise
            self._id_plan_failed(rec)
        return await self._scan(ex, rec, ids=None, where=where, where_document=where_document, include=include,
                                offset=offset, limit=limit, keep=keep, filtered=not whole, guarded=mode == "scope")

    async def op_query(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        rec = self._require_collection(ex, params, "search")
        body = _obj(ex.body)
        self._check_filters(body)
        embeddings = body.get("query_embeddings")
        if not isinstance(embeddings, list) or not embeddings:
            raise BadRequest("query_embeddings must be a non-empty list")
        k = _nonneg_int(body.get("n_results"), "n_results", 10) or 0
        ids = _ids(body.get("ids"), required=False, limit=self.settings.max_ids)
        client_where = body.get("where")
        mode = self.authz.pushdown(self.settings.pushdown)
        where = self._where(ex, client_where, mode)
        pending = list(range(len(embeddings)))
        final: dict[int, list[dict[str, Any]]] = {}
        included: Any = None
        # The plan (`sidecar.planner`): an unfiltered over-fetch first — if it holds k readable rows they are
        # the true top k (no readable row can rank above a fetched one) — or the pushdown from the start.
        # A short over-fetch is refilled under the pushdown, starting again at k × OVERFETCH_FACTOR.
        if self.planner.mode == "auto" and self.planner.stale(rec.collection_id) and offloop.blocking(self.ledger):
            # the planner's statistics (a GROUP BY over the collection's rows), read in a worker thread
            self.planner.warm(rec.collection_id, await offloop.call(
                self.ledger, self.ledger.visibility_counts, BACKEND, rec.collection_id))
        plan = self.planner.plan(self._p(ex), rec.collection_id, k, wide=mode == "tenant")
        n_fetch = plan.n_fetch
        unfiltered = plan.unfiltered
        send, checked, added = stamped_include(body.get("include"), filtered=True)  # ranked by content
        # A fetch without the caller's own visibility filter (the unfiltered over-fetch, any fetch under pushdown
        # ``tenant``) is ranked on ids, distances and stamps, and the content of the rows it serves is fetched
        # after (`_with_content`); one under it (pushdown ``scope``) holds only rows the filter admits: one phase.
        first, content = content_include(send, DEFAULT_QUERY_INCLUDE)
        guarded = mode == "scope"
        if unfiltered and content is not None and guarded and self.planner.mode == "auto" \
                and self._id_list_expected(ex, rec, mode):
            # the id list is about as cheap for Chroma as no filter, and it saves the second phase
            unfiltered = False
            n_fetch = min(max(k * self.settings.overfetch_factor, 1), self.settings.max_scan_rows)
        # what the backend gets: (where, ids, whether ids is the visibility filter's id list — `_pushdown`)
        sent = (client_where, ids, False) if unfiltered else await self._pushdown(ex, rec, client_where, ids, where, mode)
        readable_of = self._keep(ex, rec)
        tally = [0, 0]  # candidates decided, readable (of the first fetch: the planner's observation)
        split: set[int] = set()  # query lists made of a fetch without content (its second phase is owed)
        stamps: dict[str, Any] | None = None  # of the fetch being decided

        def keep(batch: list[str]) -> set[str]:
            allowed = readable_of(batch, stamps) if checked else readable_of(batch)
            tally[0] += len(batch)
            tally[1] += len(allowed)
            return allowed

        while pending:
            req = {**body, "query_embeddings": [embeddings[i] for i in pending], "n_results": n_fetch,
                   "where": sent[0], "ids": sent[1]}
            two_phase = content is not None and (unfiltered or not guarded)
            if two_phase:
                req["include"] = first
            elif added:
                req["include"] = send
            exact: list[bool] = []
            try:
                resp = await self.upstream.call("POST", self._data_segments(rec, "query"), json_body=req,
                                                idempotent=True, exact=exact)
            except BackendAnswerTooLarge:
                if not unfiltered:
                    raise
                # The unfiltered over-fetch held rows with large metadata: the same fetch under the pushdown.
                unfiltered = False
                sent = await self._pushdown(ex, rec, client_where, ids, where, mode)
                continue
            except BackendServerError:
                if not sent[2]:
                    raise
                self._id_plan_failed(rec)  # the same fetch again under the metadata filter
                sent = (where, ids, False)
                continue
            if not isinstance(resp, dict) or not isinstance(resp.get("ids"), list) or len(resp["ids"]) != len(pending) \
                    or not all(isinstance(x, list) for x in resp["ids"]):
                raise UpstreamError("unexpected backend answer")
            included = resp.get("included", included)
            per_query = self._query_rows(ex, resp, len(pending), exact == [True])
            if checked:
                stamps = {r["ids"]: r.get("metadatas") for rows in per_query for r in rows}
            # `Authorizer.prefetched` written out (no async context manager per fetch on the hot path)
            await self.authz.prefetch(ex, BACKEND, rec.collection_id,  # off the loop (PostgreSQL)
                                      [r["ids"] for rows in per_query for r in rows[:max(k, 1) * 4]])
            try:
                taken = self._first_readable(ex, rec, per_query, k, keep)
            finally:
                self.authz.release(ex, BACKEND, rec.collection_id)
            still: list[int] = []
            for j, i in enumerate(pending):
                exhausted = len(resp["ids"][j]) < n_fetch or n_fetch >= self.settings.max_scan_rows
                if len(taken[j]) >= k or exhausted:
                    final[i] = taken[j]
                    if two_phase:
                        split.add(i)
                else:
                    still.append(i)
            pending = still
            if unfiltered:
                self.planner.observe(self._p(ex), rec.collection_id, tally[0], tally[1])
                unfiltered = False  # refill under the pushdown, starting again at the first size
                if not pending:
                    break  # the over-fetch held the top k of every list: no refill, nothing to list
                sent = await self._pushdown(ex, rec, client_where, ids, where, mode)
                n_fetch = min(max(k * self.settings.overfetch_factor, 1), self.settings.max_scan_rows)
                continue
            n_fetch = min(n_fetch * 2, self.settings.max_scan_rows)
        if content is not None and split:
            served = [r for i in split for r in final[i]]
            withheld, named = await self._with_content(ex, rec, served, content, client_where,
                                                       body.get("where_document")) if served else (set(), False)
            if withheld:
                final = {i: [r for r in rows if r["ids"] not in withheld] if i in split else rows
                         for i, rows in final.items()}
            if included is not None or named:  # what Chroma names for the whole include, unsplit
                included = list(dict.fromkeys([*content, *first]))
        for rows in final.values():
            if added:
                included = _unstamped(rows, included)
            self._decorate(ex, rec, rows)
        ranked = [final[i] for i in range(len(embeddings))]
        ex.row_ids = [r["ids"] for rows in ranked for r in rows]
        return 200, _query_result(ranked, body.get("include"), included)

    def _first_readable(self, ex: Exchange, rec: CollectionRecord, ranked: list[list[dict[str, Any]]],
                        k: int, keep: Any) -> list[list[dict[str, Any]]]:
        """For each ranked candidate list, its first `k` readable rows (rank order kept).

        Rows are decided lazily, in batched windows of at most `k` undecided rows per list, so an
        over-fetched tail is only sent to Cedar when earlier rows were denied.
        """
        decided: dict[str, bool] = {}
        taken: list[list[dict[str, Any]]] = [[] for _ in ranked]
        pos = [0] * len(ranked)
        get = decided.get
        while True:
            wanted: list[str] = []
            for j, rows in enumerate(ranked):
                got = taken[j]
                p, end = pos[j], len(rows)
                while p < end and len(got) < k:
                    d = get(rows[p]["ids"])
                    if d is None:
                        break
                    if d:
                        got.append(rows[p])
                    p += 1
                pos[j] = p
                need = k - len(got)
                if need > 0:
                    wanted += [r["ids"] for r in rows[p:p + need] if r["ids"] not in decided]
            if not wanted:
                return taken
            wanted = list(dict.fromkeys(wanted))
            allowed = keep(wanted)
            for i in wanted:
                decided[i] = i in allowed

    # -- deletes ----------------------------------------------------------------------------
    async def op_delete(self, ex: Exchange, params: dict[str, str]) -> tuple[int, Any]:
        rec = await offloop.call(self.ledger, self._collection, ex, params)
        body = _obj(ex.body)
        self._check_filters(body)
        ids = _ids(body.get("ids"), required=False, limit=self.settings.max_ids)
        where, where_document = body.get("where"), body.get("where_document")
        bulk = ids is None
        self.authz.require(ex, "delete_bulk" if bulk else "list", self._coll_entity(rec), [namespace_entity(rec.tenant, rec.database)])
        if bulk and not where and not where_document:
            raise BadRequest("delete needs ids, where or where_document")
        limit = _nonneg_int(body.get("limit"), "limit", None)
        if ids is not None and not where and not where_document:
            # By id alone the ledger is the source of truth: the tombstone does not wait for the backend.
            candidate_ids = ids
        else:
            candidates, _ = await self._scan(
                ex, rec, ids=ids, where=self._where(ex, where, "tenant"), where_document=where_document,
                include=[], offset=0, limit=None, keep=lambda batch: set(batch),
            )
            candidate_ids = [r["ids"] for r in candidates]
        candidate_ids = list(dict.fromkeys(candidate_ids))
        decided = await offloop.call(self.ledger, deletes.decide, self, ex, rec.collection_id, candidate_ids,
                                     by_ids=ids is not None and not where and not where_document, limit=limit)
        if not decided.allowed:  # a refused delete, or one of missing ids: 200, as Chroma answers it
            return 200, {"deleted": 0}
        return 200, {"deleted": await deletes.delete_rows(self, ex, rec.collection_id, decided.allowed, self.client)}

    async def reconcile(self) -> int:
        """Retry backend deletes of tombstones not yet confirmed, then look for tombstoned rows that
        reappeared in the backend (written around the sidecar, or a lost delete): each is logged as an
        alert and deleted again. They are never served either way (the ledger says deleted).
        Returns the number of backend deletes issued."""
        done = await deletes.retry_pending(self, self.client)
        return done + await deletes.recheck(self, self.client, deletes.Cursor())

    def lineage_collection(self, ex: Exchange) -> str:
        """``?collection=<uuid>`` of a collection registered to the caller's tenant (else 404), after
        the collection-level ``list`` decision (as get and count)."""
        coll = ex.query.get("collection")
        if not coll:
            raise BadRequest("collection (the collection UUID) is required")
        rec = self.ledger.get_collection(BACKEND, coll)
        if rec is None or rec.tenant != self._p(ex).tenant:
            raise NotFound("collection not found", reason="unknown_collection")
        self.authz.require(ex, "list", self._coll_entity(rec), [namespace_entity(rec.tenant, rec.database)])
        return rec.collection_id


def _public(coll: Any) -> Any:
    """Chroma's collection JSON as a client is shown it: without the create nonce (`INTENT_KEY`); metadata that
    held only the nonce is null, as Chroma shows a collection created without metadata."""
    if not isinstance(coll, dict) or not isinstance(coll.get("metadata"), dict) or INTENT_KEY not in coll["metadata"]:
        return coll
    meta = {k: v for k, v in coll["metadata"].items() if k != INTENT_KEY}
    return {**coll, "metadata": meta or None}
