"""`decisionlog.writer` runs the default processor chain fused (`decisionlog._fused`): one function setting
``event``, ``level`` and ``timestamp``, masking and rendering, instead of four processor calls. It must write
the bytes structlog's bound logger writes through that same chain (`decisionlog.processors`, with the real
`IsoUtcStamper` and `MaskFields`) for ``info("decision", **fields)``: the same keys in the same order, the
same values, the same masking, the same JSON (orjson, the standard library encoder for what orjson
refuses) or the same exception, over Hypothesis-generated events (non-ASCII and lone surrogates, integers over 64 bits, floats,
nested lists and dicts, keys that collide with ``level``/``timestamp``); and any other chain is run
processor by processor, as before."""

from __future__ import annotations

import logging
import time
from typing import Any
from unittest import mock

import pytest
import structlog
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar import decisionlog, logsinks

NS = 1_764_682_377_123_456_789  # the clock both writers read


class Lines:
    """A sink logger that keeps what it is given."""

    def __init__(self) -> None:
        self.lines: list[Any] = []

    def info(self, message: Any) -> None:
        self.lines.append(message)


scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),  # over 64 bits: the standard library encoder
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(), st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3),  # lone surrogates
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)), max_leaves=12)
names = st.one_of(st.sampled_from(["request_id", "principal", "row_ids", "resource", "level", "timestamp",
                                   "stripped_headers", "policies"]), st.text(max_size=8))
events = st.dictionaries(names.filter(lambda k: k != "event"), values, max_size=12)
masks = st.sampled_from([(), ("principal", "row_ids", "resource", "stripped_headers"), ("level", "timestamp", "policies")])


def reference_line(chain: list[Any], fields: dict[str, Any]) -> Any:
    """What structlog's bound logger writes for ``info("decision", **fields)`` through `chain`."""
    sink = Lines()
    bound = structlog.wrap_logger(sink, processors=chain, wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    bound.info("decision", **fields)
    assert len(sink.lines) == 1
    return sink.lines[0]


@pytest.fixture()
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: NS)


@settings(max_examples=400, deadline=None)
@given(fields=events, mask=masks)
@example(fields={"row_ids": ["é", "\ud800", 2**64], "level": 1, "principal": None, "x": [1.5e300, -0.0]},
         mask=("principal", "row_ids"))
@example(fields={"rows_allowed": 2**70, "policies": ["b", "a"]}, mask=())
def test_fused_writer_writes_structlogs_bytes(fields: dict[str, Any], mask: tuple[str, ...]) -> None:
    ours = Lines()
    with mock.patch.object(time, "time_ns", lambda: NS):
        write = decisionlog.writer(decisionlog.processors(mask), ours)
        expected = outcome(lambda: reference_line(decisionlog.processors(mask), dict(fields)))
        got = outcome(lambda: write(dict(fields)) or ours.lines[0])
    assert got == expected  # the same line (or the same exception)
    assert not isinstance(expected, str) or ours.lines == [expected]


def outcome(f: Any) -> Any:
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - compared, not swallowed
        return (type(e), str(e))


def test_the_default_chain_is_fused_and_others_are_not() -> None:
    sink = Lines()
    assert decisionlog._fused(decisionlog.processors(), sink) is not None
    assert decisionlog._fused(decisionlog.processors(("principal",)), sink) is not None
    # Any other shape runs processor by processor (the general loop).
    custom = [structlog.processors.add_log_level, lambda _l, _m, e: {**e, "timestamp": "t"},
              structlog.processors.JSONRenderer(serializer=decisionlog.dumps)]
    assert decisionlog._fused(custom, sink) is None
    other_renderer = [*decisionlog.processors()[:-1], structlog.processors.JSONRenderer()]
    assert decisionlog._fused(other_renderer, sink) is None
    sort_keys = [*decisionlog.processors()[:-1], structlog.processors.JSONRenderer(serializer=decisionlog.dumps, sort_keys=True)]
    assert decisionlog._fused(sort_keys, sink) is None
    decisionlog.writer(custom, sink)({"a": 1})
    assert sink.lines == ['{"a":1,"event":"decision","level":"info","timestamp":"t"}']


def test_fused_writer_on_the_file_sink(tmp_path: Any, fixed_clock: None) -> None:
    """The configured shape: the file sink's logger (its methods are the handler's `write_line`)."""
    path = tmp_path / "d.jsonl"
    sink = logsinks.logger_factory("file", path, 10**9, 1)("memwarden.decision")
    assert sink.info == sink._handler.write_line
    decisionlog.writer(decisionlog.processors(("principal",)), sink)({"principal": "Agent::t/f/a", "n": 2**70})
    expected = reference_line(decisionlog.processors(("principal",)), {"principal": "Agent::t/f/a", "n": 2**70})
    assert path.read_text(encoding="utf-8") == expected + "\n"
