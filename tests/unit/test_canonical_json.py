"""`sidecar.policy.canonical_json` (memo keys, governance-class keys, the entity JSON given to Cedar):
two values get the same text exactly when the standard library's ``sort_keys`` text is the same, and
the text parses back to the value."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.policy import canonical_json

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3),
                    st.sampled_from(["é", "\ud800", "a\u2028", "0", "1", "true"]))
json_values = st.recursive(  # what JSON can carry (string keys)
    scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(["", "1", "a", "é"]), kids, max_size=3),
    max_leaves=12,
)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3),
              st.sampled_from(["é", "\ud800", "a\u2028", "0", "1", "true"])),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=2), kids, max_size=3)
    | st.dictionaries(st.integers(0, 3), kids, max_size=2),
    max_leaves=12,
)


@settings(max_examples=1500, deadline=None)
@given(json_values, json_values)
def test_same_text_exactly_for_the_same_json_value(a: object, b: object) -> None:
    same_ref = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert (canonical_json(a) == canonical_json(b)) == same_ref


@settings(max_examples=1500, deadline=None)
@given(values, values)
def test_never_merges_what_the_standard_library_tells_apart(a: object, b: object) -> None:
    """With non-string keys (which no entity has) two texts may differ where the standard library's
    agree — a class split, never a merge."""
    if canonical_json(a) == canonical_json(b):
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@settings(max_examples=500, deadline=None)
@given(values)
def test_text_parses_back(value: object) -> None:
    text = canonical_json(value)
    ref = json.loads(json.dumps(value, sort_keys=True))
    assert json.loads(text.lstrip("\x00")) == ref


def test_types_are_kept_apart() -> None:
    assert len({canonical_json(v) for v in (1, 1.0, True, "1", [1], {"a": 1}, {"a": True})}) == 7
