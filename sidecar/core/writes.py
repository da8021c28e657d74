"""The write transaction, once for every backend (docs/design.md §2.6 and §4; issue 35).

A `sidecar.core.operations.WriteRows` or `PatchMetadata` is decided by the profile on the rows it names (write,
update, redistribute, the echo and write-once checks); then it is carried out here, around the profile's own
backend call (``forward``: the encoded write, stamps included):

- `holding`: an update of existing rows holds their update markers (`sidecar.core.updates`) from before its
  decisions are final to its ledger write; another update of one of them meanwhile is 409.
- `write_rows` (the backend takes the caller's ids: Chroma): new rows are **reserved** in the ledger (pending:
  never served, but their lineage edges recorded, so a concurrent deletion closure finds them), their parents,
  supersession and forgotten content are checked again while pending, the write is **forwarded**, the new rows are
  **activated** (a single-valued fact supersedes the one active now, only if the caller may update it); when that
  is refused the new rows are **withdrawn** (deleted from the backend, then released) and the refusal raised.
- `activate_new` (the backend chooses the ids, ``Capabilities.server_ids``: Mem0): the write was forwarded first;
  the rows it made are reserved, checked and activated now; refused or tombstoned meanwhile, they are withdrawn
  (released, deleted from the backend; a row the backend will not delete now is tombstoned for the reconciler).
- `govern`: the **governance update** of the existing rows the write changed (new scope, fleet, readers, labels,
  content HMAC; a version per row), releasing the markers with it; or, when it changed none, the markers alone.

Two withdrawal orders remain (see `write_rows` and `activate_new`): with client ids the backend delete comes before
the release, so a released id is never one the backend still holds; with server ids no id can be reused, so the
release comes first and a failed backend delete tombstones the row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from sidecar.core import updates
from sidecar.core.failpoints import crash
from sidecar.core.governed import Governed
from sidecar.core.operations import Deleter
from sidecar.errors import Conflict, Forbidden, MemwardenError, UpstreamError
from sidecar.exchange import Exchange
from sidecar.governance import Row, ref
from sidecar.ledger import offloop
from sidecar.ledger.base import UpdateLost
from sidecar.stages.authorize import settle_rows

T = TypeVar("T")

FORGOTTEN = "this content was deleted and may not be written again"
DELETED_WHILE_WRITTEN = "a memory this write derives from was deleted while it was written"


def with_governance(row: Row, requested: Mapping[str, Any]) -> Row:
    """A copy of `row` with the governance an update requests (``mw_scope``, ``mw_fleet``, ``mw_readers``,
    ``mw_labels``, parsed by `sidecar.provenance.split_metadata`); what it does not request stays as it is."""
    return dataclasses.replace(row, scope=requested.get("mw_scope", row.scope), fleet=requested.get("mw_fleet", row.fleet),
                               readers=requested.get("mw_readers", row.readers),
                               labels=requested.get("mw_labels", row.labels))


def moves(before: Row, after: Row) -> bool:
    """Whether an update from `before` to `after` changes who may see the row (scope, fleet, readers, labels): then
    it is a ``redistribute`` too."""
    return (after.scope, after.fleet, after.readers, after.labels) != (before.scope, before.fleet, before.readers,
                                                                       before.labels)


def decide_changes(gov: Governed, ex: Exchange, changes: Sequence[tuple[Row, Row]], named: Sequence[str]) -> None:
    """Cedar ``update`` on each existing row as it is (`changes`: (the ledger row, the row after this write), in
    request order), then ``redistribute`` on those whose governance `moves`, with the target (``target_fleet``,
    ``target_scope``) in its context. Raises `Forbidden` (403) at the first action denied for any row, with the
    request's row counts settled (`named`: every id the request names; those not denied count as allowed)."""
    assert ex.principal is not None
    tenant = ex.principal.tenant
    for action in ("update", "redistribute"):
        batch = [before for before, after in changes if action == "update" or moves(before, after)]
        if not batch:
            continue
        contexts = [{"target_fleet": ref("Fleet", f"{tenant}/{after.fleet}"), "target_scope": after.scope}
                    for before, after in changes if moves(before, after)] if action == "redistribute" else None
        decisions = gov.authz.decide_rows(ex, action, batch, contexts)
        denied = [(r.row_id, d.reason) for r, d in zip(batch, decisions) if not d.allowed]
        if denied:
            ex.decision, ex.deny_action = "deny", action
            refused = {i for i, _ in denied}
            settle_rows(ex, [i for i in dict.fromkeys(named) if i not in refused], denied)
            raise Forbidden(f"{action} is not permitted for {len(denied)} of {len(batch)} rows")


