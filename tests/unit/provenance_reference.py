"""Earlier code of `sidecar.provenance`, kept as test references."""

from __future__ import annotations

from typing import Any


def links(self: Any, ex: Any, collection: str, row_ids: list[str]) -> dict[str, dict[str, str]]:
    """`Provenance.links` as of 77354c9 (every row's links built, also when no target is readable)."""
    if not row_ids:
        return {}
    seen = ex.ledger_rows
    if all((self.backend, collection, i) in seen for i in row_ids):  # read for this request's decision
        rows = {i: seen[(self.backend, collection, i)] for i in row_ids}
    else:
        rows = self.ledger.get_rows(self.backend, collection, row_ids)
    targets = [pair[1] for lr in rows.values() for pair in (lr.supersedes, lr.superseded_by)
               if pair is not None and pair[0] == collection]
    visible = (self.authz.readable(ex, self.backend, collection, targets, include_superseded=True, count=False)
               if targets else set())
    out: dict[str, dict[str, str]] = {}
    for row_id, lr in rows.items():
        meta = {key: pair[1] for key, pair in (("mw_supersedes_id", lr.supersedes), ("mw_superseded_by", lr.superseded_by))
                if pair is not None and pair[0] == collection and pair[1] in visible}
        if meta:
            out[row_id] = meta
    return out
