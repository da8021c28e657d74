"""Earlier code of `sidecar.ledger.sqlite`, kept as test references."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterator

from sidecar.governance import Row

# `SQLiteLedger.get_rows` as of fe121ba: one ``IN`` statement per 500 distinct ids, 25 columns read by sqlite3 per row.
_ROW_COLUMNS = (
    "backend, collection_id, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, "
    "created_at, updated_at, request_id, subject, predicate, object, extra, source, single_valued, "
    "supersedes_collection, supersedes_id, superseded_by_collection, superseded_by, superseded_at, content_hmac, "
    "fact_partition"
)
_READ_ROW_COLUMNS = ", ".join(c for c in (c.strip() for c in _ROW_COLUMNS.split(",")) if c not in ("updated_at", "fact_partition"))
_EMPTY_LIST, _EMPTY_OBJECT = "[]", "{}"


def _names(text: str) -> tuple[str, ...]:
    return () if text == _EMPTY_LIST else tuple(json.loads(text))


def _row_from_read(t: tuple[Any, ...]) -> Row:
    (backend, collection, row_id, tenant, fleet, owner, scope, readers, labels, status, writer, created_at,
     request_id, subject, predicate, obj, extra, source, single_valued, supersedes_collection, supersedes_id,
     superseded_by_collection, superseded_by, superseded_at, content_hmac) = t
    return Row(
        backend, collection, row_id, tenant, fleet, owner, scope, writer, created_at, status,
        _names(readers), _names(labels), request_id, subject, predicate, obj,
        {} if extra == _EMPTY_OBJECT else json.loads(extra), source, (), bool(single_valued),
        None if supersedes_id is None else (str(supersedes_collection), str(supersedes_id)),
        None if superseded_by is None else (str(superseded_by_collection), str(superseded_by)),
        superseded_at, content_hmac,
    )


def _chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def get_rows(db: sqlite3.Connection, backend: Any, collection_id: Any, row_ids: list[Any]) -> dict[str, Row]:
    """`SQLiteLedger.get_rows` as of fe121ba, on connection `db`."""
    out: dict[str, Row] = {}
    cur = db.cursor()
    cur.row_factory = None
    for chunk in _chunks(list(dict.fromkeys(row_ids))):
        sql = (f"SELECT {_READ_ROW_COLUMNS} FROM rows WHERE backend = ? AND collection_id = ? "
               f"AND row_id IN ({','.join('?' * len(chunk))})")
        for t in cur.execute(sql, (backend, collection_id, *chunk)):
            out[t[2]] = _row_from_read(t)
    return out
