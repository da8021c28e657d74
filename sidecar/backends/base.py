"""The profile protocol: route matching plus per-operation rewrite/forward/filter handlers."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Protocol

from sidecar.core.failpoints import crash as crash  # re-exported: the profiles' failpoints
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
    """`table` (as `match_routes` takes it) indexed once: `match` gives what ``match_routes(table, method,
    segments)`` gives. Per (method, number of segments), the entries are grouped by the positions of their
    literal items; in a group, one dict look-up of the segments at those positions finds the first entry
    (in table order) whose literals they are, and the match is the first-in-table-order entry of all groups
    whose parameter segments are non-empty. The table is read at construction (build it after the table is
    final)."""

    __slots__ = ("_by_shape",)

    def __init__(self, table: list[tuple[str, tuple[str, ...], str]]) -> None:
        # (method, length) -> groups: (literals getter, {literal values: (table index, op, parameters)}),
        # parameters as ((position, name), ...); the getter is None when an entry has no literal item.
        self._by_shape: dict[tuple[str, int], list[tuple[Any, dict[Any, tuple[int, str, tuple[tuple[int, str], ...]]]]]] = {}
        groups: dict[tuple[str, int, tuple[int, ...]], tuple[Any, dict[Any, Any]]] = {}
        for index, (m, pattern, op) in enumerate(table):
            literal = tuple(i for i, p in enumerate(pattern) if not p.startswith("{"))
            params = tuple((i, p[1:-1]) for i, p in enumerate(pattern) if p.startswith("{"))
            shape = (m, len(pattern), literal)
            if shape not in groups:
                groups[shape] = (operator.itemgetter(*literal) if literal else None, {})
                self._by_shape.setdefault((m, len(pattern)), []).append(groups[shape])
            getter, entries = groups[shape]
            entries.setdefault(getter(pattern) if getter is not None else None, (index, op, params))

    def match(self, method: str, segments: list[str]) -> Route | None:
        """The first entry whose method and pattern match `segments` (see `match_routes`), or None."""
        groups = self._by_shape.get((method, len(segments)))
        if groups is None:
            return None
        best: tuple[int, str, tuple[tuple[int, str], ...]] | None = None
        try:
            for getter, entries in groups:
                hit = entries.get(getter(segments) if getter is not None else None)
                if hit is not None and (best is None or hit[0] < best[0]) and all(segments[i] for i, _ in hit[2]):
                    best = hit
        except TypeError:  # a segment that cannot be a dict key (not a str): item by item, as match_routes
            return self._match_items(method, segments)
        if best is None:
            return None
        return Route(best[1], {name: segments[i] for i, name in best[2]})

    def _match_items(self, method: str, segments: list[Any]) -> Route | None:
        """`match` comparing item by item (`match_routes` over this shape's entries, in table order)."""
        entries = sorted((hit for _, group in self._by_shape.get((method, len(segments)), []) for hit in group.items()),
                         key=lambda item: item[1][0])
        for values, (_, op, params) in entries:
            literal = [i for i in range(len(segments)) if i not in {j for j, _ in params}]
            wanted = values if isinstance(values, tuple) and len(literal) != 1 else (values,)
            if all(segments[i] == v for i, v in zip(literal, wanted)) and all(segments[i] for i, _ in params):
                return Route(op, {name: segments[i] for i, name in params})
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
