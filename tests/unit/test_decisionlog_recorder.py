"""`decisionlog.recorder` writes the decision event of an exchange without the event dict of `fields` (the
request id, a kept JSON run of the request-level fields, then the rest): the line must be the one
``writer(chain, sink)(fields(ex, status, policy_sha256, mode))`` writes (the reference, as `record` wrote it
before), byte for byte, or the same exception — over Hypothesis-generated exchanges (non-ASCII and lone
surrogates, integers over 64 bits, values equal but of other types: ``1``, ``True``, ``1.0``, a ``str``
subclass, unhashable values, other principals), each written several times (the kept runs reused), in
enforce and shadow mode, with and without masking; and `record` uses it only while `_write` is the writer
`configure` made with it."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import decisionlog
from sidecar.exchange import Exchange
from sidecar.governance import Principal

NS, PERF = 1_764_682_377_123_456_789, 10_000_000_000


class Lines:
    def __init__(self) -> None:
        self.lines: list[Any] = []

    def info(self, message: Any) -> None:
        self.lines.append(message)


class S(str):
    pass


texts = st.one_of(st.text(max_size=8), st.sampled_from(["", "é", "\ud800", "a\"b", "\\", "1", "True"]))
odd = st.sampled_from([1, True, 1.0, 0, False, S("get"), S("1"), 2 ** 70, ["x"], ("x",), {"a": 1}, b"x", object()])
field_values = st.one_of(st.none(), texts, texts, odd)
principals = st.one_of(
    st.none(),
    st.builds(Principal, kind=st.sampled_from(["agent", "admin", "operator"]), key_id=st.one_of(texts, st.sampled_from([1, True, 1.0])),
              tenant=texts, fleet=st.one_of(st.none(), texts), agent=st.one_of(st.none(), texts), trust=st.integers(0, 3)),
    st.builds(lambda d: SimpleNamespace(describe=lambda: d), st.one_of(texts, st.sampled_from([1, True]))),
)
counts = st.one_of(st.integers(0, 5), st.sampled_from([2 ** 64, 2 ** 70, True, 1.5]))
str_lists = st.lists(texts, max_size=110)
reasons = st.dictionaries(texts, st.one_of(st.integers(0, 5), st.just(2 ** 70)), max_size=3)


@st.composite
def exchanges(draw: Any) -> Exchange:
    ex = Exchange(method=draw(st.one_of(st.sampled_from(["GET", "POST"]), field_values)),
                  raw_path=draw(st.one_of(st.just("/x"), texts, st.just("/" + "p" * 1100), odd)))
    ex.request_id = draw(st.one_of(st.just("0123456789abcdef0123456789abcdef"), texts, odd))
    ex.principal = draw(principals)
    ex.client = draw(st.one_of(st.none(), st.just("127.0.0.1:5000"), texts, odd))
    ex.auth = draw(st.one_of(st.sampled_from(["none", "x-api-key", "authorization"]), field_values))
    ex.actions = draw(st.lists(st.sampled_from(["list", "read", "é"]), max_size=3))
    ex.denied_row_ids = draw(str_lists)
    for name in ("key_id", "operation", "action", "deny_action", "resource", "decision", "reason"):
        setattr(ex, name, draw(st.one_of(st.none(), st.sampled_from(["get", "list", "allow", "k1", "r"]), field_values)))
    ex.policies = set(draw(st.lists(st.sampled_from(["p1", "p2", "é"]), max_size=3)))
    ex.deny_policies = set(draw(st.lists(st.sampled_from(["f1", "f2"]), max_size=2)))
    ex.evaluation_errors = draw(st.lists(texts, max_size=2))
    for name in ("rows_allowed", "rows_denied", "rows_hidden_superseded", "rows_hidden_deleted", "rows_unknown", "would_deny"):
        setattr(ex, name, draw(counts))
    ex.row_deny_reasons = draw(reasons)
    ex.would_deny_reasons = draw(reasons)
    ex.row_ids = draw(str_lists)
    ex.would_deny_row_ids = draw(st.lists(texts, max_size=3))
    ex.stripped_headers = draw(st.lists(st.sampled_from(["authorization", "x-chroma-token"]), max_size=2))
    ex.started_ns = PERF - draw(st.integers(0, 10 ** 9))
    return ex


calls = st.tuples(exchanges(), st.one_of(st.sampled_from([200, 403, 500]), st.sampled_from([True, 200.0, 1])),
                  st.one_of(st.none(), st.just("ab" * 32), odd), st.one_of(st.sampled_from(["enforce", "shadow", "shadow-all"]), odd))


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        fn(*args)
        return "ok", None
    except Exception as exc:  # the same exception type as the reference
        return "raised", type(exc)


@pytest.mark.parametrize("mask", [(), ("principal", "row_ids")])
@settings(max_examples=400, deadline=None)
@given(st.lists(calls, min_size=1, max_size=6), st.integers(1, 3))
def test_same_lines_as_the_event_dict(mask: tuple[str, ...], sequence: list[Any], repeat: int) -> None:
    chain = decisionlog.processors(mask)
    ref_sink, new_sink = Lines(), Lines()
    with mock.patch("time.time_ns", return_value=NS), mock.patch("time.perf_counter_ns", return_value=PERF):
        ref = decisionlog.writer(chain, ref_sink)  # made under the fixed clock: they keep ``time.time_ns``
        new = decisionlog.recorder(chain, new_sink)
        for ex, status, sha, mode in itertools.chain.from_iterable(itertools.repeat(sequence, repeat)):
            a = outcome(lambda: ref(decisionlog.fields(ex, status, sha, mode)))
            b = outcome(new, ex, status, sha, mode)
            assert a == b
    assert new_sink.lines == ref_sink.lines


def test_record_uses_the_recorder_only_with_its_own_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(decisionlog, "_write", seen.append)  # a test's writer: given the event dict, as before
    ex = Exchange(method="GET", raw_path="/")
    decisionlog.record(ex, 200)
    assert len(seen) == 1 and seen[0]["request_id"] == ex.request_id
    sink = Lines()
    write = decisionlog.writer(decisionlog.processors(), sink)
    monkeypatch.setattr(decisionlog, "_write", write)
    monkeypatch.setattr(decisionlog, "_record", decisionlog.recorder(decisionlog.processors(), sink, write))
    monkeypatch.setattr(decisionlog, "_record_of", write)
    decisionlog.record(ex, 200, policy_sha256="ab" * 32)
    assert len(sink.lines) == 1 and ex.request_id in sink.lines[0]


def test_equal_keys_of_other_types_are_not_confused() -> None:
    """200, 200.0 and True == 1 as the status, an operator key id 1 / True / "1": equal keys, other JSON."""
    sink_ref, sink_new = Lines(), Lines()
    with mock.patch("time.time_ns", return_value=NS), mock.patch("time.perf_counter_ns", return_value=PERF):
        ref, new = decisionlog.writer(decisionlog.processors(), sink_ref), decisionlog.recorder(decisionlog.processors(), sink_new)
        for status in (200, 200.0, 1, True, 1.0, 200):
            for key_id in ("1", 1, True, 1.0, "1"):
                ex = Exchange(method="GET", raw_path="/", request_id="r")
                ex.started_ns = PERF
                ex.principal = Principal(kind="operator", key_id=key_id, tenant="")  # type: ignore[arg-type]
                ex.key_id = key_id  # type: ignore[assignment]
                ref(decisionlog.fields(ex, status, None, "enforce"))  # type: ignore[arg-type]
                new(ex, status, None, "enforce")  # type: ignore[arg-type]
    assert sink_new.lines == sink_ref.lines and len(sink_new.lines) == 30
