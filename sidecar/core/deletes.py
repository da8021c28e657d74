"""The delete transaction, once for every backend (docs/design.md §4; issue 35).

A `sidecar.core.operations.Delete` is carried out in three steps, each here:

1. `decide`: the candidate rows (named, or found by the profile's scan of the filter) are read from the ledger; an
   id the ledger does not know, or holds tombstoned or reserved, is refused before Cedar (``unknown_row``,
   ``deleted_row``); every live row is decided by Cedar ``delete`` (an owner may delete a restricted row it cannot
   read). A delete by ids is all-or-nothing, as a write: a named row the caller may read but not delete refuses the
   whole delete (`Forbidden`, 403, nothing deleted); one it cannot read is a missing id. A delete by filter deletes
   the matching rows the caller may delete. The row counts and the decision-log outcome are settled by the one
   counting rule (`sidecar.stages.authorize.settle_rows`).
2. `delete_rows`: the allowed rows are tombstoned durably with their deletion closure (derived rows, the caller's
   deletable copies of the same content: `sidecar.provenance.Provenance.tombstone`) before the backend is called.
3. `backend_delete`: the tombstoned rows are deleted from the backend and each delete confirmed in the ledger;
   what fails stays pending for the reconciler (never served either way: the ledger says deleted).

How a refusal is answered is the profile's (its backend's own "not found" shape: Chroma answers a delete of a
missing id 200 ``{"deleted": 0}``, Mem0 404); `tests/conformance` pins it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence, TypeVar

import structlog

from sidecar.core.failpoints import crash
from sidecar.core.governed import LIVE, Governed
from sidecar.core.operations import Deleter, Reconciled
from sidecar.errors import Forbidden
from sidecar.exchange import Exchange
from sidecar.governance import Row
from sidecar.ledger import offloop
from sidecar.stages.authorize import DELETED_ROW, UNKNOWN_ROW, settle_rows

T = TypeVar("T")

BEFORE_CEDAR = (UNKNOWN_ROW, DELETED_ROW)  # refusal reasons of ids no Cedar decision was asked for


@dataclass(frozen=True, slots=True)
class Decided:
    """The outcome of `decide`: the rows to delete (`allowed`, in candidate order) and the refused ids with their
    reasons (`refused`: ids refused before Cedar first, then Cedar's denials)."""

    allowed: list[Row]
    refused: list[tuple[str, str]]


def decide(gov: Governed, ex: Exchange, collection: str, ids: Sequence[str], *, by_ids: bool,
           limit: int | None = None) -> Decided:
    """Decide Cedar ``delete`` on the candidates `ids` (unique) of `collection`, then settle the request's row counts
    and outcome (``decision``, ``deny_action``, ``reason``). Synchronous, with ledger reads: run it with
    `sidecar.ledger.offloop.call`. `by_ids`: the caller named the rows (all-or-nothing). `limit`: at most that many
    of the allowed rows are deleted (the first ones). Raises `Forbidden` (403) when `by_ids` and a denied row is one
    the caller may read; then nothing is deleted."""
    known = gov.ledger.get_rows(gov.name, collection, list(ids))
    live = [known[i] for i in ids if i in known and known[i].status in LIVE]
    refused = [(i, UNKNOWN_ROW if i not in known else DELETED_ROW) for i in ids
               if i not in known or known[i].status not in LIVE]
    decisions = gov.authz.decide_rows(ex, "delete", live)
    denied = [(r.row_id, d.reason) for r, d in zip(live, decisions) if not d.allowed]
    refused += denied
    allowed = [r for r, d in zip(live, decisions) if d.allowed]
    if by_ids and denied:
        shown = gov.authz.readable(ex, gov.name, collection, [i for i, _ in denied], include_superseded=True,
                                   count=False)
        ex.reason = denied[-1][1]  # the delete's denial, not the read check's
        if shown:
            ex.decision, ex.deny_action = "deny", "delete"
            settle_rows(ex, [r.row_id for r in allowed], refused)
            raise Forbidden(f"delete is not permitted for {len(shown)} of {len(ids)} rows")
    if limit is not None:
        allowed = allowed[:limit]
    settle_rows(ex, [r.row_id for r in allowed], refused)
    ex.decision = "allow" if allowed or not ids else "deny"
    if not allowed and refused:  # a delete that deletes nothing it named or matched: refused, logged with the ids
        ex.deny_action = "delete" if any(r not in BEFORE_CEDAR for _, r in refused) else None
        ex.reason = refused[-1][1]
    return Decided(allowed, refused)


async def delete_rows(gov: Governed, ex: Exchange, collection: str, rows: list[Row], client: Deleter) -> int:
    """Tombstone `rows` of `collection` (each allowed Cedar ``delete``) with their deletion closure
    (``DELETION_CLOSURE``), durably, then delete them and their closure from the backend (`backend_delete`).
    Returns ``len(rows)``. A backend failure raises after the tombstones are written (the rows are not served; the
    reconciler finishes the backend delete)."""
    if not rows:
        return 0
    closed = await offloop.call(gov.ledger, gov.prov.tombstone, ex, collection, rows, gov.settings.deletion_closure)
    if "after-tombstone" in gov.settings.failpoints:
        crash()
    await backend_delete(gov, client, closed)
    return len(rows)


async def backend_delete(gov: Governed, client: Deleter, keys: Sequence[tuple[str, str]]) -> int:
    """Delete tombstoned rows (`keys`: (collection, row id)) from the backend, grouped by collection in first-seen
    order, one call per group (``batch_delete``) or per id; each id deleted is confirmed in the ledger
    (`Ledger.mark_backend_deleted`), also when a later call fails (which then raises). Keys of a collection the
    client does not hold (`Deleter.holds`) are left pending. Returns the number of ids confirmed."""
    by_collection: dict[str, list[str]] = {}
    for collection, row_id in keys:
        if client.holds(collection):
            by_collection.setdefault(collection, []).append(row_id)
    confirmed = 0
    for collection, row_ids in by_collection.items():
        batches = [row_ids] if client.capabilities.batch_delete else [[i] for i in row_ids]
        done: list[str] = []
        try:
            for batch in batches:
                await client.delete(collection, batch)
                done += batch
        finally:
            if done:
                await offloop.call(gov.ledger, gov.ledger.mark_backend_deleted, gov.name, collection, done)
        confirmed += len(done)
    return confirmed


async def retry_pending(gov: Governed, client: Deleter) -> int:
    """The reconciler's first step: the backend deletes of tombstones not yet confirmed (deletion closures
    included; `backend_delete`). Returns the number of ids confirmed."""
    return await backend_delete(gov, client, await offloop.call(gov.ledger, gov.ledger.pending_tombstones, gov.name))


@dataclass(slots=True)
class Cursor:
    """Where `recheck` goes on: the last (collection, row id) key it read (``("", "")``: from the first)."""

    after: tuple[str, str] = ("", "")


async def recheck(gov: Governed, client: Reconciled, cursor: Cursor, budget: int | None = None) -> int:
    """The reconciler's second step: tombstones whose backend delete was confirmed, in key order after `cursor`, whose
    rows the backend holds again (written around the sidecar, a lost delete, a restore: `Reconciled.present`) are
    logged as an alert and deleted again (`backend_delete`). They are never served either way (the ledger says
    deleted). At most `budget` tombstones are checked (None: all); `cursor` is moved past each batch read, and back
    to the first once every tombstone was checked. Returns the number of backend deletes confirmed."""
    done = checked = 0
    while budget is None or checked < budget:
        limit = 500 if budget is None else min(500, budget - checked)
        batch = await offloop.call(gov.ledger, gov.ledger.backend_deleted_tombstones, gov.name, cursor.after,
                                   limit=limit)
        if not batch:
            cursor.after = ("", "")  # the next run starts again from the first tombstone
            return done
        cursor.after = batch[-1]
        checked += len(batch)
        by_collection: dict[str, list[str]] = {}
        for collection, row_id in batch:
            if client.holds(collection):
                by_collection.setdefault(collection, []).append(row_id)
        for collection, row_ids in by_collection.items():
            back = await client.present(collection, row_ids)
            if back:
                structlog.get_logger("memwarden.reconciler").warning(
                    "tombstoned_rows_reappeared", backend=gov.name, collection=collection, row_ids=back[:20],
                    count=len(back))
                done += await backend_delete(gov, client, [(collection, i) for i in back])
    return done


async def reset(gov: Governed, ex: Exchange, deployment: str, collection: str | None,
                forward: Callable[[], Awaitable[T]]) -> T:
    """A backend's own reset (it wipes every tenant): Cedar ``reset`` on ``Deployment::"<deployment>"`` (operators
    only by the default policies), then ``await forward()`` (the backend's reset); only once it succeeded is every
    governed row of `collection` (None: of the whole backend) tombstoned with its backend delete confirmed
    (`Ledger.reset`, `Ledger.reset_done`), counted in ``rows_allowed``. When the backend refuses or fails, its error
    is raised and the ledger is unchanged. Returns what `forward` returned."""
    gov.authz.require_deployment(ex, "reset", deployment)
    result = await forward()
    assert ex.principal is not None
    by = ex.principal.uid[1]

    def wipe() -> int:
        n = gov.ledger.reset(gov.name, collection, by, ex.request_id)
        gov.ledger.reset_done(gov.name, collection)
        return n
    ex.rows_allowed = await offloop.call(gov.ledger, wipe)
    return result
