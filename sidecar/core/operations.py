"""The operation vocabulary: what a backend profile decodes a routed request into, and what the core needs of a
backend's client to carry it out (issue 35, "the narrow waist").

A profile holds routes, a row codec (backend row ↔ id, content, metadata, governance stamp), a filter translator
(`sidecar.core.visibility` → the backend's filter; client filters checked, refused where not exact), a backend
client and its `Capabilities`. Every governance rule runs in the core, on these operations. The vocabulary as the
two profiles use it today (Chroma HTTP API v2, `sidecar.backends.chroma`; Mem0 OSS REST, `sidecar.backends.mem0`):

=====================  ==========================================  ===============================================
operation              Chroma                                      Mem0
=====================  ==========================================  ===============================================
`ReadByIds`            ``get`` with ``ids`` (no filter); the       ``GET /memories/{id}``,
                       second phase of a content read, the         ``GET /memories/{id}/history`` (`history`)
                       pre-write ``get`` (ids already stored?)
`Scan`                 ``get`` with ``where``/``where_document``,  ``GET /memories`` (one call per owning agent,
                       ``offset``/``limit`` over readable rows;    top_k ≤ 1000), ``DELETE /memories`` and a
                       ``count``; a delete's candidates            tenant admin's ``/reset`` (candidates)
`Rank`                 ``query`` (per query embedding, refill      ``POST /search`` (one query text, refill by a
                       over-fetch under pushdown)                  larger ``top_k``: no offset)
`WriteRows`            ``add``/``upsert``/``update`` (client ids,  ``POST /memories`` (server ids: Mem0's events
                       many rows)                                  ADD/UPDATE/DELETE/NONE name the rows)
`PatchMetadata`        ``update`` of rows whose content stays      ``PUT /memories/{id}`` (text and/or metadata;
                       (Chroma merges metadata)                    Mem0 merges metadata)
`Delete`               ``delete`` by ``ids`` (all-or-nothing) or   ``DELETE /memories/{id}`` (by id), ``DELETE
                       by ``where``/``where_document`` (what the   /memories`` (by filter: what the caller may
                       caller may delete; ``limit``)               delete)
`Decide`               tenants, databases, collections,            ``/configure*``, ``/generate-instructions``,
                       heartbeat, ``/reset`` (deployment)          operator ``/reset`` (deployment)
`Blocked`              (unmapped routes: 404)                      ``/auth/*``, ``/api-keys``, ``/entities``,
                                                                   ``/requests`` (403 ``blocked_route``)
=====================  ==========================================  ===============================================

The write transaction over `WriteRows`/`PatchMetadata` is `sidecar.core.writes`; the delete transaction over
`Delete` (tombstones first, deletion closure, backend delete, confirmation), the reconciler (retry, reappearance
check) and the operator's reset are `sidecar.core.deletes`. Reads (`ReadByIds`, `Scan`, `Rank`: plan and pushdown,
refill, paging over readable rows, stamp checks) are still written in each profile.

`Capabilities` says what the core may count on: ``server_ids`` (the backend chooses row ids, so rows are reserved
after the backend write, not before: Mem0), ``id_list_filter`` (a read can be narrowed to an id list: Chroma),
``metadata_merge`` (a metadata write merges into the stored metadata, so an unchanged stamp is left out and a
removed governed key is sent as null), ``count`` (a server-side count), ``history`` (per-row version history:
Mem0), ``batch_delete`` (one call deletes many ids: Chroma; else one call per id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Protocol, Sequence

WriteMode = Literal["add", "upsert", "update"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend's client can do (see the module docstring); every flag defaults to the narrower answer."""

    server_ids: bool = False
    id_list_filter: bool = False
    metadata_merge: bool = False
    count: bool = False
    history: bool = False
    batch_delete: bool = False
    cursor_paging: bool = False


@dataclass(frozen=True, slots=True)
class HistoryView:
    """Which versions of a row a read may reach: superseded rows too (``include_superseded``), or the rows current
    at ``as_of`` (UTC µs). The default is the live rows only."""

    include_superseded: bool = False
    as_of: int | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """``offset`` and ``limit`` over the rows the caller may read (never over what the backend returned); ``limit``
    None is no limit."""

    offset: int = 0
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class ReadByIds:
    """Read the named rows of ``collection`` (unique ids, at most ``MAX_IDS``). An unreadable row is answered as a
    missing one. ``content``: the rows' content is served (so each row's stamp is checked against its ledger
    governance, `sidecar.governance.stamped_as`)."""

    collection: str
    ids: tuple[str, ...]
    content: bool = True
    history: HistoryView = HistoryView()


@dataclass(frozen=True, slots=True)
class Scan:
    """List the rows of ``collection`` a client filter (``where``: the backend's own language, already checked
    exact by the profile's filter translator) admits, narrowed to ``ids`` when given, paged over readable rows.
    ``count_only``: the number of readable rows, no row."""

    collection: str
    where: Any = None
    ids: tuple[str, ...] | None = None
    page: Page = Page()
    content: bool = True
    count_only: bool = False
    history: HistoryView = HistoryView()


