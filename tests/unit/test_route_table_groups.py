"""`RouteTable.match` (entries grouped by the positions of their literal items, one dict look-up per group)
answers as `match_routes` and as the previous `RouteTable` (`tests/unit/routes_reference.py`) over Hypothesis
tables whose entries overlap in any order (a parameter in one where another has a literal, duplicates,
patterns of parameters only, no literal shared) and segments that are empty, unicode, or not strings at all
(ints, unhashable lists); the profiles' own tables are covered by `test_request_fixed_costs`."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.backends.base import RouteTable, match_routes
from tests.unit.routes_reference import RouteTable_fe121ba

items = st.sampled_from(["a", "b", "é", "{x}", "{y}", "{z}"])
tables = st.lists(st.tuples(st.sampled_from(["GET", "POST"]), st.lists(items, max_size=4).map(tuple),
                            st.sampled_from(["op1", "op2", "op3", "op4"])), max_size=10)
segment = st.one_of(st.sampled_from(["a", "b", "é", "", "c", "A"]), st.text(max_size=2), st.integers(0, 2),
                    st.just(["a"]), st.just(("a",)))


@settings(max_examples=1500, deadline=None)
@given(tables, st.sampled_from(["GET", "POST", "PUT"]), st.lists(segment, max_size=4))
@example([("GET", ("a", "{x}"), "op1"), ("GET", ("{y}", "b"), "op2")], "GET", ["a", "b"])
@example([("GET", ("{y}", "b"), "op2"), ("GET", ("a", "{x}"), "op1")], "GET", ["a", "b"])
@example([("GET", ("a", "{x}"), "op1"), ("GET", ("{y}", "b"), "op2")], "GET", ["a", ""])
@example([("GET", ("a", "{x}"), "op1"), ("GET", ("a", "{y}"), "op2")], "GET", ["a", ""])
@example([("GET", ("{x}",), "op1"), ("GET", ("a",), "op2")], "GET", [""])
@example([("GET", ("{x}", "{y}"), "op1")], "GET", [["a"], "b"])
@example([("GET", ("a", "b"), "op1"), ("GET", ("{x}", "{y}"), "op2")], "GET", [["a"], "b"])
@example([("GET", (), "op1")], "GET", [])
def test_grouped_route_table_matches_as_before(table: Any, method: str, segments: list[Any]) -> None:
    expected = match_routes(table, method, segments)
    assert RouteTable_fe121ba(table).match(method, segments) == expected
    assert RouteTable(table).match(method, segments) == expected