async def holding(gov: Governed, ex: Exchange, collection: str, seen: Mapping[str, Row],
                  body: Callable[[], Awaitable[T]]) -> T:
    """``await body()`` holding the update markers of the rows `seen` (row id → the ledger row this request read and
    decided on; none: no marker is taken). The markers are released when `body` raises; when it returns, its
    `govern` released them. Raises `sidecar.errors.Conflict` (409) as `updates.begin`, `body` untouched."""
    if not seen:
        return await body()
    await updates.begin(gov.ledger, gov.settings, ex, gov.name, collection, seen)
    try:
        return await body()
    except BaseException:
        await updates.end(gov.ledger, ex, gov.name, collection, list(seen))
        raise


async def govern(gov: Governed, ex: Exchange, collection: str, changed: list[Row], *, held: list[str],
                 history: Mapping[str, str | None] | None = None, failpoint: bool | None = None) -> None:
    """The ledger write of a write's existing rows: `changed` (their new governance and content HMAC) recorded
    (`Ledger.update_governance`, with `history`: the backend's history entry each version names), releasing the
    markers this request holds (`held`: the ids `holding` took; none: it holds none). When `changed` is empty the
    markers alone are released. `failpoint` (default: whether `changed` is non-empty): the write changed content
    or governance, so the ``update-governance`` crash point applies. Raises `Conflict` (409) when this update
    outlived its lease and another took a row over (`updates.write_governance`): nothing is written."""
    if failpoint if failpoint is not None else bool(changed):
        if "update-governance" in gov.settings.failpoints:
            crash()  # the new content and its stamp are in the backend, the ledger has the old governance
    if changed:
        if held:
            await updates.write_governance(gov.ledger, ex, changed, history)  # the markers released with it
        else:
            await offloop.call(gov.ledger, gov.ledger.update_governance, changed, history=history)
    elif held:
        await updates.end(gov.ledger, ex, gov.name, collection, held)


def check_pending(gov: Governed, ex: Exchange, rows: list[Row]) -> None:
    """The provenance checks of new rows, made again while they are reserved (pending): their parents are readable
    and live, a single-valued fact may be superseded by the caller, their content is no deleted row's the caller
    could read. Raises `Forbidden` (403), `NotFound` (404) or `Conflict` (409) as `sidecar.provenance`."""
    gov.prov.check_parents(ex, rows)
    gov.prov.check_supersession(ex, rows)
    gov.prov.check_forgotten(ex, [r for r in rows if r.content_hmac])


