"""Source positions in Cedar policy and schema text: a lexer close enough to Cedar's for locating
errors, and offset → (line, column).

Cedar's engine (cedarpy 4.12) reports a parse or schema error as a message without a position
("unexpected token `}`", "failed to resolve type: B"). ``invariants.engine`` recovers the position by
re-parsing prefixes that end on token boundaries (the first prefix whose error is the file's error
ends at the offending token) and by finding the token a message names; this module supplies the tokens
and the arithmetic. Lines and columns are 1-based; columns count Unicode code points (SARIF
``columnKind: unicodeCodePoints``).

Token kinds: ``str`` (a string literal, possibly unterminated: then it runs to the end of the text),
``ident``, ``slot`` (a template slot ``?principal``/``?resource``, one token as in Cedar), ``int``, ``op`` (``== != <= >= && || ::`` or any other single character). Whitespace and
``//`` comments are skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["Token", "tokens", "line_col", "find_fragment", "statement_start"]

_TOK = re.compile(r'''
    (?P<ws>\s+)
  | (?P<comment>//[^\n]*)
  | (?P<str>"(?:[^"\\]|\\.)*"|"(?:[^"\\]|\\.)*\\?\Z)
  | (?P<slot>\?(?:principal|resource)(?![A-Za-z0-9_]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<int>[0-9]+)
  | (?P<op>==|!=|<=|>=|&&|\|\||::|.)
''', re.S | re.X)


@dataclass(frozen=True)
class Token:
    kind: str
    start: int
    end: int
    text: str


def tokens(text: str) -> list[Token]:
    """The tokens of ``text`` in order (whitespace and comments dropped); never raises."""
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOK.match(text, pos)
        assert m is not None  # the last alternative matches any character
        kind = m.lastgroup or "op"
        if kind not in ("ws", "comment"):
            out.append(Token(kind, m.start(), m.end(), m.group()))
        pos = m.end()
    return out


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column in code points) of ``offset`` in ``text``."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, col


def statement_start(toks: list[Token], k: int) -> int:
    """Index of the first token of the top-level statement (``;``-terminated, brackets balanced) that
    holds token ``k``."""
    depth, start = 0, 0
    for i, t in enumerate(toks[:k + 1]):
        if i == k:
            break
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth = max(0, depth - 1)
        elif t.text == ";" and depth == 0:
            start = i + 1
    return min(start, k)


def find_fragment(text: str, toks: list[Token], frag: str, lo: int, hi: int, attribute: bool = False) -> int | None:
    """Offset of the first place among tokens ``lo..hi`` where ``frag`` (the text a Cedar message names,
    e.g. ``nope``, ``\\q``, ``Agent::"x"``, ``N::Q``) is written: as the source text starting at a token,
    as the JSON value of a string token, inside a string literal (an escape), or as consecutive tokens
    written with spaces Cedar's message drops (``Action ::"read"``). With ``attribute``,
    an occurrence after ``.`` or ``has`` comes first."""
    if not frag:
        return None
    window = toks[lo:hi + 1]
    if attribute:
        for a, b in zip(window, window[1:]):
            if a.text in (".", "has") and b.text == frag:
                return b.start
            if a.text in (".", "has") and b.kind == "str" and _str_value(b.text) == frag:
                return b.start
    for t in window:
        if text.startswith(frag, t.start) and (t.kind != "ident" or not _ident_continues(text, t.start + len(frag))):
            return t.start
        if t.kind == "str" and _str_value(t.text) == frag:
            return t.start
    for t in window:
        if t.kind == "str":
            i = t.text.find(frag)
            if i >= 0:
                return t.start + i
    # Cedar prints a name without the source's spacing (`Actionwhen::"read"` for ``Actionwhen ::"read"``):
    # the tokens from one on whose texts, concatenated, are the fragment.
    for j, t in enumerate(window):
        acc = ""
        for u in window[j:]:
            acc += u.text
            if acc == frag:
                return t.start
            if not frag.startswith(acc):
                break
    return None


def _ident_continues(text: str, pos: int) -> bool:
    return pos < len(text) and (text[pos].isalnum() or text[pos] == "_")


def _str_value(lit: str) -> str | None:
    try:
        v = json.loads(lit)
    except ValueError:
        return None
    return v if isinstance(v, str) else None
