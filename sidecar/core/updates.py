"""One update of a row at a time (docs/design.md §2.6; issue 34, finding 11).

An update reads a row's ledger governance, decides on it, writes the backend, then writes the row's new governance and
content HMAC to the ledger (`Ledger.update_governance`). Two updates of one row in flight together would each write
a governance computed from the row as it was before the other: a re-scope without new content racing a content update
would put back the old scope, or the old content HMAC. So an update of existing rows holds their update markers
(`Ledger.begin_update`) from before its decisions are final to its ledger write:

- `begin` takes the markers of the rows an update read and decided on, then reads them again: another update holding
  one, or one that changed them since they were read (it finished in between), is 409 and this update changes
  nothing (the client retries and is decided on the row as it is then);
- `write_governance` writes the new governance and releases the markers in one ledger transaction, only while this
  update still holds them (an update that outlived ``UPDATE_LEASE_S`` is 409 and writes no governance: its rows keep
  the ledger governance they had, and content stamped otherwise is withheld, `sidecar.governance.stamped_as`);
- `end` releases them when the update fails or changes no governance.

A marker left by an update whose process died is taken over after ``UPDATE_LEASE_S`` seconds.
"""

from __future__ import annotations

from typing import Any, Mapping

from sidecar.config import Settings
from sidecar.errors import Conflict
from sidecar.exchange import Exchange
from sidecar.governance import Row
from sidecar.ledger import offloop
from sidecar.ledger.base import UpdateLost

IN_PROGRESS = "another update of this row is in progress; retry when it has finished"
CHANGED = "the row was changed by another update while this one was decided; retry"
LEASE_LOST = ("this update took longer than UPDATE_LEASE_S and another update took the row over; "
              "its governance was not recorded — write the row again")


def governed(row: Row) -> tuple[Any, ...]:
    """What an update of `row` reads and writes in the ledger: status, scope, fleet, readers, labels, content HMAC."""
    return row.status, row.scope, row.fleet, row.readers, row.labels, row.content_hmac


async def begin(ledger: Any, settings: Settings, ex: Exchange, backend: str, collection_id: str,
                seen: Mapping[str, Row]) -> None:
    """Take the update markers of the rows `seen` (row id → the ledger row this update read and decided on) for this
    request. Raises `Conflict` (409, reason ``update_in_progress``) holding none when another update holds one of them,
    or when one of them is no longer as `seen` (another update finished since it was read)."""
    ids = list(seen)
    busy = await offloop.call(ledger, ledger.begin_update, backend, collection_id, ids, ex.request_id,
                              settings.update_lease_s)
    if busy:
        ex.decision, ex.row_ids = "deny", list(busy)
        raise Conflict(IN_PROGRESS, reason="update_in_progress", decision="deny")
    try:
        now = await offloop.call(ledger, ledger.get_rows, backend, collection_id, ids)
    except BaseException:
        await end(ledger, ex, backend, collection_id, ids)
        raise
    changed = [i for i in ids if i not in now or governed(now[i]) != governed(seen[i])]
    if changed:
        await end(ledger, ex, backend, collection_id, ids)
        ex.decision, ex.row_ids = "deny", changed
        raise Conflict(CHANGED, reason="update_in_progress", decision="deny")


async def end(ledger: Any, ex: Exchange, backend: str, collection_id: str, ids: list[str]) -> None:
    """Release this request's update markers of `ids` (the update failed, or changes no governance)."""
    await offloop.call(ledger, ledger.end_update, backend, collection_id, ids, ex.request_id)


async def write_governance(ledger: Any, ex: Exchange, rows: list[Row],
                           history: Mapping[str, str | None] | None = None) -> None:
    """`Ledger.update_governance` of `rows` as this request's update (it holds their markers; they are released).
    Raises `Conflict` (409, reason ``update_lease_expired``) when another update took a row over (this one outlived
    its lease): nothing is written."""
    try:
        await offloop.call(ledger, ledger.update_governance, rows, holder=ex.request_id, history=history)
    except UpdateLost as exc:
        ex.row_ids = list(exc.row_ids)
        raise Conflict(LEASE_LOST, reason="update_lease_expired", decision="deny") from None
