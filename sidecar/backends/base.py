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
    """A route table (as `match_routes` takes it) with its matcher: ``RouteTable(table).match(method,
    segments)`` is ``match_routes(table, method, segments)``."""

    __slots__ = ("table",)

    def __init__(self, table: list[tuple[str, tuple[str, ...], str]]) -> None:
        self.table = table

    def match(self, method: str, segments: list[str]) -> Route | None:
        """The first entry whose method and pattern match `segments` (see `match_routes`), or None."""
        return match_routes(self.table, method, segments)


class Profile(Protocol):
    name: str
    prov: Provenance  # the provenance rules (docs/design.md §4) bound to this backend

    def match(self, method: str, segments: list[str]) -> Route | None: ...

    async def handle(self, ex: Exchange, route: Route) -> tuple[int, Any]: ...

    async def reconcile(self) -> int: ...

    def lineage_collection(self, ex: Exchange) -> str:
        """The ledger collection a lineage request names (request-level ``list`` decision); 404 otherwise."""
        ...


# An operation's Cedar action (the decision log's ``action``): one name per operation, whatever its outcome; a
# pair when an operator key's request is decided on the deployment instead (tenant action, operator action).
OperationActions = dict[str, "str | tuple[str, str]"]


def operation_action(table: OperationActions, op: str, kind: str | None) -> str | None:
    """The Cedar action of operation `op` (`OperationActions` `table`) for a principal of `kind`; None when
    `table` names none (then the request's first request-level decision names it)."""
    action = table.get(op)
    if type(action) is tuple:
        return action[1] if kind == "operator" else action[0]
    return action  # type: ignore[return-value]


def crash() -> None:
    """Failpoint (testing only, ``MEMWARDEN_FAILPOINTS``): die like ``kill -9``."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
