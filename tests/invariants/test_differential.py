"""Differential test (cedar-spec DRT style): on generated schema-conforming policies,
entity stores and requests, the Z3 model's decision — and its determining and erroring
policies — must equal cedarpy's.  A mismatch prints the whole input.

Shrunk failures are pasted into test_regressions.py.
"""

from __future__ import annotations

import json
from typing import Any

import cedarpy
from hypothesis import given, note
from hypothesis import strategies as st

from invariants.concrete import evaluate
from invariants.engine import authorize, parse_text
from invariants.schema import parse_schema

from .conftest import SCHEMA, differential_settings
from .strategies import scenario

SCHEMA_TEXT = SCHEMA.read_text(encoding="utf-8")
SCHEMA_MODEL = parse_schema(SCHEMA_TEXT)


def check_agreement(text: str, entities: list[dict[str, Any]], request: dict[str, Any]) -> bool:
    """Assert model == Cedar; returns False when the generated policies do not validate."""
    if not cedarpy.validate_policies(text, SCHEMA_TEXT).validation_passed:
        return False
    pols = parse_text(text, "generated.cedar").policies
    cedar = authorize(request, pols, entities, SCHEMA_TEXT).to_json()
    model = evaluate(SCHEMA_MODEL, pols, request, entities)
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
