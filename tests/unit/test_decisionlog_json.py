"""`sidecar.decisionlog.dumps` (the decision log's orjson serializer) writes what the standard library's
encoder would have meant: same parsed value for every event shape the log emits, a fallback for what
orjson refuses, and the structlog fallback handler for unknown objects."""

from __future__ import annotations

import json

import structlog

from sidecar.decisionlog import dumps


def test_same_value_as_the_standard_library_for_a_decision_event() -> None:
    event = {"event": "decision", "request_id": "ab" * 16, "principal": "Agent::\"t/red/a\"", "status": 200,
             "policies": ["p0", "p1"], "deny_policies": None, "row_deny_reasons": {"no_permit": 3},
             "row_ids": ["r1", "ü-id", "行"], "latency_us": 1234, "ok": True, "ratio": 0.25, "level": "info"}
    assert json.loads(dumps(event)) == json.loads(json.dumps(event))


def test_non_string_keys_and_big_integers_are_not_lost() -> None:
    assert json.loads(dumps({1: "a"})) == {"1": "a"}
    big = {"n": 2 ** 70}
    assert json.loads(dumps(big)) == big  # over 64 bits: the standard library writes it


def test_unknown_objects_go_through_structlogs_fallback() -> None:
    class Thing:
        def __repr__(self) -> str:
            return "<thing>"

    rendered = structlog.processors.JSONRenderer(serializer=dumps)(None, "info", {"event": "x", "obj": Thing()})
    assert json.loads(rendered) == {"event": "x", "obj": "<thing>"}


def test_the_renderer_writes_what_structlogs_renderer_writes() -> None:
    """`decisionlog.Renderer` (our own `fallback` for values JSON has no form for, no private attribute of
    structlog's renderer read anywhere) renders as ``JSONRenderer(serializer=dumps)`` with structlog's default."""
    from sidecar.decisionlog import Renderer

    class Thing:
        def __repr__(self) -> str:
            return "<thing>"

    class Own:
        def __structlog__(self) -> str:
            return "own"

    for event in ({"event": "x", "obj": Thing()}, {"event": "x", "obj": Own(), "n": 2 ** 70, 1: [1.5, None]}):
        theirs = structlog.processors.JSONRenderer(serializer=dumps)(None, "info", dict(event))
        assert Renderer()(None, "info", dict(event)) == theirs
