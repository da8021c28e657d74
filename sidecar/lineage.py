"""``GET /_memwarden/memories/{id}/lineage`` — the provenance chain of one memory (docs/design.md §4).

Served by the pipeline after canonicalisation and authentication, like every backend route, for
every backend profile. Query parameters:

- ``collection`` — the Chroma collection UUID the memory lives in (required on Chroma; Mem0 has one
  deployment collection and ignores it unless it names another one, which is 404);
- ``include_superseded`` — ``true`` to allow a superseded memory as the starting point (as on get);
- ``max_nodes`` — 1–1000 (default 1000); the walk stops there and ``truncated`` is true.

Answer 200::

    {"memory": "<id>", "truncated": false,
     "nodes": [{"node": 0, "depth": 0, "id": "<id>", "collection": "<collection>", "status": "active",
                "writer": "t/f/a", "owner": "t/f/a", "scope": "fleet",
                "created_at": "2026-12-01T02:03:04.123456Z", "created_at_us": 1796090584123456,
                "source": "chroma:add:<request id>", "parents": [1]},
               {"node": 1, "depth": 1, "redacted": true, "parents": []}]}

Nodes are in breadth-first order from the memory (depth 0) towards its roots — within a depth,
readable nodes by id, then placeholders in an order unrelated to their ids; ``parents`` are node numbers. An ancestor the caller may not ``read`` — another scope, another tenant, or a deleted row
(``DELETION_CLOSURE=redact`` keeps derived rows) — is a placeholder with no id, writer, time or
content, identical in all those cases. Superseded ancestors are shown (lineage is history) when
readable. The starting memory must be servable and readable: a missing, foreign, deleted or (without
``include_superseded``) superseded id answers 404 ``memory not found``, the same in every case.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any

from sidecar.backends.base import Profile
from sidecar.errors import BadRequest, NotFound
from sidecar.exchange import Exchange
from sidecar.governance import Row
from sidecar.ledger import Ledger
from sidecar.stages.authorize import Authorizer

MAX_NODES = 1000
NOT_FOUND = "memory not found"


def _flag(ex: Exchange, name: str) -> bool:
    value = ex.query.get(name, "false")
    if value not in ("true", "false"):
        raise BadRequest(f"{name} must be true or false")
    return value == "true"


def _max_nodes(ex: Exchange) -> int:
    raw = ex.query.get("max_nodes")
    if raw is None:
        return MAX_NODES
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_NODES:
        raise BadRequest(f"max_nodes must be an integer from 1 to {MAX_NODES}")
    return int(raw)


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lineage(ex: Exchange, profile: Profile, ledger: Ledger, authz: Authorizer, memory_id: str) -> dict[str, Any]:
    """The lineage answer for `memory_id` (shape in the module docstring).

    Raises `NotFound` (unreadable start), `BadRequest` (bad query parameter) or whatever the
    profile's `lineage_collection` raises (404 for a collection that is not the caller's).
    """
    ex.operation = "lineage"
    unknown = set(ex.query) - {"collection", "include_superseded", "max_nodes"}
    if unknown:
        raise BadRequest(f"unknown query parameter {sorted(unknown)[0]!r}")
    include_superseded = _flag(ex, "include_superseded")
    limit = _max_nodes(ex)
    collection_id = profile.lineage_collection(ex)
    backend = profile.name
    ex.action, ex.resource = "read", f"Memory::{backend}:{collection_id}:{memory_id}"
    if memory_id not in authz.readable(ex, backend, collection_id, [memory_id], include_superseded):
        ex.decision = "deny"
        raise NotFound(NOT_FOUND)
    walk = ledger.lineage(backend, collection_id, memory_id, max_nodes=limit + 1)
    truncated = len(walk) > limit
    walk = walk[:limit]
    # One batched read decision per collection over every ancestor the ledger knows (superseded
    # rows included; deleted and pending rows are never servable and so never readable).
    by_collection: dict[str, list[str]] = {}
    for _, row, key, _ in walk[1:]:
        if row is not None:
            by_collection.setdefault(key[0], []).append(key[1])
    readable: dict[tuple[str, str], Row] = {}
    for coll, ids in by_collection.items():
        for rid, row in authz.readable_rows(ex, backend, coll, ids, include_superseded=True).items():
            readable[(coll, rid)] = row
    start = walk[0][1]
    assert start is not None  # readable above, so the ledger knows it
    readable[walk[0][2]] = start
    # Order within a depth: readable nodes by (collection, id), then placeholders by a keyed hash, so
    # the position of a placeholder says nothing about how its hidden id sorts.
    secret = profile.prov.content_key  # read once at start-up

    def rank(item: tuple[int, Row | None, tuple[str, str], list[tuple[str, str]]]) -> tuple[int, int, str]:
        depth, _, key, _ = item
        if key in readable:
            return depth, 0, "\x00".join(key)
        return depth, 1, hmac.new(secret, "\x00".join(key).encode(), hashlib.sha256).hexdigest()

    walk = sorted(walk, key=rank)
    number = {key: i for i, (_, _, key, _) in enumerate(walk)}
    nodes: list[dict[str, Any]] = []
    for i, (depth, _, key, parents) in enumerate(walk):
        links = sorted(number[p] for p in parents if p in number)
        row = readable.get(key)
        if row is None:
            nodes.append({"node": i, "depth": depth, "redacted": True, "parents": links})
            continue
        nodes.append({
            "node": i, "depth": depth, "id": row.row_id, "collection": row.collection, "status": row.status,
            "writer": row.writer, "owner": row.owner, "scope": row.scope,
            "created_at": _iso(row.created_at), "created_at_us": row.created_at, "source": row.source,
            "parents": links,
        })
    ex.row_ids = [n["id"] for n in nodes if "id" in n]
    ex.decision = "allow"
    return {"memory": memory_id, "truncated": truncated, "nodes": nodes}
