"""`sidecar.answer.answer_bytes` gives the old answer bytes (`answer_reference.old_payload`, the standard
library) for every value — the same bytes, or an exception of the same type — and orjson writes them on the
common answer. Hypothesis over JSON-like trees with the cases where orjson and the standard library differ:
NaN and infinities, ints beyond 64 bits, non-str keys, lone surrogates, DEL and non-ASCII text, floats below
1e-4, tuples, subclasses, enum members, UUIDs, orjson fragments, deep and circular values."""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import json
import math
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar import answer
from sidecar.answer import answer_bytes

from .answer_reference import _OPTION, answer_bytes_h22j, old_payload, same_form_h22j


class Str(str):
    pass


class Int(int):
    pass


class Float(float):
    pass


class Dict(dict):
    pass


class List(list):
    pass


class Tuple(tuple):
    pass


class Color(enum.Enum):
    RED = 1
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1


class Name(str, enum.Enum):
    A = "a"
    ONE = 1  # str(1): the member is the string "1", its value the int 1


Pair = collections.namedtuple("Pair", "a b")


def outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(value)
    except (ValueError, TypeError, RecursionError) as exc:
        return "raised", type(exc)


def same_as_old(value: Any) -> None:
    new, old = outcome(answer_bytes, value), outcome(old_payload, value)
    assert new == old, (value, new, old)
    if new[0] == "ok":
        assert json.loads(new[1]) == json.loads(old[1])


_EDGE_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-4, -1e-4, 9.999999999999999e-05, 1e-05, 2.5e-7,
                1e-9, 1e-10, 5e-324, 2.2250738585072014e-308, 1e15, 1e16, 1.5e16, 1e22, 1.7976931348623157e308, 0.1]
_EDGE_INTS = [2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, -2 ** 63, -2 ** 63 - 1, 10 ** 40, 0]
_EDGE_TEXT = ["", "a", "\x7f", "é", "\u2028", "😀", "\ud800", "\udfff", "\x00\x1f\b\f\n\r\t\"\\/", "e-mail",
              "v0.00001", "1e-5", "null", "NaN", "\ufeff"]

# Text: mostly ASCII (the path orjson takes), sometimes any code point, surrogates included.
texts = st.one_of(
    st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12),
    st.text(st.characters(blacklist_categories=()), max_size=6),
    st.sampled_from(_EDGE_TEXT),
)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(_EDGE_FLOATS),
                   st.floats(min_value=-1e-3, max_value=1e-3))
ints = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.sampled_from(_EDGE_INTS))
odd_scalars = st.sampled_from([Str("s"), Int(3), Float(1.5), Color.RED, Color.BLUE, Level.LOW, Name.A, Name.ONE,
                               uuid.UUID(int=7), orjson.Fragment(b"[1]"), decimal.Decimal("1.5"), b"x",
                               datetime.date(2020, 1, 2), object()])
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)
keys = st.one_of(texts, texts, st.integers(-3, 3), st.booleans(), st.none(), st.sampled_from([1.5, Str("k"), Name.A]))


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(texts, children, max_size=6),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=3),
        st.lists(children, max_size=3).map(List),
        st.lists(children, max_size=3).map(Tuple),
        st.dictionaries(texts, children, max_size=3).map(Dict),
        st.tuples(children, children).map(lambda t: Pair(*t)),
    )


values = st.recursive(st.one_of(scalars, scalars, scalars, odd_scalars), _containers, max_leaves=30)
# Plain JSON with ASCII text and ordinary numbers: what orjson writes itself.
plain_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1),
              st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x == 0 or abs(x) >= 1e-4),
              st.text(st.characters(min_codepoint=0, max_codepoint=0x7E), max_size=12)),
    lambda c: st.one_of(st.lists(c, max_size=6), st.dictionaries(st.text(st.characters(min_codepoint=0, max_codepoint=0x7E), max_size=8), c, max_size=6)),
    max_leaves=40)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
@example({"a": [1, {"b": math.nan}]})
@example([1.0, math.inf])
@example({"x": (1, 2.5, None)})
@example({"v": 1e-05})
@example({"v": [0.5, -2.5e-7]})
@example({"d": "\x7f"})
@example({"k": "é"})
@example({1: "a"})
@example({"e": Color.RED})
@example({"u": uuid.UUID(int=1)})
@example([orjson.Fragment(b"1")])
@example({"n": Name.ONE})
@example({"big": 2 ** 64})
@example({"s": "\ud800"})
def test_same_bytes_or_same_error(value: Any) -> None:
    same_as_old(value)


@settings(max_examples=500, deadline=None)
@given(plain_values)
def test_plain_json_is_written_by_orjson(value: Any) -> None:
    """ASCII text and floats of at least 1e-4 in magnitude: orjson's bytes are the answer, and they are the
    old bytes."""
    assert answer_bytes(value) == old_payload(value) == orjson.dumps(value)


def test_common_answer_skips_the_standard_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A k=10 Chroma query answer (ASCII documents and metadata, distances, null columns) is orjson's."""
    metas = [{"mw_tenant": "t", "mw_fleet": "f", "mw_owner": f"t/f/a{i}", "mw_scope": "tenant", "mw_created_at":
              1_700_000_000_000_000 + i, "topic": "x", "score": 0.25 * i, "ok": True, "none": None} for i in range(10)]
    body = {"ids": [[f"r{i}" for i in range(10)]], "embeddings": None, "documents": [[f"doc {i}" for i in range(10)]],
            "uris": None, "data": None, "metadatas": [metas], "distances": [[0.1 + i / 7 for i in range(10)]],
            "included": ["documents", "metadatas", "distances"]}
    expected = old_payload(body)

    def refuse(value: Any) -> bytes:
        raise AssertionError("the standard library was used")

    monkeypatch.setattr(answer, "reference_bytes", refuse)
    assert answer_bytes(body) == expected
    assert answer_bytes({"error": "not_found", "message": "no such row"}) == old_payload({"error": "not_found", "message": "no such row"})


