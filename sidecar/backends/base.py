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


class Profile(Protocol):
    name: str
    prov: Provenance  # the provenance rules (docs/design.md §4) bound to this backend

    def match(self, method: str, segments: list[str]) -> Route | None: ...

    async def handle(self, ex: Exchange, route: Route) -> tuple[int, Any]: ...

    async def reconcile(self) -> int: ...

    def lineage_collection(self, ex: Exchange) -> str:
        """The ledger collection a lineage request names (request-level ``list`` decision); 404 otherwise."""
        ...
