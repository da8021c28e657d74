"""The size of one row of a write, bounded by ``MAX_ROW_BYTES`` (docs/design.md, "Row size").

A row's size is what the backend stores for it and sends back in every answer that carries it: its text (a Chroma
document or uri, a Mem0 message's content or update text) as UTF-8 bytes plus its client metadata as compact JSON
(UTF-8). Embeddings are not counted (their size is fixed by the collection's dimension), nor are the governed keys the
sidecar stamps (bounded: a few ids and names). A row over the limit makes the whole write 413 before anything is
decided, written or forwarded, so the rows a backend holds stay small enough that a read of rows the caller may read
fits in one backend answer (``BACKEND_MAX_RESPONSE_BYTES``, which the setting must stay below: `sidecar.config`).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from sidecar.errors import PayloadTooLarge


def value_bytes(value: Any) -> int:
    """Bytes `value` takes in a row: a string's UTF-8 encoding (``surrogatepass``: a lone surrogate was refused by
    the body parser already), anything else its compact JSON; ``None`` is 0."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


def row_bytes(*parts: Any) -> int:
    """The size of a row made of `parts` (text, uri, metadata, …): the sum of their `value_bytes`."""
    return sum(value_bytes(p) for p in parts)


def check_row_size(label: str, size: int, limit: int) -> None:
    """Raise `PayloadTooLarge` (413) naming the row (`label`, e.g. ``row 'a1'``, ``message 2``), its size and the
    limit when `size` is over `limit` bytes."""
    if size > limit:
        raise PayloadTooLarge(f"{label} is {size} bytes, over the limit of {limit} bytes per row "
                              "(MEMWARDEN_MAX_ROW_BYTES); nothing was written", reason="row_too_large")