@pytest.mark.parametrize("value", [math.nan, -math.inf, {"a": [[{"b": [math.inf]}]]}, Color.RED, uuid.UUID(int=3),
                                   orjson.Fragment(b"{}"), decimal.Decimal(1), {(1, 2): 3}, {1: 1, "1": 2}, Name.ONE,
                                   Level.LOW, Str("x"), {"s": Float(2.0)}, Pair(1, 2), "\ud83d", 2 ** 64 - 1, -2 ** 63 - 1])
def test_edge_values(value: Any) -> None:
    same_as_old(value)


def test_circular_and_deep_values() -> None:
    loop: list[Any] = []
    loop.append(loop)
    same_as_old(loop)
    for depth in (250, 254, 255, 256, 300, 900):
        deep: Any = 1.5
        for i in range(depth):
            deep = [deep] if i % 2 else {"k": deep}
        same_as_old(deep)


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
@example(9.999999999999999e-05)
@example(1e-4)
@example(5e-324)
@example(-1e-9)
def test_float_forms(x: float) -> None:
    """The lemma of step 3: orjson writes a finite float as repr does unless 0 < |x| < 1e-4 (which
    `_same_form` refuses)."""
    out = orjson.dumps(x)
    if x == 0 or abs(x) >= 1e-4:
        assert out == repr(x).encode()
    else:
        assert not answer._same_form([x])
    assert orjson.loads(out) == x
    same_as_old(x)
    same_as_old([x, "e-"])


@settings(max_examples=1000, deadline=None)
@given(st.text(st.characters(blacklist_categories=()), max_size=20))
def test_text_forms(s: str) -> None:
    """Step 4: orjson's bytes of a string are the standard library's when they are ASCII without DEL; a lone
    surrogate is refused by orjson."""
    try:
        out = orjson.dumps(s)
    except TypeError:
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in s)
        same_as_old(s)
        return
    if out.isascii() and b"\x7f" not in out:
        assert out == old_payload(s)
    same_as_old({s: s})


def test_probes_agree_with_this_orjson() -> None:
    assert answer._FAST


# -- non-ASCII answers: orjson's bytes with their non-ASCII characters escaped (`answer._escape`) ----------------
non_ascii_text = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.text(st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF, blacklist_categories=("Cs",)), max_size=6),
    st.sampled_from(["é", "café", "\u2028", "\u2029", "\ufeff", "😀", "\U0010ffff", "\x80", "ÿ", "\u0100", "\uffff",
                     "日本語のテキスト", "a\u00e9\U0001f600b", "\x7f", "é\x7f", '"é\\'])
)
non_ascii_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1), non_ascii_text,
              st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x == 0 or abs(x) >= 1e-4)),
    lambda c: st.one_of(st.lists(c, max_size=5), st.dictionaries(non_ascii_text, c, max_size=5)),
    max_leaves=30)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(non_ascii_values, values))
@example({"k": "é"})
@example({"é": ["😀", "\u2028"]})
@example(["\U0010ffff", "\x7f"])
@example({"d": "é\x7f"})
def test_non_ascii_as_before(value: Any) -> None:
    """Same bytes or same exception as the standard library (`old_payload`) and as the previous encoder
    (`answer_bytes_h22j`: non-ASCII output went to the standard library)."""
    same_as_old(value)
    assert outcome(answer_bytes, value) == outcome(answer_bytes_h22j, value)


@settings(max_examples=500, deadline=None)
@given(non_ascii_values)
def test_non_ascii_written_by_orjson(value: Any) -> None:
    """Without DEL, a value `_same_form` accepts is orjson's bytes, escaped: never the standard library's."""
    out = orjson.dumps(value)
    if b"\x7f" in out:
        return
    assert answer._same_form(value)
    assert answer._escape(out) == old_payload(value) == answer_bytes(value)


def test_non_ascii_answer_skips_the_standard_library(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"ids": [["r1", "r2"]], "documents": [["café au lait", "日本語 😀 \u2028"]],
            "metadatas": [[{"topic": "Ünïcode", "n": 1}, {"ключ": "значение"}]], "distances": [[0.5, 1.25]]}
    expected = old_payload(body)

    def refuse(value: Any) -> bytes:
        raise AssertionError("the standard library was used")

    monkeypatch.setattr(answer, "reference_bytes", refuse)
    assert answer_bytes(body) == expected


# Containers longer than `answer._SHORT` too (checked by their children's types at once, the short ones child by child).
_long_values = st.recursive(st.one_of(scalars, scalars, scalars, odd_scalars),
                            lambda c: st.one_of(st.lists(c, min_size=0, max_size=14), st.dictionaries(texts, c, max_size=12),
                                                st.lists(c, max_size=12).map(tuple)), max_leaves=60)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(values, _long_values))
@example([1] * 9 + [math.nan])
@example({str(i): "x" for i in range(9)} | {"z": Color.RED})
@example(["a"] * 20)
@example([["a"] * 9, [1.0] * 9, [1e-5] * 9])
def test_same_form_as_before(value: Any) -> None:
    """`answer._same_form` answers as `answer_reference.same_form_h22j` (every container looked at by its
    children's types at once) on every value orjson writes (the only ones it is asked about)."""
    try:
        orjson.dumps(value, option=_OPTION)
    except TypeError:
        return
    assert answer._same_form(value) == same_form_h22j(value)
