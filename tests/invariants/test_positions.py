"""Error positions (invariants.engine.locate): a stray token inserted anywhere in the default policy
file is reported where Cedar's parser stops — on a token that holds or follows the insertion (a stray
glued to the word before it makes one longer word, e.g. ``principalwhen``, which starts before the
insertion and is the token Cedar names), and on the token Cedar names."""

from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from invariants.engine import parse_text
from invariants.errors import PolicyInvalid
from invariants.source import line_col, tokens

from .conftest import POLICIES

BASE = (POLICIES / "default.cedar").read_text(encoding="utf-8")
TOKS = tokens(BASE)
STRAY = ["}", ")", "]", "*", ";", "==", "(", "{", ".", ",", "&&", "||", "!", "<", "::", "when", "unless", "in",
         "has", "like", "if", "then", "is", "#", "$", "permit", "forbid", "principal", "resource", "1", '"s"',
         "@id", "@id(\"x\")", "?principal"]


def _located(stray: str, i: int, glued: bool) -> tuple[str, int, tuple[int, int], str, str] | None:
    """Insert ``stray`` before token ``i`` (with no space before it when ``glued``); None if the result
    parses, else (text, insertion offset, (line, column) reported, message, reported token's text)."""
    at = TOKS[i].start
    pre = "" if glued else " "
    text = BASE[:at] + pre + stray + " " + BASE[at:]
    try:
        parse_text(text, "p.cedar")
    except PolicyInvalid as exc:
        (_, line, _, msg), col = exc.problems[0], exc.columns[0]
    else:
        return None
    here = [t for t in tokens(text) if line_col(text, t.start) == (line, col)]
    assert here, (stray, i, glued, (line, col), msg)  # the position is a token's first character
    return text, at + len(pre), (line, col), msg, here[0].text


def _check(stray: str, i: int, glued: bool) -> None:
    got = _located(stray, i, glued)
    if got is None:
        return  # the insertion is valid Cedar
    text, at, (line, col), msg, where = got
    start = next(t for t in tokens(text) if line_col(text, t.start) == (line, col))
    # the text before the insertion is a prefix of valid Cedar: the error cannot lie wholly before it
    assert start.end > at, (stray, i, glued, line_col(text, at), (line, col), msg)
    named = re.findall(r"`([^`]*)`", msg)
    if msg.startswith("syntax error: unexpected token") and named:
        assert where == named[0], (stray, i, glued, (line, col), msg)
    if msg == "syntax error: invalid token":
        assert where[:1] in ("#", "$", "?", '"'), (where, msg)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, len(TOKS) - 1), st.sampled_from(STRAY), st.booleans())
def test_stray_token_is_located_where_cedar_stops(i: int, stray: str, glued: bool) -> None:
    _check(stray, i, glued)


def test_stray_when_glued_to_a_scope_variable() -> None:
    # the case fixed draws used to dodge: `principal` + `when` is one word, `principalwhen`, which Cedar names
    i = next(k for k, t in enumerate(TOKS) if t.text == "," and TOKS[k - 1].text == "principal")
    text, at, (line, col), msg, where = _located("when", i, glued=True) or ("", 0, (0, 0), "", "")
    assert where == "principalwhen" and msg.endswith("principalwhen"), msg
    assert (line, col) == line_col(text, at - len("principal"))
    _check("when", i, glued=True)
    _check("when", i, glued=False)
