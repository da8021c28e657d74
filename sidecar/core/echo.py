"""Governed keys a client sends back on an update: the one rule for every backend.

Clients that round-trip a row's whole metadata (mem0's own Chroma store does, read → modify → update) send back the
governed keys a read showed them. On an update of an existing row those may come back **unchanged**; any other value
of a governed key the caller cannot request is 400, and so is any of them on a new row. Requestable keys
(``mw_scope``, ``mw_fleet``, ``mw_readers`` and ``mw_labels`` in their request form, …) are requests as always, and a
write-once key (``mw_derived_from``, the triple) equal to the row's is no change.

The check is made in two steps, because a request's metadata is split (`sidecar.provenance.split_metadata`) before
the row it names is known to be readable, and a refusal must not tell an unreadable row from a missing one:
`set_aside` takes the shown-only keys out first; `without_echo` compares them with what the caller is shown for the
row once it may read it (its `view`: the governed metadata a read of it shows, decorations included).
"""

from __future__ import annotations

from typing import Any, Callable

from sidecar.errors import BadRequest

# Governed keys no client requests, which a read shows (stamped or decorated).
SHOWN_ONLY = ("mw_tenant", "mw_owner", "mw_writer", "mw_created_at", "mw_source", "mw_supersedes_id", "mw_superseded_by")
READER_FLAG = "mw_r:"  # one stamped flag per reader of a restricted row (a backend whose filters test membership so)
GOVERNED_KEY = "metadata key {!r} is governed by memwarden and cannot be set"


def _shown_form(key: str, value: Any) -> bool:
    """Whether `value` of ``mw_readers``/``mw_labels`` is the form a read shows and no request uses: a list, or a
    readers string of agent uids ``t/f/a`` (requests name ``f/a``)."""
    if key not in ("mw_readers", "mw_labels"):
        return False
    if isinstance(value, list):
        return True
    return key == "mw_readers" and isinstance(value, str) and bool(value) and all(
        x.count("/") == 2 for x in value.split(","))


def set_aside(meta: Any) -> tuple[Any, dict[str, Any]]:
    """(`meta` without the governed keys only a read shows, those keys): `SHOWN_ONLY`, reader flags, and
    ``mw_readers``/``mw_labels`` in their shown form. `meta` that is not an object comes back as it is."""
    if not isinstance(meta, dict):
        return meta, {}
    kept: dict[str, Any] = {}
    claimed: dict[str, Any] = {}
    for key, value in meta.items():
        if key in SHOWN_ONLY or (isinstance(key, str) and key.startswith(READER_FLAG)) or _shown_form(key, value):
            claimed[key] = value
        else:
            kept[key] = value
    return kept, claimed


def refuse_claims(pre: list[tuple[Any, dict[str, Any]]]) -> None:
    """400 if any `set_aside` result set a governed key aside: on a new row none may be sent."""
    for _, claimed in pre:
        if claimed:
            raise BadRequest(GOVERNED_KEY.format(sorted(claimed)[0]))


def without_echo(claimed: dict[str, Any], requested: dict[str, Any], view: dict[str, Any]) -> dict[str, Any]:
    """`requested` (parsed by `split_metadata`) without the write-once keys equal to the row's, once every key in
    `claimed` was checked equal (same type and value) to what the caller is shown (`view`). Raises `BadRequest`
    (400) for a claimed key shown with another value, or not shown at all."""
    for key, value in claimed.items():
        if key not in view or view[key] != value or type(view[key]) is not type(value):
            raise BadRequest(GOVERNED_KEY.format(key))
    out = dict(requested)
    if _same(out, view, "mw_derived_from", lambda v: tuple(str(v).split(","))):
        del out["mw_derived_from"]
    for key in ("mw_subject", "mw_predicate", "mw_object"):
        if _same(out, view, key, lambda v: v):
            del out[key]
    return out


def _same(requested: dict[str, Any], view: dict[str, Any], key: str, shown: Callable[[Any], Any]) -> bool:
    return key in requested and key in view and requested[key] == shown(view[key])
