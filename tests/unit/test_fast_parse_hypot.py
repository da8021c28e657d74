"""`canonicalize._fast_members` bounds a long list of numbers by its Euclidean norm (`math.hypot`, below half the
2**63 bound) before the summed bound, and `canonicalize._fast_parse` skips the key-token scan when the text has
exactly as many colons as the tree has object members. Against the earlier code
(`tests/unit/canonicalize_reference.py`: `fast_members_sum`, `fast_parse_regex`): the same member count and the
same value whenever both accept; where only one accepts, `parse_json_body` still gives the reference parser's
value or message (`test_json_fast_path.check_agrees`), and the fast path never accepts what the reference
refuses. Duplicate keys with and without colons inside strings, keys, and values are generated on purpose."""

from __future__ import annotations

import json

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar.stages import canonicalize as c
from tests.unit.canonicalize_reference import fast_members_sum, fast_parse_regex
from tests.unit.test_fast_members_sum import orjson_value
from tests.unit.test_fast_members_sum import values as trees
from tests.unit.test_json_fast_path import check_agrees, documents, same


@settings(max_examples=400, deadline=None)
@given(trees, st.integers(1, 40))
@example([2.0 ** 62] * 2 + [1.0] * 8, 32)
@example([2.0 ** 61] * 9, 32)
@example([2 ** 63 - 1] + [0] * 8, 32)
@example([-(2 ** 63)] + [0] * 8, 32)
@example([2 ** 64 - 1] + [0] * 8, 32)
@example([1e308] * 9, 32)
@example([5e-324] * 9, 32)
@example([0.1] * 384, 32)
@example([True, False] * 5, 32)
@example(["a"] * 9, 32)
@example([1.0] * 8 + ["a"], 32)
@example([1.0] * 8 + [None], 32)
@example([1.0] * 8 + [[1.0]], 32)
def test_members_as_the_summed_bound(value: object, max_depth: int) -> None:
    v = orjson_value(value)
    if v is None:
        return
    new, old = c._fast_members(v, max_depth), fast_members_sum(v, max_depth)
    if new >= 0 and old >= 0:
        assert new == old
    if new != old:  # one of them sent the text to the reference parser: the answer is the reference's
        check_agrees(json.dumps(value).encode(), max_depth)


def check_fast_parse(body: bytes, max_depth: int) -> None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return
    new, old = c._fast_parse(text, max_depth), fast_parse_regex(text, max_depth)
    if new[0] and old[0]:
        assert same(new[1], old[1]), body[:200]
    if new[0] != old[0]:
        check_agrees(body, max_depth)


keys = st.sampled_from(["a", "b", ":", "a:", "::", "\\u003a", '\\":', ""])
scalars = st.sampled_from(['1', '"x"', '":"', '"a:b:c"', '"\\u003a"', "null", "[]", "{}", '[":"]', "1.5"])


@st.composite
def objects(draw: st.DrawFn) -> bytes:
    """An object of few keys (duplicates likely), colons in keys and in string values, nested once."""
    def obj() -> str:
        members = draw(st.lists(st.tuples(keys, scalars), max_size=5))
        return "{" + ",".join(f'"{k}"{draw(st.sampled_from(["", " "]))}:{v}' for k, v in members) + "}"
    inner = [obj() for _ in range(draw(st.integers(0, 3)))]
    return ("[" + ",".join(inner + [obj()]) + "]").encode()


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(documents())
@example((b'{"a": 1, "a": 2}', 32))
@example((b'{"a": ":", "a": 2}', 32))
@example((b'{"a:": 1, "a:": 2}', 32))
@example((b'{"a": ":", "b": 2}', 32))
@example((b'[{"x": ":"}, {"a": 1, "a": 2}]', 32))
@example((b'{"a": 1, "\\u0061": 2}', 32))
@example((b'{"\\u003a": 1, ":": 2}', 32))
def test_fast_parse_as_the_token_scan(doc: tuple[bytes, int]) -> None:
    check_fast_parse(*doc)


@settings(max_examples=1000, deadline=None)
@given(objects(), st.sampled_from([3, 32]))
def test_colons_in_strings_and_duplicates(body: bytes, max_depth: int) -> None:
    check_fast_parse(body, max_depth)
    check_agrees(body, max_depth)


def test_a_duplicate_is_refused_whatever_the_colons() -> None:
    for body in (b'{"a":1,"a":2}', b'{"a":":","a":2}', b'{"k:":1,"a":1,"a":2}', b'[{"a":1,"a":1}," :: "]'):
        assert c._fast_parse(body.decode(), 32) == (False, None)
        check_agrees(body, 32)


def test_an_embedding_stays_on_the_fast_path() -> None:
    body = json.dumps({"query_embeddings": [[round((i % 17 - 8) / 9, 6) for i in range(384)]], "n_results": 10,
                       "include": ["documents", "metadatas", "distances"]}, separators=(",", ":"))
    ok, value = c._fast_parse(body, 32)
    assert ok and value == orjson.loads(body)
    assert c._fast_members(value, 32) == 3