async def write_rows(gov: Governed, ex: Exchange, collection: str, new_rows: list[Row], changed: list[Row], *,
                     held: list[str], forward: Callable[[], Awaitable[T]], client: Deleter) -> T:
    """Carry out a decided write whose ids the caller chose: reserve `new_rows` (409 ``ids already exist`` when
    another write reserved one first), `check_pending`, ``await forward()`` (the backend write of the new rows and
    of the existing ones, `changed` among them), activate the new rows, then `govern` the existing ones (`held`:
    the markers this request holds). A failure before the backend answered releases the reservations. An
    activation refused (`Forbidden`, `Conflict`: another write replaced a fact meanwhile) withdraws the new rows —
    deleted from the backend, then released — records the governance of `changed` (their update did reach the
    backend) and raises. Returns what `forward` returned."""
    new_ids = [r.row_id for r in new_rows]
    if await offloop.call(gov.ledger, gov.ledger.reserve_rows, new_rows):
        raise Conflict("ids already exist")
    try:
        # Checked with the new rows pending (their lineage edges recorded): a concurrent delete either came first
        # and is seen here, or its deletion closure finds them and they never activate.
        await offloop.call(gov.ledger, check_pending, gov, ex, new_rows)
        result = await forward()
    except BaseException:
        # Submitted to its thread before anything else can run: the reservations are freed whatever happens to
        # this task from here on.
        await offloop.call(gov.ledger, gov.ledger.release_rows, gov.name, collection, new_ids)
        raise
    if "activate" in gov.settings.failpoints:
        crash()
    try:
        await offloop.call(gov.ledger, gov.prov.activate, ex, collection, new_rows)
    except (Forbidden, Conflict):
        # The new rows were never served (still pending): take them back out of the backend, free their ids.
        try:
            if new_ids:
                await client.delete(collection, new_ids)
        finally:
            def withdraw() -> None:
                gov.ledger.release_rows(gov.name, collection, new_ids)
                if changed:  # updates of existing rows in this request did reach the backend
                    try:
                        gov.ledger.update_governance(changed, holder=ex.request_id if held else None)
                    except UpdateLost:  # taken over (this update outlived its lease): the new one writes them
                        pass
            await offloop.call(gov.ledger, withdraw)
        raise
    await govern(gov, ex, collection, changed, held=held)
    return result


async def activate_new(gov: Governed, ex: Exchange, collection: str, added: list[Row],
                       client: Deleter) -> tuple[MemwardenError | None, list[tuple[str, str]]]:
    """Reserve, check and activate `added`: rows the backend already made (it chose their ids). While they are
    pending, their parents and forgotten content are checked again and a single-valued fact supersedes the active
    one only if this caller may update it now. Returns (the refusal that withdrew them, or None when every row is
    active; the (collection, row id) keys tombstoned meanwhile, for the caller's backend delete). A withdrawn row
    (refused, or tombstoned by a concurrent deletion closure while pending) is released and deleted from the
    backend, or tombstoned when the backend will not delete it now. Raises `UpstreamError` (502) when the backend
    reused an id the ledger holds."""
    if await offloop.call(gov.ledger, gov.ledger.reserve_rows, added):
        raise UpstreamError("backend reused a memory id")

    def settle() -> None:
        gov.prov.check_parents(ex, added)
        if gov.prov.forgotten(ex, added):
            raise Conflict(FORGOTTEN)
        gov.prov.activate(ex, collection, added)
    withdrawn: MemwardenError | None = None
    try:
        await offloop.call(gov.ledger, settle)
    except (Forbidden, Conflict) as exc:
        withdrawn = exc
    live = await offloop.call(gov.ledger, gov.ledger.get_rows, gov.name, collection, [r.row_id for r in added])
    status = {r.row_id: live[r.row_id].status if r.row_id in live else "missing" for r in added}
    if withdrawn is None and any(v != "active" for v in status.values()):
        # tombstoned by a concurrent deletion closure while pending (its deleter removes them from the backend)
        withdrawn = Conflict(DELETED_WHILE_WRITTEN)
    closed: list[tuple[str, str]] = []
    if withdrawn is not None:
        # Never served (never active): free the reservations and take the rows back out of the backend. A row the
        # backend will not delete now is tombstoned instead, for the reconciler.
        pending = [i for i, v in status.items() if v == "pending"]
        await offloop.call(gov.ledger, gov.ledger.release_rows, gov.name, collection, pending)
        stuck = []
        for row_id in pending:
            try:
                await client.delete(collection, [row_id])
            except MemwardenError:
                stuck.append(row_id)
        if stuck:
            assert ex.principal is not None
            closed += await offloop.call(gov.ledger, gov.ledger.tombstone, gov.name, collection, stuck,
                                         ex.principal.uid[1], ex.request_id, closure=gov.settings.deletion_closure)
    return withdrawn, closed
