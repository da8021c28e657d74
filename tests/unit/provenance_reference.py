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


def links_de70fd8(self: Any, ex: Any, collection: str, row_ids: list[str]) -> dict[str, dict[str, str]]:
    """`Provenance.links` as of de70fd8 (the request's ledger rows looked up twice per id, targets by generator)."""
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
    if not visible:  # no readable target: no row shows a link
        return out
    for row_id, lr in rows.items():
        meta = {key: pair[1] for key, pair in (("mw_supersedes_id", lr.supersedes), ("mw_superseded_by", lr.superseded_by))
                if pair is not None and pair[0] == collection and pair[1] in visible}
        if meta:
            out[row_id] = meta
    return out


def decorate_de70fd8(self: Any, ex: Any, collection: str, rows: list[dict[str, Any]], *, id_key: str, meta_key: str,
                     links: Any = links_de70fd8) -> None:
    """`Provenance.decorate` as of de70fd8."""
    with_meta = [r for r in rows if isinstance(r.get(meta_key), dict)]
    found = links(self, ex, collection, [r[id_key] for r in with_meta])
    for r in with_meta:
        if r[id_key] in found:
            r[meta_key] = {**r[meta_key], **found[r[id_key]]}
    parents = {r[id_key]: [x for x in str(r[meta_key]["mw_derived_from"]).split(",") if x]
               for r in with_meta if "mw_derived_from" in r[meta_key]}
    if parents:
        wanted = sorted({x for xs in parents.values() for x in xs})
        visible = self.authz.readable(ex, self.backend, collection, wanted, include_superseded=True, count=False)
        for r in with_meta:
            if r[id_key] in parents:
                meta = dict(r[meta_key])
                shown = [x for x in parents[r[id_key]] if x in visible]
                if shown:
                    meta["mw_derived_from"] = ",".join(shown)
                else:
                    del meta["mw_derived_from"]
                r[meta_key] = meta
