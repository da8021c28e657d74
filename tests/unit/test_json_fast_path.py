"""The orjson fast path of the strict body parser (`canonicalize._fast_parse`) agrees with the reference
parser (`canonicalize._reference_parse`: the standard library with strict hooks): for every generated JSON
text `parse_json_body` gives the reference's value (same types, same float bits, same key order) or the
reference's `BadRequest` message; and the fast path only accepts what the reference accepts."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar.errors import BadRequest
from sidecar.stages import canonicalize as c


def same(a: Any, b: Any) -> bool:
    """Equal as the reference's value: same types, same float bits (-0.0 is not 0.0), same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a.hex() == b.hex()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except BadRequest as exc:
        return "refused", str(exc)


def check_agrees(body: bytes, max_depth: int) -> None:
    new = outcome(c.parse_json_body, body, "application/json", max_depth)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        assert new == ("refused", "JSON body is not valid UTF-8")
        return
    if not body:
        assert new == ("ok", None)
        return
    ref = outcome(c._reference_parse, text, max_depth)
    assert new[0] == ref[0], (body[:200], new, ref)
    if ref[0] == "ok":
        assert same(new[1], ref[1]), body[:200]
    else:
        assert new[1] == ref[1]
    fast_ok, fast_value = c._fast_parse(text, max_depth)
    if fast_ok:  # the fast path never accepts what the reference refuses
        assert ref[0] == "ok" and same(fast_value, ref[1]), body[:200]


# --- generated JSON texts -----------------------------------------------------------------------------

EDGE_NUMBERS = [
    "0", "-0", "-0.0", "0.0", "0e0", "-0e0", "0E-0", "1E+2", "1e5", "1.0", "1.5e-7", "-1", "10",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "18446744073709551615", "18446744073709551616", "-18446744073709551616", "123456789012345678901234567890",
    "9223372036854775807.0", "9.3e18", "-9.3e18", "9.2e18", "1e19", "1e400", "-1e400", "1e-400", "5e-324",
    "2.4703282292062327e-324", "2.4703282292062328e-324", "1.7976931348623157e308", "1.7976931348623158e308",
    "1.7976931348623159e308", "0.1000000000000000055511151231257827021181583404541015625",
    "1" + "0" * 400 + "e-400", "0." + "0" * 400 + "1e400", "NaN", "Infinity", "-Infinity",
]
BAD_NUMBERS = ["01", "1.", ".5", "+1", "-", "1e", "0x10", "00", "-01", "1_0"]
STRING_PIECES = [
    "a", "b", "k", "é", "😀", "\u2028", "\x7f", ":", '\\":', "\\\\", '\\"', "\\/", "\\b", "\\f", "\\n", "\\r",
    "\\t", "\\u0000", "\\u0041", "\\u003a", "\\u00e9", "\\ud83d\\ude00", "\\ud800", "\\udfff", "\\ud83d",
    "\\ude00", "\\ud800\\u0041", "\\uDBFF\\uDFFF", '": ', '", "', "\ufeff", "{", "]",
]
BAD_STRING_PIECES = ["\\x", "\\u12", "\x00", "\x1f", "\n", "\\", '"']
KEYS = ["a", "b", "id", "", "a\\u0062", "ab", "\\ud800", ":", '\\":', "k\\\\", "\\u0061"]  # few: duplicates
WS = ["", "", "", " ", "\n", "\t", "\r\n  "]
BAD_WS = ["\x0c", "\u00a0", "\u3000", "\x00"]


@st.composite
def numbers(draw: st.DrawFn, noisy: bool) -> str:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.sampled_from(EDGE_NUMBERS + BAD_NUMBERS if noisy else EDGE_NUMBERS))
    if kind == 1:
        return str(draw(st.integers(-(2 ** 66), 2 ** 66)))
    if kind == 2:
        return repr(draw(st.floats(allow_nan=False, allow_infinity=False)))
    if kind == 3:  # an embedding-like value as a JSON encoder writes it
        return json.dumps(draw(st.floats(-1, 1)))
    digits = draw(st.text("0123456789", min_size=1, max_size=30))
    mantissa = draw(st.sampled_from(["", "-"])) + (digits.lstrip("0") or "0")
    frac = draw(st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=25).map(lambda d: "." + d)))
    exp = draw(st.one_of(st.just(""), st.integers(-420, 420).map(lambda e: draw(st.sampled_from("eE")) + str(e))))
    return mantissa + frac + exp