@dataclass(frozen=True, slots=True)
class Rank:
    """The ``k`` nearest readable rows of ``collection`` to each query (an embedding, or a query text the backend
    embeds), in rank order, under a client filter (as `Scan`'s)."""

    collection: str
    queries: tuple[Any, ...]
    k: int
    where: Any = None
    content: bool = True
    history: HistoryView = HistoryView()


@dataclass(frozen=True, slots=True)
class RowWrite:
    """One row of a write: its id (None: the backend chooses it, ``Capabilities.server_ids``), its content text
    (None: unchanged, or none), its plain (client) metadata, the governance it requests (``mw_scope``, ``mw_fleet``,
    ``mw_readers``, ``mw_labels``, and on a new row its parents and triple: `sidecar.provenance.split_metadata`)
    and the shown-only governed keys it sent back (`sidecar.core.echo.set_aside`)."""

    row_id: str | None
    text: str | None
    plain: Mapping[str, Any]
    requested: Mapping[str, Any]
    claimed: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class WriteRows:
    """Write ``rows`` into ``collection``: ``add`` (every id new), ``upsert`` (new or existing), ``update`` (every id
    exists and is readable). All-or-nothing: one refused row refuses the write."""

    collection: str
    mode: WriteMode
    rows: tuple[RowWrite, ...]


@dataclass(frozen=True, slots=True)
class PatchMetadata:
    """Change one existing row's governance request and/or plain metadata (and its text, when given), keeping its
    id: an update whose row must be readable, then ``update`` (and ``redistribute`` when its governance moves)."""

    collection: str
    row: RowWrite


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete rows of ``collection``: by ``ids`` alone (all-or-nothing, as a write: a named row the caller may read
    but not delete refuses the whole delete, 403; one it cannot read is a missing id), or by a filter ``where``
    (optionally within ``ids``): the matching rows the caller may delete, at most ``limit``. Tombstoned in the ledger
    before the backend is called; derived rows follow the deletion closure."""

    collection: str
    ids: tuple[str, ...] | None = None
    where: Any = None
    limit: int | None = None

    @property
    def by_ids(self) -> bool:
        """Whether this delete names its rows (all-or-nothing) rather than filtering for them."""
        return self.ids is not None and self.where is None


@dataclass(frozen=True, slots=True)
class Decide:
    """A request-level decision on one resource: Cedar ``action`` on a collection, a namespace (``tenant/database``)
    or the deployment; the request is forwarded as it is once allowed."""

    action: str
    resource: Literal["collection", "namespace", "deployment"]
    name: str


@dataclass(frozen=True, slots=True)
class Blocked:
    """A route that never reaches the backend (403, ``reason``)."""

    reason: str = "blocked_route"


Operation = ReadByIds | Scan | Rank | WriteRows | PatchMetadata | Delete | Decide | Blocked


@dataclass(frozen=True, slots=True)
class StoredRow:
    """A row as the backend answered it, decoded by the profile's row codec: its id, its content (None when not
    asked or none), its plain metadata and its governance stamp (the ``mw_*`` keys)."""

    row_id: str
    content: Any
    metadata: Mapping[str, Any]
    stamp: Mapping[str, Any]


class Deleter(Protocol):
    """The part of a backend's client the delete transaction needs (`sidecar.core.deletes`)."""

    capabilities: Capabilities

    def holds(self, collection: str) -> bool:
        """Whether this client deletes the rows of ledger collection `collection` (a row of another deployment
        sharing the ledger stays pending for that deployment's reconciler)."""
        ...

    async def delete(self, collection: str, ids: Sequence[str]) -> None:
        """Delete `ids` from `collection` (one id unless ``capabilities.batch_delete``). An id the backend does not
        hold counts as deleted; any other failure raises (a `sidecar.errors.MemwardenError`)."""
        ...


class Reconciled(Deleter, Protocol):
    """The part of a backend's client the reconciler needs (`sidecar.core.deletes.recheck`)."""

    async def present(self, collection: str, ids: Sequence[str]) -> list[str]:
        """Those of `ids` the backend holds in `collection` (none when it no longer has the collection)."""
        ...


class Backend(Reconciled, Protocol):
    """What a profile's client does for the core, one method an operation of the vocabulary. Rows come back decoded
    (`StoredRow`); filters go in the backend's own language (the profile's filter translator made them)."""

    async def fetch(self, collection: str, ids: Sequence[str], *, content: bool) -> list[StoredRow]:
        """The rows of `ids` the backend holds (`ReadByIds`), in the order of `ids`."""
        ...

    async def scan(self, collection: str, where: Any, ids: Sequence[str] | None, page: Page,
                   *, content: bool) -> list[StoredRow]:
        """One page of the rows `where` admits (`Scan`), in the backend's order."""
        ...

    async def rank(self, collection: str, queries: Sequence[Any], k: int, where: Any,
                   ids: Sequence[str] | None, *, content: bool) -> list[list[StoredRow]]:
        """Per query, its `k` nearest rows `where` admits (`Rank`), nearest first."""
        ...

    async def write(self, collection: str, mode: WriteMode, payload: Any) -> Any:
        """Forward an encoded write (`WriteRows`: the profile's wire body, stamps included); the backend's answer
        (with ``server_ids``, the ids it chose are in it)."""
        ...

    async def patch(self, collection: str, row_id: str, payload: Any) -> Any:
        """Forward an encoded change of one row (`PatchMetadata`)."""
        ...
