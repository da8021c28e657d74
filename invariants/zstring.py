"""Cedar strings as Z3 string values, exactly, in both directions.

Cedar strings (string literals, attribute values, entity ids) are sequences of Unicode scalar values,
U+0000..U+D7FF and U+E000..U+10FFFF (Cedar reference, "String"; the Rust ``String`` of cedar-policy).
Two pitfalls stand between them and Z3:

* ``z3.StringVal(s)`` runs ``s`` through Z3's string-literal parser, which *interprets* escape
  sequences: the 9-character Cedar string ``\\u{61}gent`` (backslash, ``u``, ``{``…) becomes the
  5-character ``agent``, and ``\\x41`` becomes ``A``.  Reading a value back with ``as_string()`` is
  lossy the other way (a backslash and the text of an escape print alike).  Here strings are built from
  their code points with ``Z3_mk_u32string`` and read back with ``Z3_get_string_contents``; no text is
  ever parsed or printed.
* Z3's characters stop at ``MAX_CHAR`` (0x2FFFF under ``encoding=unicode``, the widest Z3 offers;
  ``StrFromCode(0x30000)`` is the empty string and regular-expression reasoning about larger characters
  is wrong, e.g. ``x = a·U+10FFFF·b ∧ x ∈ .*U+10FFFF.*`` comes out unsatisfiable).  Cedar characters
  above ``MAX_CHAR`` are therefore mapped, per `Codec`, onto the surrogate code points U+D800..U+DFFF,
  which Z3 has but no Cedar string can contain.  The mapping is injective and fixed for the lifetime of
  one codec (one translation: the policies, the invariants and, for a counterexample, the model), so
  equality, set membership and ``like`` — the only operations Cedar has on strings; there is no string
  ordering — are exact.  A solver-chosen surrogate that stands for no character of the input decodes to
  an unused character above ``MAX_CHAR``: an injective renaming that fixes every character the policies
  mention, so it changes no decision (and the counterexample is replayed through Cedar anyway).  One
  translation may hold at most 2,048 distinct characters above ``MAX_CHAR``; beyond that `encode` raises
  ``Unsupported``.

Errors: ``Unsupported`` (too many characters above ``MAX_CHAR``; a lone surrogate, which is no Cedar
string); ``ValueError`` from `decode` on a term that is not a string value.
"""

from __future__ import annotations

import ctypes

import z3

from .errors import Unsupported

__all__ = ["Codec", "MAX_CHAR", "SLOTS", "code_points"]

SURROGATES = range(0xD800, 0xE000)
SLOTS = len(SURROGATES)
UNICODE_MAX = 0x10FFFF

z3.set_param("encoding", "unicode")


def _probe_max_char() -> int:
    """The largest code point ``str.from_code`` accepts in this Z3 (binary search, ~21 simplifications)."""
    lo, hi = 0xFF, UNICODE_MAX
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if z3.simplify(z3.Length(z3.StrFromCode(z3.IntVal(mid)))).as_long() == 1:
            lo = mid
        else:
            hi = mid - 1
    return lo


MAX_CHAR = _probe_max_char()
if MAX_CHAR < SURROGATES[-1]:
    raise ImportError(f"Z3's character range ends at {MAX_CHAR:#x}: below the surrogate slots this module needs "
                      "(is the z3 `encoding` parameter set to ascii or bmp?)")


def code_points(t: z3.ExprRef) -> list[int]:
    """The characters of a Z3 string value, as Z3 holds them; raises ``ValueError`` otherwise."""
    if not z3.is_string_value(t):
        raise ValueError(f"not a string value: {t}")
    ctx = t.ctx.ref()
    n = z3.Z3_get_string_length(ctx, t.as_ast())
    buf = (ctypes.c_uint * n)()
    if n:
        z3.Z3_get_string_contents(ctx, t.as_ast(), n, buf)
    return list(buf)


def _u32(cps: list[int]) -> z3.SeqRef:
    ctx = z3.main_ctx()
    arr = (ctypes.c_uint * len(cps))(*cps)
    return z3.SeqRef(z3.Z3_mk_u32string(ctx.ref(), len(cps), arr), ctx)


class Codec:
    """One translation's bijection between Cedar strings and Z3 string values (module docstring)."""

    def __init__(self) -> None:
        self._slot_of: dict[int, int] = {}  # Cedar code point above MAX_CHAR -> surrogate slot
        self._char_of: dict[int, int] = {}  # surrogate slot -> Cedar code point
        self._cache: dict[str, z3.SeqRef] = {}

    def _slot(self, cp: int) -> int:
        s = self._slot_of.get(cp)
        if s is None:
            free = next((x for x in SURROGATES if x not in self._char_of), None)
            if free is None:
                raise Unsupported(f"more than {SLOTS} distinct characters above U+{MAX_CHAR:X} in one check")
            self._slot_of[cp], self._char_of[free] = free, cp
            s = free
        return s

    def encode(self, s: str) -> z3.SeqRef:
        """The Z3 string value denoting the Cedar string ``s`` (never parsed as text)."""
        hit = self._cache.get(s)
        if hit is not None:
            return hit
        cps = []
        for ch in s:
            cp = ord(ch)
            if cp in SURROGATES:
                raise Unsupported(f"lone surrogate U+{cp:04X} in a string (not a Cedar string)")
            cps.append(self._slot(cp) if cp > MAX_CHAR else cp)
        out = self._cache[s] = _u32(cps)
        return out

    def decode(self, t: z3.ExprRef) -> str:
        """The Cedar string a Z3 string value denotes (the inverse of `encode`)."""
        out = []
        for cp in code_points(t):
            if cp in SURROGATES:
                cp = self._char_of.get(cp) or self._fresh(cp)
            out.append(chr(cp))
        return "".join(out)

    def _fresh(self, slot: int) -> int:
        """A solver-chosen slot that stands for no input character: bind it to the lowest unused
        character above MAX_CHAR, so the decoding stays injective and later encodings agree with it."""
        cp = next(c for c in range(MAX_CHAR + 1, UNICODE_MAX + 1) if c not in self._slot_of)
        self._slot_of[cp], self._char_of[slot] = slot, cp
        return cp