@st.composite
def strings(draw: st.DrawFn, noisy: bool) -> str:
    pool = STRING_PIECES + BAD_STRING_PIECES if noisy else STRING_PIECES
    plain = st.text(max_size=3).filter(lambda s: '"' not in s and "\\" not in s and not any(ord(ch) < 32 for ch in s))
    return '"' + "".join(draw(st.lists(st.sampled_from(pool) | plain, max_size=6))) + '"'


def values(depth: int, noisy: bool) -> Any:
    ws = st.sampled_from(WS + BAD_WS if noisy else WS)
    leaf = st.one_of(numbers(noisy), strings(noisy), st.sampled_from(["true", "false", "null"]))
    if depth == 0:
        return leaf

    @st.composite
    def container(draw: st.DrawFn) -> str:
        if draw(st.booleans()):
            items = draw(st.lists(values(depth - 1, noisy), max_size=12))
            if draw(st.integers(0, 3)) == 0:  # a long list of numbers, as an embedding (the bulk checks)
                items = draw(st.lists(numbers(noisy), min_size=9, max_size=40))
            if draw(st.integers(0, 7)) == 0:
                items = draw(st.lists(strings(noisy), min_size=9, max_size=20))
            return "[" + draw(ws) + ("," + draw(ws)).join(items) + draw(ws) + "]"
        members = draw(st.lists(st.tuples(st.sampled_from(KEYS).map(lambda k: '"' + k + '"') | strings(noisy),
                                          values(depth - 1, noisy)), max_size=6))
        return "{" + draw(ws) + ",".join(k + draw(ws) + ":" + draw(ws) + v for k, v in members) + draw(ws) + "}"

    return st.one_of(leaf, container())


@st.composite
def documents(draw: st.DrawFn) -> tuple[bytes, int]:
    noisy = draw(st.integers(0, 4)) == 0  # invalid pieces (whitespace, numbers, escapes) in one text of five
    text = draw(values(3, noisy))
    for _ in range(draw(st.integers(0, 40)) if draw(st.integers(0, 3)) == 0 else 0):  # deep nesting
        text = draw(st.sampled_from(["[{}]", '{{"a":{}}}', '{{"a":1,"a":{}}}', "[1,{}]", '{{"b":[],"a":{}}}'])).format(text)
    text = draw(st.sampled_from(WS)) + text + draw(st.sampled_from(WS))
    mutation = draw(st.integers(0, 20))
    if mutation == 0:
        text = "\ufeff" + text
    elif mutation == 1 and text:
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + text[i + 1:]
    elif mutation == 2:
        text += draw(st.sampled_from([",", "]", "}", "x", "1", "\x00", "{}"]))
    elif mutation == 3 and text:
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(STRING_PIECES + BAD_STRING_PIECES)) + text[i:]
    body = text.encode("utf-8", "surrogatepass")
    return body, draw(st.sampled_from([2, 3, 5, 8, 32, 300]))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(documents())
@example((b'{"a": 1, "a": 2}', 32))
@example((b'[{"a": 1, "b": 2, "a": 3}]', 32))
@example((b'{"k": ":", "a": {"x": 1, "x": 2}}', 32))
@example((b'["x", ":", {"a": 1, "a": 2}]', 32))
@example((b'{"a\\":": 1, "a\\":": 2}', 32))
@example((b'{"a": 1, "\\u0061": 2}', 32))
def test_fast_path_agrees_with_reference(doc: tuple[bytes, int]) -> None:
    check_agrees(*doc)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40), st.sampled_from([3, 32]))
def test_any_bytes_agree(body: bytes, max_depth: int) -> None:
    check_agrees(body, max_depth)


# --- explicit regression cases ------------------------------------------------------------------------

