"""Strings and entity ids reach Z3 exactly (issue 12, part 1): escape text is never interpreted, characters
above Z3's range stay distinct, and counterexamples carry the exact Cedar strings back.

Each DIFFER case is a permit guarded by two literals that Cedar reads as different strings but a translation
through Z3's string-literal parser (``z3.StringVal``) or its character limit reads as one: that translation
found the permit dead and proved Inv-Scope, while Cedar lets an agent read another agent's private row. Each
must be VIOLATED with a counterexample that cedarpy allows on the variant and denies on policies/, and that
carries the exact string. Each SAME case is the control: two spellings of one Cedar string, so the permit
is dead and Inv-Scope stays PROVED.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import z3

from invariants.catalog import check_invariants
from invariants.engine import authorize, parse_text
from invariants.project import load_project
from invariants.zstring import MAX_CHAR, SLOTS, Codec, code_points

from .conftest import POLICIES, SCHEMA
from .test_policy_check import run_json

SCHEMA_TEXT = SCHEMA.read_text(encoding="utf-8")
PROJ = load_project(POLICIES)
INV_SCOPE = [i for i in PROJ.invariants if i.id == "inv-scope"]
HI = chr(0x10FFFF)

# (name, guard, the scope or fleet id the counterexample must carry exactly); Cedar source, so r"\\" is one
# escaped backslash.
DIFFER: list[tuple[str, str, str]] = [
    ("u-escape-text", r'resource.scope == "agent" && resource.scope != "\\u{61}gent"', "agent"),
    ("u-escape-text-is-the-row", r'resource.scope == "\\u{61}gent" && resource.scope != "agent"', r"\u{61}gent"),
    ("u4-escape-text", r'resource.scope == "a" && resource.scope != "\\u0061"', "a"),
    ("u5-escape-text", r'resource.scope == "a" && resource.scope != "\\u{00061}"', "a"),
    ("u6-escape-text", r'resource.scope == "a" && resource.scope != "\\u{000061}"', "a"),
    ("surrogate-escape-text", r'resource.scope == "\\ud83d" && resource.scope != "x"', r"\ud83d"),
    ("x-escape-text", r'resource.scope == "A" && resource.scope != "\\x41"', "A"),
    ("newline-text", r'resource.scope == "\n" && resource.scope != "\\n"', "\n"),
    ("tab-text", r'resource.scope == "\t" && resource.scope != "\\t"', "\t"),
    ("nul-text", r'resource.scope == "\0" && resource.scope != "\\0"', "\0"),
    ("nul-u-text", r'resource.scope == "\u{0}" && resource.scope != "\\u{0}"', "\0"),
    ("quote-text", r'resource.scope == "\"" && resource.scope != "\\\""', '"'),
    ("backslash-pair", r'resource.scope == "\\" && resource.scope != "\\\\"', "\\"),
    ("cr-text", r'resource.scope == "\r" && resource.scope != "\\r"', "\r"),
    ("apostrophe-text", r'resource.scope == "\'" && resource.scope != "\\\'"', "'"),
    # U+10FFFF against the 10-character text \u{10ffff}, both ways, and other characters above Z3's range
    ("max-char-vs-text", f'resource.scope == "{HI}" && resource.scope != "\\\\u{{10ffff}}"', HI),
    ("text-vs-max-char", f'resource.scope == "\\\\u{{10ffff}}" && resource.scope != "{HI}"', r"\u{10ffff}"),
    ("escaped-max-char-vs-text", r'resource.scope == "\u{10ffff}" && resource.scope != "\\u{10ffff}"', HI),
    ("two-high-chars", r'resource.scope == "\u{30000}" && resource.scope != "\u{10ffff}"', chr(0x30000)),
    ("high-vs-surrogate-slot", r'resource.scope == "\u{10fffe}" && resource.scope != "\u{2ffff}"', chr(0x10FFFE)),
    ("non-bmp-text", r'resource.scope == "😀" && resource.scope != "\\u{1f600}"', "😀"),
    ("empty-vs-text", r'resource.scope == "" && resource.scope != "\\u{}"', ""),
    # like: `\*` is a literal star, `*` any sequence; escape text in a pattern is text
    ("like-escape-text", r'resource.scope like "\\u{61}gent*" && !(resource.scope like "agent*")', None),
    ("like-star-is-wildcard", r'resource.scope like "a*" && resource.scope != "a*" && resource.scope != "a"', None),
    ("like-backslash-then-wildcard", r'resource.scope like "a\\*" && !(resource.scope like "a\*")', None),
    ("like-high-char", r'resource.scope like "*\u{10ffff}*" && resource.scope != "\u{10ffff}"', None),
    ("like-empty", r'resource.scope like "" && !(resource.scope like "?*")', ""),
    # entity ids: escape text, `/`, `::`, whitespace, unicode
    ("fleet-id-escape-text", r'resource.fleet == Fleet::"t1/ops" && resource.fleet != Fleet::"t1/\\u{6f}ps"',
     "t1/ops"),
    ("fleet-id-is-escape-text", r'resource.fleet == Fleet::"t1/\\u{6f}ps" && resource.fleet != Fleet::"t1/ops"',
     r"t1/\u{6f}ps"),
    ("fleet-id-colons", r'resource.fleet == Fleet::"t1::f1" && resource.fleet != Fleet::"t1\\u{3a}:f1"',
     "t1::f1"),
    ("fleet-id-space", r'resource.fleet == Fleet::"t1/ f1" && resource.fleet != Fleet::"t1/\\u{20}f1"', "t1/ f1"),
    ("fleet-id-unicode", r'resource.fleet == Fleet::"t1/ü" && resource.fleet != Fleet::"t1/\\u{fc}"', "t1/ü"),
    ("fleet-id-high", r'resource.fleet == Fleet::"t1/\u{10ffff}" && resource.fleet != Fleet::"t1/\\u{10ffff}"',
     "t1/" + HI),
    ("fleet-id-empty", r'resource.fleet == Fleet::"" && resource.fleet != Fleet::"\\u{}"', ""),
    ("ancestor-escape-text", r'resource in Fleet::"t1/\\u{6f}ps" && !(resource in Fleet::"t1/ops")', None),
    ("set-member-escape-text", r'resource.labels.contains("\\u{61}") && !resource.labels.contains("a")', None),
    # more escape spellings as text: lower-case \x, upper-case hex, octal and the C escapes Cedar has not
    # (\a \b \f \v: text in Cedar, characters to a C-style string parser such as Z3's older one)
    ("x-escape-text-lower", r'resource.scope == "a" && resource.scope != "\\x61"', "a"),
    ("u-escape-text-upper-hex", r'resource.scope == "\u{FC}" && resource.scope != "\\u{FC}"', "ü"),
    ("u4-escape-text-non-ascii", r'resource.scope == "ü" && resource.scope != "\\u00fc"', "ü"),
    ("octal-escape-text", r'resource.scope == "A" && resource.scope != "\\101"', "A"),
    ("bell-text", r'resource.scope == "\u{7}" && resource.scope != "\\a"', "\x07"),
    ("backspace-text", r'resource.scope == "\u{8}" && resource.scope != "\\b"', "\x08"),
    ("formfeed-text", r'resource.scope == "\u{c}" && resource.scope != "\\f"', "\x0c"),
    ("vtab-text", r'resource.scope == "\u{b}" && resource.scope != "\\v"', "\x0b"),
    ("escape-text-after-quote", r'resource.scope == "\"a" && resource.scope != "\"\\u{61}"', '"a'),
    ("escape-text-inside", r'resource.scope == "t1/agent/x" && resource.scope != "t1/\\u{61}gent/x"', "t1/agent/x"),
    ("non-bmp-u4-pair-text", r'resource.scope == "😀" && resource.scope != "\\ud83d\\ude00"', "😀"),
    ("z3-max-char-vs-text", r'resource.scope == "\u{2ffff}" && resource.scope != "\\u{2ffff}"', chr(0x2FFFF)),
    ("above-z3-range-vs-text", r'resource.scope == "\u{30000}" && resource.scope != "\\u{30000}"', chr(0x30000)),
    ("bmp-edges", r'resource.scope == "\u{ffff}" && resource.scope != "\u{e000}"', chr(0xFFFF)),
    # like: a `\u{2a}` in a pattern is a wildcard to Cedar; escape text of a star in a pattern is text
    ("like-u-star-is-wildcard", r'resource.scope like "a\u{2a}" && resource.scope != "a" && resource.scope != "a*"',
     None),
    ("like-star-escape-text", r'resource.scope like "\\u{2a}" && resource.scope != "*"', r"\u{2a}"),
    ("like-literal-star-vs-text", r'resource.scope like "\*" && resource.scope != "\\*"', "*"),
    ("like-x-escape-text", r'resource.scope like "\\x61*" && !(resource.scope like "a*")', None),
    # entity ids: each escape spelling as text, and characters that need escaping
    ("fleet-id-x-escape-text", r'resource.fleet == Fleet::"t1/ops" && resource.fleet != Fleet::"t1/\\x6fps"',
     "t1/ops"),
    ("fleet-id-newline", r'resource.fleet == Fleet::"t1/\n" && resource.fleet != Fleet::"t1/\\n"', "t1/\n"),
    ("fleet-id-tab", r'resource.fleet == Fleet::"t1/\tf1" && resource.fleet != Fleet::"t1/\\tf1"', "t1/\tf1"),
    ("fleet-id-nul", r'resource.fleet == Fleet::"t1/\0" && resource.fleet != Fleet::"t1/\\0"', "t1/\0"),
    ("fleet-id-quote", r'resource.fleet == Fleet::"t1/\"" && resource.fleet != Fleet::"t1/\\\""', 't1/"'),
    ("fleet-id-backslash", r'resource.fleet == Fleet::"t1/\\" && resource.fleet != Fleet::"t1/\\\\"', "t1/\\"),
    ("fleet-id-non-bmp", r'resource.fleet == Fleet::"t1/😀" && resource.fleet != Fleet::"t1/\\u{1f600}"', "t1/😀"),
    ("fleet-id-colons-only", r'resource.fleet == Fleet::"::" && resource.fleet != Fleet::"\\u{3a}\\u{3a}"', "::"),
    ("fleet-id-whitespace", r'resource.fleet == Fleet::" " && resource.fleet != Fleet::"\\u{20}"', " "),
    ("tenant-id-escape-text", r'resource.tenant == Tenant::"t1" && resource.tenant != Tenant::"\\u{74}1"', None),
    ("owner-id-escape-text",
     r'resource.owner == Agent::"t1/f1/a1" && resource.owner != Agent::"t1/f1/\\u{61}1"', None),
    ("principal-id-escape-text", r'principal == Agent::"t1/f1/a2" && principal != Agent::"t1/f1/\\u{61}2"', None),
    ("principal-id-high", r'principal == Agent::"t1/f1/\u{10ffff}" && principal != Agent::"t1/f1/\\u{10ffff}"',
     None),
    ("set-member-high", r'resource.labels.contains("\u{10ffff}") && !resource.labels.contains("\\u{10ffff}")',
     None),
    ("set-any-x-escape-text", r'resource.labels.containsAny(["\\x41"]) && !resource.labels.contains("A")', None),
    ("set-all-empty-string", r'resource.labels.containsAll([""]) && !resource.labels.contains("\\u{}")', None),
    ("readers-id-escape-text",
     r'resource.readers.contains(Agent::"t1/f1/\\u{61}1") && !resource.readers.contains(Agent::"t1/f1/a1")',
     None),
]

# Two spellings of one Cedar string: the permit is dead, Inv-Scope holds.
SAME: list[tuple[str, str]] = [
    ("u-escape", r'resource.scope == "agent" && resource.scope != "\u{61}gent"'),
    ("x-escape", r'resource.scope == "A" && resource.scope != "\x41"'),
    ("u-escape-widths", r'resource.scope == "\u{0041}" && resource.scope != "\u{41}"'),
    ("max-char", f'resource.scope == "{HI}" && resource.scope != "\\u{{10ffff}}"'),
    ("non-bmp", r'resource.scope == "😀" && resource.scope != "\u{1F600}"'),
    ("nul", r'resource.scope == "\0" && resource.scope != "\u{0}"'),
    ("backslash", r'resource.scope == "\\" && resource.scope != "\u{5c}"'),
    ("quote", r'resource.scope == "\"" && resource.scope != "\u{22}"'),
    ("literal-star", r'resource.scope like "a\*" && resource.scope != "a*"'),
    ("like-exact", r'resource.scope like "\\u{61}" && resource.scope != "\\u{61}"'),
    ("like-high", r'resource.scope like "\u{10ffff}" && resource.scope != "' + HI + '"'),
    ("fleet-id", r'resource.fleet == Fleet::"t1/ops" && resource.fleet != Fleet::"t1/\u{6f}ps"'),
    ("fleet-id-high", r'resource.fleet == Fleet::"t1/\u{10ffff}" && resource.fleet != Fleet::"t1/' + HI + '"'),
    ("x-escape-lower", r'resource.scope == "a" && resource.scope != "\x61"'),
    ("named-escapes", r'resource.scope == "\n\t\r\0\'" && resource.scope != "\u{a}\u{9}\u{d}\u{0}\u{27}"'),
    ("like-u-star-is-wildcard", r'resource.scope like "a\u{2a}" && !(resource.scope like "a*")'),
    ("like-x-star-is-wildcard", r'resource.scope like "a\x2a" && !(resource.scope like "a*")'),
    ("fleet-id-named-escape", r'resource.fleet == Fleet::"t1/\tf1" && resource.fleet != Fleet::"t1/\u{9}f1"'),
    ("principal-id-escape", r'principal == Agent::"t1/f1/a2" && principal != Agent::"t1/f1/\u{61}2"'),
]


def variant(guard: str) -> str:
    return ('@id("auditor-reads")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
            f'when {{ resource.tenant == principal.tenant && principal.roles.contains("auditor") && {guard} }};\n')


def _inv_scope(text: str) -> Any:
    pols = PROJ.policies + parse_text(text, "variant.cedar").policies
    (row,) = [r for r in check_invariants(PROJ.schema, SCHEMA_TEXT, pols, INV_SCOPE, 60) if r.action == "read"]
    return row, pols


@pytest.mark.parametrize("name,guard,carried", DIFFER, ids=[d[0] for d in DIFFER])
def test_different_strings_are_different(name: str, guard: str, carried: str | None) -> None:
    row, pols = _inv_scope(variant(guard))
    assert row.status == "VIOLATED", (row.status, row.message)
    cex = row.counterexample
    assert cex is not None and cex["model"] == cex["cedar"]
    again = authorize(cex["request"], pols, cex["entities"], SCHEMA_TEXT)
    assert again.allow and again.reasons == {"auditor-reads"}
    assert not authorize(cex["request"], PROJ.policies, cex["entities"], SCHEMA_TEXT).allow
    if carried is not None:
        res = next(e for e in cex["entities"] if e["uid"] == cex["request"]["resource"])
        got = res["attrs"]["fleet"]["__entity"]["id"] if "fleet ==" in guard else res["attrs"]["scope"]
        assert got == carried  # decoded exactly: no escape text leaks into the replay


@pytest.mark.parametrize("name,guard", SAME, ids=[s[0] for s in SAME])
def test_one_string_spelled_twice_is_one_string(name: str, guard: str) -> None:
    row, _ = _inv_scope(variant(guard))
    assert row.status == "PROVED", (row.status, row.message, row.counterexample)


# The issue's three cases end to end: policies/ plus one file, through the CLI.
ISSUE = [
    ("scope", r'resource.scope == "agent" && resource.scope != "\\u{61}gent"'),
    ("max-char", f'resource.scope == "{HI}" && resource.scope != "\\\\u{{10ffff}}"'),
    ("entity-id", r'resource.fleet == Fleet::"t1/ops" && resource.fleet != Fleet::"t1/\\u{6f}ps"'),
]


@pytest.mark.parametrize("name,guard", ISSUE, ids=[i[0] for i in ISSUE])
def test_issue_cases_are_violated_end_to_end(name: str, guard: str, tmp_path: Path) -> None:
    d = tmp_path / "pol"
    shutil.copytree(POLICIES, d)
    shutil.rmtree(d / "tests")
    (d / "zz-variant.cedar").write_text(variant(guard), encoding="utf-8")
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "cex"))
    assert code == 1
    bad = {(r["invariant"], r["action"]): r for r in rep["results"] if r["status"] != "PROVED"}
    assert set(bad) == {("inv-scope", "read")}, {k: v["status"] for k, v in bad.items()}
    cex = json.loads(Path(bad[("inv-scope", "read")]["counterexample_file"]).read_text(encoding="utf-8"))
    pols = parse_text(variant(guard), "v.cedar").policies + PROJ.policies
    assert authorize(cex["request"], pols, cex["entities"], SCHEMA_TEXT).allow
    assert not authorize(cex["request"], PROJ.policies, cex["entities"], SCHEMA_TEXT).allow


# ---- the codec itself


ROUND_TRIP = ["", "agent", r"\u{61}gent", "\\", "\\\\", '"', "\0", "\n\t\r", r"\x41", "*", r"\*", "ü", "😀",
              chr(0xD7FF), chr(0xE000), chr(0xFFFF), chr(MAX_CHAR), chr(MAX_CHAR + 1), HI, r"\u{10ffff}",
              "t1/f1/a1", "t1::x", " a b ", "a" * 300]


def test_round_trip_is_exact() -> None:
    c = Codec()
    for s in ROUND_TRIP:
        t = c.encode(s)
        assert z3.is_string_value(t)
        assert c.decode(t) == s
        assert c.decode(z3.simplify(t)) == s
        assert z3.simplify(z3.Length(t)).as_long() == len(s)
    terms = [c.encode(s) for s in ROUND_TRIP]
    for i, a in enumerate(terms):
        for j, b in enumerate(terms):
            assert z3.is_true(z3.simplify(a == b)) == (i == j), (ROUND_TRIP[i], ROUND_TRIP[j])


def test_high_characters_take_surrogate_slots_injectively() -> None:
    c = Codec()
    hi = [chr(x) for x in (0x30000, 0x10FFFF, 0xE0001)]
    cps = [code_points(c.encode(h))[0] for h in hi]
    assert len(set(cps)) == 3 and all(0xD800 <= x <= 0xDFFF for x in cps)
    assert [c.decode(c.encode(h)) for h in hi] == hi
    # a surrogate the solver picked that stands for no input character decodes to a fresh character,
    # distinct from every other, and encodes back to the same slot
    free = next(x for x in range(0xD800, 0xE000) if x not in cps)
    fresh = c.decode(z3.simplify(z3.StrFromCode(free)))
    assert len(fresh) == 1 and ord(fresh) > MAX_CHAR and fresh not in hi
    assert code_points(c.encode(fresh)) == [free]


def test_too_many_high_characters_is_unsupported() -> None:
    from invariants.errors import Unsupported

    c = Codec()
    for k in range(SLOTS):
        c.encode(chr(MAX_CHAR + 1 + k))
    with pytest.raises(Unsupported):
        c.encode(chr(MAX_CHAR + 1 + SLOTS))
    with pytest.raises(Unsupported):
        Codec().encode("\ud800")


def test_z3_cannot_reason_about_characters_above_its_range() -> None:
    """Why the slots exist: Z3 drops characters above MAX_CHAR from its regular-expression reasoning.
    If this starts to pass (a wider Z3), the slots are no longer needed but remain correct."""
    assert MAX_CHAR < 0x10FFFF
    import ctypes

    def raw(cps: list[int]) -> z3.SeqRef:
        arr = (ctypes.c_uint * len(cps))(*cps)
        return z3.SeqRef(z3.Z3_mk_u32string(z3.main_ctx().ref(), len(cps), arr))

    x, y, w = z3.String("x"), z3.String("y"), z3.String("w")
    anything = z3.Star(z3.AllChar(z3.ReSort(z3.StringSort())))
    s = z3.Solver()
    s.add(x == z3.Concat(w, raw([0x10FFFF]), y), z3.Length(w) > 2,
          z3.InRe(x, z3.Concat(anything, z3.Re(raw([0x10FFFF])), anything)))
    assert s.check() == z3.unsat  # wrong, and the reason for the slots
    c = Codec()
    s = z3.Solver()
    s.add(x == z3.Concat(w, c.encode(HI), y), z3.Length(w) > 2,
          z3.InRe(x, z3.Concat(anything, z3.Re(c.encode(HI)), anything)))
    assert s.check() == z3.sat
