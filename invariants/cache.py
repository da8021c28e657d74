"""Verdicts of policy-check kept across runs, by content hash (``policy-check --cache-dir DIR``).

A verdict is one invariant in one request environment (action, principal type, resource type). Its key is a
SHA-256 over everything the verdict can depend on:

* the tool: the bytes of every ``invariants/*.py`` module and baseline file of this installation
  (`tool_digest`), so any change to the translator or the checks invalidates every entry;
* the schema text;
* the invariant: its id, kind, attribute and text;
* the environment: action, principal type, resource type;
* the policies whose head can match the environment (`head_matches`: action scope, ``is``/``==`` principal
  and resource types; any other scope is kept), each with its display id and text, in order. A policy whose
  head excludes the environment is never satisfied in it, so it cannot change the verdict — and changing it
  does not invalidate the entry: a one-policy change re-checks only the environments its head matches.

Only PROVED, VIOLATED (its counterexample was replayed through Cedar when it was found) and "does not apply"
are stored; UNKNOWN and DISAGREE are always recomputed. Entries are JSON files ``DIR/ab/<key>.json``, written
atomically (a temporary file renamed), so concurrent runs sharing a directory never read a partial entry; an
unreadable or malformed entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from cedarpy import pst

from .engine import Policy
from .schema import Schema

__all__ = ["VerdictCache", "tool_digest", "Head", "head_matches", "NOT_APPLICABLE"]

NOT_APPLICABLE = "N/A"  # the invariant's scope excludes the environment
STORED = ("PROVED", "VIOLATED", NOT_APPLICABLE)
_FORMAT = "policy-check-verdict-1"


@lru_cache(maxsize=1)
def tool_digest() -> str:
    """SHA-256 (hex) of this installation's ``invariants`` modules and baseline invariant files."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256(_FORMAT.encode())
    for p in sorted([*root.glob("*.py"), *(root / "baseline").glob("*.cedar")]):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _type_of(sc: Any) -> str | None:
    """The entity type a principal/resource scope restricts to, or None when it admits any type (``any``,
    ``in`` an entity — some descendant type —, a template slot)."""
    if isinstance(sc, (pst.ScopeIs, pst.ScopeIsIn)):
        return str(sc.entity_type)
    if isinstance(sc, pst.ScopeEq) and isinstance(sc.entity, pst.EntityUid):
        return str(sc.entity.type)
    return None


class Head:
    """What a policy's head admits: the schema actions (None: keep for every action) and the principal and
    resource types (None: any)."""

    __slots__ = ("actions", "ptype", "rtype")

    def __init__(self, schema: Schema, pol: Policy) -> None:
        from .catalog import actions_of

        a = pol.ast
        try:
            self.actions: frozenset[str] | None = frozenset(actions_of(schema, a.action))
        except AttributeError:  # an action scope of another shape: keep
            self.actions = None
        self.ptype, self.rtype = _type_of(a.principal), _type_of(a.resource)

    def matches(self, action: str, ptype: str, rtype: str) -> bool:
        return (self.actions is None or action in self.actions) and self.ptype in (None, ptype) and \
            self.rtype in (None, rtype)


def head_matches(schema: Schema, pol: Policy, action: str, ptype: str, rtype: str) -> bool:
    """Whether ``pol``'s head may admit a request of this environment (a sound over-approximation: False only
    when the action scope excludes ``action`` or an ``is``/``==`` principal or resource scope names another
    type). A policy whose head excludes a request is not satisfied by it and raises no error on it."""
    return Head(schema, pol).matches(action, ptype, rtype)


class VerdictCache:
    """Stored verdicts under ``root`` (created on first write). Keys come from `key`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def env_digest(self, schema: Schema, schema_text: str | None, policies: list[Policy], action: str,
                   ptype: str, rtype: str) -> str:
        """The part of every key of one environment that does not depend on the invariant; ``policies`` are the
        environment's slice (those whose head matches it, in order)."""
        h = hashlib.sha256()
        for part in (tool_digest(), schema_text or "", action, ptype, rtype):
            h.update(part.encode() + b"\0")
        for p in policies:
            h.update(b"P\0" + p.id.encode() + b"\0" + p.text.encode() + b"\0")
        return h.hexdigest()

    @staticmethod
    def key(env: str, inv_id: str, kind: str, attribute: str | None, inv_text: str) -> str:
        h = hashlib.sha256(env.encode())
        for part in (inv_id, kind, attribute or "", inv_text):
            h.update(b"\0" + part.encode())
        return h.hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored entry ({"status", "seconds", "message", "counterexample"}), or None (a miss)."""
        try:
            doc = json.loads(self._path(key).read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or doc.get("status") not in STORED:
                raise ValueError("malformed entry")
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return doc

    def put(self, key: str, status: str, seconds: float = 0.0, message: str = "",
            counterexample: dict[str, Any] | None = None) -> None:
        """Store a verdict (only those in `STORED`; others are ignored). Write errors are ignored: the cache
        only saves time."""
        if status not in STORED:
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"status": status, "seconds": seconds, "message": message,
                           "counterexample": counterexample}, f)
            os.replace(tmp, path)
        except OSError:
            pass