REFUSED = {  # body: the reference's message, unchanged by the fast path
    b'{"a": 1, "a": 2}': "duplicate JSON key 'a'",
    b'{"a": 1, "\\u0061": 2}': "duplicate JSON key 'a'",
    b'[{"x": ":"}, {"a": 1, "a": 2}]': "duplicate JSON key 'a'",
    b'{"x": {"k": 1, "k": 1}}': "duplicate JSON key 'k'",
    b'9223372036854775808': "JSON integer 9223372036854775808 is outside the signed 64-bit range",
    b'[18446744073709551615]': "JSON integer 18446744073709551615 is outside the signed 64-bit range",
    b'[18446744073709551616]': "JSON integer 18446744073709551616 is outside the signed 64-bit range",
    b'-9223372036854775809': "JSON integer -9223372036854775809 is outside the signed 64-bit range",
    b'[' + b'1.5,' * 20 + b'9223372036854775808]': "JSON integer 9223372036854775808 is outside the signed 64-bit range",
    b'NaN': "non-finite JSON number NaN is not accepted",
    b'[-Infinity]': "non-finite JSON number -Infinity is not accepted",
    b'1e400': "JSON number out of range (not a finite 64-bit float, e.g. 1e999)",
    b'"\\ud800"': "JSON string contains a lone UTF-16 surrogate (not a Unicode scalar value)",
    b'{"\\udc00": 1}': "JSON string contains a lone UTF-16 surrogate (not a Unicode scalar value)",
    b'\xef\xbb\xbf{}': "malformed JSON body",
    b'{} x': "malformed JSON body",
    b'[1,]': "malformed JSON body",
    b'\xff': "JSON body is not valid UTF-8",
    b'"\xed\xa0\x80"': "JSON body is not valid UTF-8",
    b'[[[[1]]]]': "JSON body nests deeper than the limit of 3 levels (MEMWARDEN_MAX_JSON_DEPTH)",
}


@pytest.mark.parametrize("body", list(REFUSED))
def test_refused_with_the_reference_message(body: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        c.parse_json_body(body, "application/json", 3 if body.startswith(b"[[[[") else 32)
    assert str(info.value) == REFUSED[body]


def test_accepted_values_and_types() -> None:
    value = c.parse_json_body(b' {"a": -0, "b": -0.0, "c": 1e5, "d": 9223372036854775807, "e": -9223372036854775808,'
                              b' "f": 1e-400, "g": 5e-324, "h": "\\ud83d\\ude00", "i": [true, null, 1.0]}\r\n', None)
    assert same(value, {"a": 0, "b": -0.0, "c": 100000.0, "d": 2 ** 63 - 1, "e": -(2 ** 63), "f": 0.0, "g": 5e-324,
                        "h": "😀", "i": [True, None, 1.0]})


def query_body(dim: int = 384) -> bytes:
    rng = random.Random(7)
    return json.dumps({"query_embeddings": [[rng.gauss(0, 0.05) for _ in range(dim)]], "n_results": 10,
                       "include": ["documents", "metadatas", "distances"],
                       "where": {"$and": [{"topic": {"$eq": "x"}}, {"n": {"$gte": 3}}]}}).encode()


@pytest.mark.parametrize("body", [query_body(), b'{"ids": ["a", "b"], "documents": ["x: y", "\\"q\\": 1"]}',
                                  b'[' + b','.join(b'"s%d"' % i for i in range(20)) + b']', b'{"a": {"b": {"c": []}}}'])
def test_fast_path_takes_ordinary_bodies(body: bytes) -> None:
    """The fast path is used (not only the fallback) for ordinary bodies, and gives the reference value."""
    ok, value = c._fast_parse(body.decode(), 32)
    assert ok
    assert same(value, c._reference_parse(body.decode(), 32))


def test_limits_beyond_the_fast_path_use_the_reference() -> None:
    deep = b"[" * 300 + b"]" * 300
    assert c._fast_parse(deep.decode(), 300) == (False, None)
    assert c.parse_json_body(deep, None, 300) == c._reference_parse(deep.decode(), 300)


def test_float_bound_covers_every_out_of_range_integer() -> None:
    """orjson turns an integer token outside -2**63 .. 2**64-1 into a float; its magnitude is at least the
    bound, so the fast path never takes such a float for a fraction."""
    import orjson
    for text in ["18446744073709551616", "-9223372036854775809", "1" + "0" * 30, "-" + "9" * 25]:
        v = orjson.loads(text)
        assert isinstance(v, float) and not abs(v) < c._FLOAT_BOUND and math.isfinite(v)
