"""The bulk tree check (`canonicalize._valid_tree`, the fast path of the strict body parser and of the
backend-row check) accepts exactly what the reference walk (`canonicalize._check_tree`) accepts, and a
refused body is refused with the reference walk's message."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.errors import BadRequest
from sidecar.stages import canonicalize as c


class Sub(str):
    pass


class DictSub(dict):  # type: ignore[type-arg]
    pass


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4), st.sampled_from(["\ud800", "a\udfff", "\ud83d", "\ude00", "ok", ""]),
    st.builds(Sub, st.sampled_from(["x", "\ud800"])),
)
trees = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=5),
        st.lists(st.floats(), max_size=20),  # uniform lists of more than 8 take the bulk path
        st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=9, max_size=20),
        st.lists(st.text(max_size=3) | st.just("\udc00"), max_size=20),
        st.lists(st.text(max_size=3), min_size=9, max_size=20),
        st.dictionaries(st.text(max_size=3) | st.just("\ud801"), kids, max_size=4),
        # more than 8 objects: the bulk path of a column of objects (flat, as backend metadatas are, or nested)
        st.lists(st.dictionaries(st.text(max_size=3) | st.just("\ud801"), scalars, max_size=3), min_size=9, max_size=12),
        st.lists(st.dictionaries(st.text(max_size=2), kids, max_size=2), min_size=9, max_size=10),
        st.builds(DictSub, st.dictionaries(st.text(max_size=2), kids, max_size=3)),
    ),
    max_leaves=40,
)


def reference(value: object, depth: int) -> bool:
    try:
        c._check_tree(value, depth)
    except BadRequest:
        return False
    return True


@settings(max_examples=1500, deadline=None)
@given(trees, st.integers(min_value=1, max_value=6))
def test_bulk_check_agrees_with_the_reference_walk(value: object, depth: int) -> None:
    assert c._valid_tree(value, depth) == reference(value, depth)
    assert c.well_formed(value, depth) == reference(value, depth)


@pytest.mark.parametrize("value, depth, ok", [
    ([1.0] * 384, 1, True), ([1.0] * 383 + [math.inf], 1, False), ([1.0, math.nan], 1, False),
    ([[1.0]], 1, False), ([[1.0]], 2, True), ({"a": [1, 2, True, None]}, 2, True),
    (["a"] * 10 + ["\ud800"], 1, False), ({"\udfff": 1}, 1, False), ([2 ** 80, 1.5], 1, True),
    ({"a": {"b": {}}}, 2, False), ({"a": {"b": {}}}, 3, True), ([[], [[]]], 2, False),
    ([[1.0] * 20], 1, False), ([["a"] * 20], 1, False), ([["a"] * 20], 2, True), (["a"] * 20 + ["\udfff"], 1, False),
    ([{}] * 9, 1, False), ([{}] * 9, 2, True), ([{"a": 1.0}] * 9 + [{"b": math.nan}], 2, False),
    ([{"a": "x"}] * 9 + [{"b": "\ud800"}], 2, False), ([{"a": "x"}] * 9 + [{"\ud800": 1}], 2, False),
    ([{"a": [1]}] * 9, 2, False), ([{"a": [1]}] * 9, 3, True), ([{"a": {"b": [math.inf]}}] * 9, 5, False),
])
def test_bulk_check_cases(value: object, depth: int, ok: bool) -> None:
    assert c._valid_tree(value, depth) is ok
    assert reference(value, depth) is ok


@pytest.mark.parametrize("body", [
    # several faults in one body: the message is the reference walk's first error
    b'{"a": [1e999, "\\ud800"], "b": [[[[1]]]]}',
    b'{"a": "\\ud800", "b": [1e999]}',
    b'{"b": [1e999], "a": "\\udfff"}',
    b'[[[[["\\ud800"]]]], 1e999]',
])
def test_refused_body_names_the_reference_error(body: bytes) -> None:
    value = json.loads(body)
    with pytest.raises(BadRequest) as expected:
        c._check_tree(value, 3)
    with pytest.raises(BadRequest) as got:
        c.parse_json_body(body, "application/json", 3)
    assert str(got.value) == str(expected.value)
