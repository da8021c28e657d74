"""The profile protocol: route matching plus per-operation rewrite/forward/filter handlers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sidecar.exchange import Exchange
from sidecar.provenance import Provenance


@dataclass(frozen=True, slots=True)
class Route:
    """A matched route: the operation name and the path parameters (decoded)."""

    op: str
    params: dict[str, str] = field(default_factory=dict)


def match_routes(table: list[tuple[str, tuple[str, ...], str]], method: str, segments: list[str]) -> Route | None:
    """First entry of `table` whose method and pattern match. Pattern items ``"{name}"`` bind one
    non-empty segment; everything else must equal the segment exactly (case-sensitive)."""
    for m, pattern, op in table:
        if m != method or len(pattern) != len(segments):
            continue
        params: dict[str, str] = {}
        for p, s in zip(pattern, segments):
            if p.startswith("{"):
                if not s:
                    break
                params[p[1:-1]] = s
            elif p != s:
                break
        else:
            return Route(op, params)
    return None


class RouteTable:
    """`table` (as `match_routes` takes it) indexed by (method, number of segments) once: `match` gives
    what ``match_routes(table, method, segments)`` gives, trying only the entries of that method and
    length, in table order. The table is read at construction (build it after the table is final)."""

    __slots__ = ("_by_shape",)

    def __init__(self, table: list[tuple[str, tuple[str, ...], str]]) -> None:
        self._by_shape: dict[tuple[str, int], list[tuple[tuple[tuple[bool, str], ...], str]]] = {}
        for m, pattern, op in table:
            items = tuple((True, p[1:-1]) if p.startswith("{") else (False, p) for p in pattern)
            self._by_shape.setdefault((m, len(pattern)), []).append((items, op))

    def match(self, method: str, segments: list[str]) -> Route | None:
        """The first entry whose method and pattern match `segments` (see `match_routes`), or None."""
        candidates = self._by_shape.get((method, len(segments)))
        if candidates is None:
            return None
        for items, op in candidates:
            params: dict[str, str] = {}
            for (is_param, text), s in zip(items, segments):
                if is_param:
                    if not s:
                        break
                    params[text] = s
                elif text != s:
                    break
            else:
                return Route(op, params)
        return None


class Profile(Protocol):
    name: str
    prov: Provenance  # the provenance rules (docs/design.md §4) bound to this backend

    def match(self, method: str, segments: list[str]) -> Route | None: ...

    async def handle(self, ex: Exchange, route: Route) -> tuple[int, Any]: ...

    async def reconcile(self) -> int: ...

    def lineage_collection(self, ex: Exchange) -> str:
        """The ledger collection a lineage request names (request-level ``list`` decision); 404 otherwise."""
        ...
