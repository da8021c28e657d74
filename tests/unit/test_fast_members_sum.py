"""`canonicalize._fast_members` bounds a long list of numbers with `sum(map(abs, ...))` instead of `math.fsum`:
against the fsum version (`tests/unit/canonicalize_reference.py`) both give the same member count whenever both
accept, either may send a list whose total is near the 2**63 bound to the reference parser (an int list is summed
exactly, so e.g. ``[2**63 - 1, 0, ...]`` now stays on the fast path), and `parse_json_body` gives the reference
parser's value or message on the same text, the fast path never accepting what it refuses
(`test_json_fast_path.check_agrees`); on values away from the bound both give exactly the same."""

from __future__ import annotations

import json

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.stages import canonicalize as c
from tests.unit.canonicalize_reference import fast_members_fsum
from tests.unit.test_json_fast_path import check_agrees

BOUND = 2 ** 63

near_bound_ints = st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1) | st.sampled_from(
    [2 ** 63 - 1, 2 ** 63, -(2 ** 63), -(2 ** 63) + 1, 2 ** 64 - 1, 2 ** 62, 2 ** 53 + 1])
floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [2.0 ** 63, -(2.0 ** 63), 2.0 ** 62, 9.223372036854775e18, 1e308, -1e308, 5e-324, -0.0, 0.0])
numbers = st.one_of(st.integers(-1000, 1000), near_bound_ints, floats, st.booleans())
scalars = st.one_of(numbers, st.none(), st.text(max_size=4))
long_lists = st.lists(numbers, min_size=9, max_size=60) | st.lists(scalars, min_size=9, max_size=30)
values = st.recursive(st.one_of(scalars, long_lists),
                      lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=3), inner, max_size=5),
                      max_leaves=80)


def orjson_value(v: object) -> object | None:
    """`v` as orjson gives it back from its JSON text (the only values `_fast_members` is given), or None."""
    try:
        return orjson.loads(json.dumps(v))
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return None


@settings(max_examples=300, deadline=None)
@given(values, st.integers(1, 40))
@example([2.0 ** 62] * 2 + [1.0] * 8, 32)
@example([2 ** 63 - 1] + [0] * 8, 32)
@example([1e308] * 9, 32)
@example([0.1] * 384, 32)
def test_same_count_or_the_reference(value: object, max_depth: int) -> None:
    v = orjson_value(value)
    if v is None:
        return
    new, old = c._fast_members(v, max_depth), fast_members_fsum(v, max_depth)
    if new >= 0 and old >= 0:
        assert new == old
    if new != old:  # one of them sent the text to the reference parser: the answer is the reference's
        check_agrees(json.dumps(value).encode(), max_depth)


small = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False) | st.integers(-(2 ** 40), 2 ** 40)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.lists(small, min_size=9, max_size=400) | small | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
                    max_leaves=30), st.integers(1, 40))
def test_same_count_away_from_the_bound(value: object, max_depth: int) -> None:
    v = orjson_value(value)
    if v is not None:
        assert c._fast_members(v, max_depth) == fast_members_fsum(v, max_depth)


@settings(max_examples=200, deadline=None)
@given(st.lists(numbers, min_size=9, max_size=400), st.integers(1, 40))
def test_parse_agrees_with_the_reference(items: list[object], max_depth: int) -> None:
    check_agrees(json.dumps({"query_embeddings": [items], "n_results": 10}).encode(), max_depth)


def test_embedding_body_takes_the_fast_path() -> None:
    body = {"query_embeddings": [[(-1) ** i * i / 1000 for i in range(384)]], "n_results": 10, "include": ["documents"]}
    ok, value = c._fast_parse(json.dumps(body), 32)
    assert ok and value == body
