"""`sidecar.backends.base.RouteTable` as of fe121ba (entries of one method and length tried one by one,
item by item): the reference of `tests/unit/test_route_table_groups.py`, beside `match_routes`."""

from __future__ import annotations

from sidecar.backends.base import Route

class RouteTable_fe121ba:
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

