"""Differential test (cedar-spec DRT style): on generated schema-conforming policies,
entity stores and requests, the Z3 model's decision — and its determining and erroring
policies — must equal cedarpy's.  A mismatch prints the whole input.

The generator (strategies.py) covers the literal space Cedar accepts — escape text and every escape
spelling, quotes, ``*`` and ``\\*`` in patterns, empty strings, non-BMP characters and characters above
Z3's range, odd entity ids, both ends of the Long range, duplicates in sets — on the memwarden schema
and on a six-level hierarchy (DEEP_SCHEMA). CI runs the ``ci`` profile (2,000 + 500 examples);
bench/differential.py runs 100,000 without Hypothesis' engine. Shrunk failures are pasted into
test_regressions.py.
"""

from __future__ import annotations

import json
from typing import Any

import cedarpy
from hypothesis import given, note

from invariants.concrete import evaluate
from invariants.engine import authorize, parse_text
from invariants.schema import parse_schema

from .conftest import SCHEMA, differential_settings
from .strategies import DEEP_SCHEMA, scenario

SCHEMA_TEXT = SCHEMA.read_text(encoding="utf-8")
SCHEMA_MODEL = parse_schema(SCHEMA_TEXT)


DEEP_MODEL = parse_schema(DEEP_SCHEMA)

# schema text -> (schema model, cedarpy's pre-parsed Schema handle): parsed once, not per example
_PARSED: dict[str, tuple[Any, Any]] = {SCHEMA_TEXT: (SCHEMA_MODEL, cedarpy.Schema.from_str(SCHEMA_TEXT)),
                                       DEEP_SCHEMA: (DEEP_MODEL, cedarpy.Schema.from_str(DEEP_SCHEMA))}


def check_agreement(text: str, entities: list[dict[str, Any]], request: dict[str, Any],
                    schema_text: str = SCHEMA_TEXT) -> bool:
    """Assert model == Cedar; returns False when the generated policies do not validate."""
    if schema_text not in _PARSED:
        _PARSED[schema_text] = (parse_schema(schema_text), cedarpy.Schema.from_str(schema_text))
    model_schema, handle = _PARSED[schema_text]
    if not cedarpy.validate_policies(text, handle).validation_passed:
        return False
    pols = parse_text(text, "generated.cedar").policies
    cedar = authorize(request, pols, entities, handle).to_json()
    model = evaluate(model_schema, pols, request, entities)
    assert model == cedar, (
        "Z3 model and Cedar disagree\n"
        f"policies:\n{text}\nrequest: {json.dumps(request)}\nentities: {json.dumps(entities)}\n"
        f"model: {model}\ncedar: {cedar}")
    return True


@differential_settings()
@given(scenario(SCHEMA_MODEL))
def test_z3_model_agrees_with_cedar(case: tuple[str, list[dict[str, Any]], dict[str, Any]]) -> None:
    text, entities, request = case
    note(text)
    check_agreement(text, entities, request)


def _deep_settings() -> Any:
    base = differential_settings()
    return base.__class__(base, max_examples=max(base.max_examples // 4, 1))


@_deep_settings()
@given(scenario(DEEP_MODEL))
def test_z3_model_agrees_with_cedar_on_a_deep_hierarchy(case: tuple[str, list[dict[str, Any]], dict[str, Any]]) -> None:
    text, entities, request = case
    note(text)
    check_agreement(text, entities, request, DEEP_SCHEMA)


def test_generator_mostly_produces_valid_policies() -> None:
    """Degeneracy guard: the generated policies validate, and decisions vary."""
    decisions = set()
    valid = 0

    @differential_settings().__class__(max_examples=400, deadline=None, database=None, derandomize=True)
    @given(scenario(SCHEMA_MODEL))
    def probe(case: tuple[str, list[dict[str, Any]], dict[str, Any]]) -> None:
        nonlocal valid
        text, entities, request = case
        if cedarpy.validate_policies(text, SCHEMA_TEXT).validation_passed:
            valid += 1
            pols = parse_text(text, "generated.cedar").policies
            r = authorize(request, pols, entities, SCHEMA_TEXT)
            decisions.add((r.allow, bool(r.errors)))

    probe()
    assert valid >= 300, f"only {valid}/400 generated policy sets validate"
    assert {(True, False), (False, False), (False, True)} <= decisions, decisions


def test_generator_covers_the_literal_space() -> None:
    """Degeneracy guard for issue 12: the literals Cedar accepts and a wrong translation confuses do occur
    (checked on the parsed policies, so a spelling Cedar reads differently than intended would show)."""
    import random

    from cedarpy import pst

    from .strategies import RandomDraw, gen_scenario

    seen: set[str] = set()

    def lit(kind: str, s: str) -> None:
        for name, hit in (("backslash", "\\" in s), ("escape text", "\\u{" in s), ("quote", '"' in s),
                          ("empty", s == ""), ("non-BMP", any(0xFFFF < ord(c) <= 0x2FFFF for c in s)),
                          ("above Z3", any(ord(c) > 0x2FFFF for c in s)), ("control", any(ord(c) < 0x20 for c in s)),
                          ("star", "*" in s), ("::", "::" in s), ("space", " " in s)):
            if hit:
                seen.add(f"{kind} {name}")

    def walk(n: Any) -> None:
        if isinstance(n, (list, tuple)):
            for x in n:
                walk(x)
        elif isinstance(n, dict):
            for x in n.values():
                walk(x)
        elif hasattr(n, "__dataclass_fields__"):
            if isinstance(n, pst.StringLit):
                lit("string", n.value)
            elif isinstance(n, pst.EntityLit):
                lit("id", n.value.id)
            elif isinstance(n, pst.LongLit) and abs(n.value) >= 2 ** 63 - 1:
                seen.add("long bound")
            elif isinstance(n, pst.Like):
                seen.update({"like wildcard"} if any(isinstance(e, pst.Wildcard) for e in n.pattern) else set())
                seen.update({"like literal star"} if any(isinstance(e, pst.Char) and e.value == "*"
                                                         for e in n.pattern) else set())
            for f in n.__dataclass_fields__:
                walk(getattr(n, f))

    draw = RandomDraw(random.Random(12))
    errors = 0
    for _ in range(300):
        text, entities, request = gen_scenario(draw, SCHEMA_MODEL)
        if not cedarpy.validate_policies(text, SCHEMA_TEXT).validation_passed:
            continue
        pols = parse_text(text, "g.cedar").policies
        for p in pols:
            walk(p.ast)
        errors += bool(authorize(request, pols, entities, SCHEMA_TEXT).errors)
        for e in entities:
            for v in e["attrs"].values():
                if isinstance(v, list) and len(v) != len({json.dumps(x) for x in v}):
                    seen.add("set duplicates")
    want = {f"{k} {n}" for k in ("string", "id") for n in ("backslash", "escape text", "empty", "non-BMP",
                                                            "above Z3", "space")}
    want |= {"string quote", "string control", "string star", "id ::", "long bound", "like wildcard",
             "like literal star", "set duplicates"}
    assert want <= seen, sorted(want - seen)
    assert errors > 0  # overflow and missing attributes do occur

