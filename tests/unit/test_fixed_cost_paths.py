"""The per-request paths made cheaper in issue #17's fixed-cost round agree with the code they replace
(`tests/unit/fixed_cost_paths_reference.py`):

- `canonical_headers` (decode, then `str.isprintable`) and `canonical_path` (``bytes.translate``) give the
  results and errors of their regular-expression versions;
- `Metrics.observe_cedar_one` / `observe_cedar` / `observe_exchange` (bound label children) give the exposition
  text of the previous code, for any duration (NaN, infinities, negatives, bucket bounds included);
- `LinePrintLogger` writes the bytes `PrintLogger` prints, in one ``write`` per line;
- `_LineRotatingFileHandler._rolls_over` (``lseek``) decides as the ``fstat`` version, also after other
  writers appended to or truncated the file.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit import fixed_cost_paths_reference as ref
from sidecar import logsinks
from sidecar.errors import BadRequest
from sidecar.metrics import Metrics
from sidecar.stages import canonicalize as c

# -- canonical headers and path -----------------------------------------------------------------------


def _answer(fn: Any, arg: Any) -> Any:
    try:
        return ("ok", fn(arg))
    except BadRequest as exc:
        return ("BadRequest", str(exc))
    except Exception as exc:  # the same exception type for what is not a list of byte pairs
        return ("raised", type(exc).__name__)


header_names = st.one_of(
    st.sampled_from([b"host", b"Content-Type", b"content-length", b"X-API-Key", b"authorization", b"X-Forwarded-For",
                     b"x-envoy-x", b"X-Memwarden-Agent", b"forwarded", b"x-http-method-override", b"X-Method-Override",
                     b"x-tenant-id", b"x", b"X", b"x-", b"a b", b"x\tb", b"x\x00", b"\x7f", b"caf\xc3\xa9", b"\xff",
                     b"\xc2\x85", b"x-forwarded"]),
    st.binary(max_size=6), st.text(max_size=5).map(lambda t: t.encode("utf-8", "surrogatepass")))
header_values = st.one_of(
    st.sampled_from([b"", b"1", b" 1 ", b"application/json", b"chunked", b"a\tb", b"a\nb", b"\x00", b"\x7f", b"caf\xc3\xa9",
                     b"\xc3", b"\xed\xa0\x80", b"\xf0\x9f\x98\x80", b"\xc2\x85", b"\xc2\xa0", b"\xe2\x80\xa8", b"\x1b[0m"]),
    st.binary(max_size=8), st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass")))
header_lists = st.lists(st.tuples(header_names, header_values), max_size=8)


@settings(max_examples=4000, deadline=None)
@given(header_lists)
@example([(b"x-a", b"\t"), (b"x-http-method-override", b"GET")])
@example([(b"x-http-method-override", b"GET"), (b"x-a", b"\x01")])
@example([(b"X-Forwarded-For", b"1"), (b"x-forwarded", b"2"), (b"x", b"3")])
def test_canonical_headers_answers_as_the_regex_version(raw: list[tuple[bytes, bytes]]) -> None:
    assert _answer(c.canonical_headers, raw) == _answer(ref.canonical_headers, raw)
    assert _answer(c.canonical_headers, raw) == _answer(c._reference_headers, raw)


def test_canonical_headers_on_what_is_not_byte_pairs() -> None:
    for raw in ([("host", "x")], [(b"host",)], [None], [(bytearray(b"Host"), bytearray(b"x"))],
                [(memoryview(b"host"), b"x")], [(b"host", 1)]):
        assert _answer(c.canonical_headers, raw) == _answer(ref.canonical_headers, raw)


def test_identity_prefixes_begin_with_x() -> None:  # what canonical_headers' first-letter test relies on
    assert all(p.startswith("x") for p in c.IDENTITY_HEADER_PREFIXES)


path_bytes = st.one_of(
    st.lists(st.one_of(st.sampled_from([".", "..", "", "a", "api", ".a", "a.", "...", "%2e", "%2F", "x;y", "~", "-_."]),
                       st.text(alphabet="abcXYZ019._~-%2fF;:@!$/", max_size=6)), min_size=1, max_size=6)
    .map(lambda segs: ("/" + "/".join(segs)).encode()),
    st.binary(max_size=12), st.binary(max_size=8).map(lambda b: b"/" + b))


@settings(max_examples=4000, deadline=None)
@given(path_bytes)
@example(b"/.well-known/x")
@example(b"/a/./b")
@example(b"/a//b")
@example(b"a/b")
@example(b"/\x7f")
@example(b"/\xc3\xa9")
def test_canonical_path_answers_as_the_regex_version(raw: bytes) -> None:
    assert _answer(c.canonical_path, raw) == _answer(ref.canonical_path, raw)


def test_canonical_path_on_other_byte_types() -> None:
    for raw in (bytearray(b"/a/b"), memoryview(b"/a/b"), "/a/b"):
        assert _answer(c.canonical_path, raw) == _answer(ref.canonical_path, raw)


# -- metrics ------------------------------------------------------------------------------------------


def _finished(operation: str, action: str | None, decision: str | None, rows: int, us: Any) -> Any:
    """A finished exchange as `observe_exchange` reads it, `us` microseconds long."""
    return SimpleNamespace(operation=operation, action=action, decision=decision, rows_allowed=rows, rows_denied=0,
                           rows_hidden_superseded=0, rows_hidden_deleted=0, rows_unknown=0, rows_malformed=rows,
                           elapsed_us=lambda: us)


def exposition(m: Metrics) -> str:
    return "\n".join(line for line in m.render().decode().splitlines() if "_created" not in line)


durations = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, -0.0, 5e-05, 0.0001, 0.00025, 0.0005, 0.001, 1.0, 10.0, 5e-05 * (1 + 1e-15), float("nan"), float("-inf")]),
    st.integers(-3, 3))
actions = st.sampled_from(["list", "search", "read", "write"])
cedar_events = st.lists(st.one_of(
    st.tuples(st.just("one"), actions, st.one_of(st.booleans(), st.sampled_from([0, 1, None, "", "x"])), durations),
    st.tuples(st.just("batch"), st.lists(st.tuples(actions, st.booleans()), max_size=4), st.none(), durations),
    st.tuples(st.just("exchange"), st.tuples(st.sampled_from(["get", "query"]), st.sampled_from([None, "read"]),
                                             st.sampled_from([None, "allow", "deny"]), st.integers(0, 2)),
              st.sampled_from([200, 403]), st.one_of(st.integers(0, 10**7), st.integers(-5, 0)))), max_size=25)


@settings(max_examples=500, deadline=None)
@given(cedar_events)
def test_metrics_count_what_the_previous_code_counted(events: list[Any]) -> None:
    new, old = Metrics(), Metrics()
    for kind, a, b, d in events:
        if kind == "one":
            new.observe_cedar_one(a, b, d)
            ref.observe_cedar(old, [a], [bool(b)], d)
        elif kind == "batch":
            new.observe_cedar([x for x, _ in a], [y for _, y in a], d)
            ref.observe_cedar(old, [x for x, _ in a], [y for _, y in a], d)
        else:
            ex = _finished(*a, us=d)
            new.observe_exchange(ex, b)
            ref.observe_exchange(old, ex, b)
    assert exposition(new) == exposition(old)


# -- the stdout sink ----------------------------------------------------------------------------------


class Counting(io.StringIO):
    writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=5))
def test_line_print_logger_writes_the_printed_bytes_in_one_write(lines: list[str]) -> None:
    import structlog

    new_file, old_file = Counting(), Counting()
    new, old = logsinks.LinePrintLogger(new_file), structlog.PrintLogger(old_file)
    for line in lines:
        new.info(line)
        ref.print_logger_msg(old, line)
    assert new_file.getvalue() == old_file.getvalue()
    assert new_file.writes == len(lines)


def test_line_print_logger_writes_to_the_current_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    factory = logsinks.logger_factory("stdout")
    logger = factory("memwarden.decision")
    assert type(logger) is logsinks.LinePrintLogger
    logger.msg('{"a":1}')
    assert capsys.readouterr().out == '{"a":1}\n'


def test_line_print_logger_without_a_file_follows_sys_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logsinks.LinePrintLogger()  # no file: whatever sys.stdout is at the call
    out = Counting()
    monkeypatch.setattr(sys, "stdout", out)
    logger.msg("x")
    assert out.getvalue() == "x\n" and out.writes == 1
    monkeypatch.setattr(sys, "stdout", None)
    logger.msg("y")  # print(file=None) with no stdout: nothing, no error


# -- the file sink's rotation test --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["line", "append", "truncate"]), st.integers(0, 40)), max_size=12),
       st.integers(0, 120))
def test_rolls_over_decides_as_the_fstat_version(tmp_path_factory: Any, steps: list[tuple[str, int]], limit: int) -> None:
    path = Path(tmp_path_factory.mktemp("rot")) / "d.jsonl"
    handler = logsinks._LineRotatingFileHandler(path, maxBytes=limit, backupCount=2, encoding="utf-8")
    try:
        for kind, n in steps:
            if kind == "append":
                with open(path, "a") as other:
                    other.write("o" * n)
            elif kind == "truncate":
                os.truncate(path, min(n, os.path.getsize(path)))
            else:
                text = "x" * n + "\n"
                assert handler._rolls_over(text) == ref.rolls_over(handler, text)
                handler.write_line("x" * n)
    finally:
        handler.close()


def test_rolls_over_never_rotates_a_non_regular_file(tmp_path: Path) -> None:
    handler = logsinks._LineRotatingFileHandler(tmp_path / "d.jsonl", maxBytes=1, backupCount=2, encoding="utf-8")
    try:
        handler.stream.close()
        handler.stream = open(os.devnull, "a", encoding="utf-8")
        assert handler._rolls_over("long line\n") is False
        assert ref.rolls_over(handler, "long line\n") is False
    finally:
        handler.close()


# -- the credential -----------------------------------------------------------------------------------

credential_values = st.lists(st.sampled_from(["k", " k ", "", " ", "Bearer k", "bearer  k", "Basic k", "Bearer", "k2",
                                              "Bearer k2", "\tk", "k\u00a0"]), max_size=3)


@settings(max_examples=1500, deadline=None)
@given(st.dictionaries(st.sampled_from(["authorization", "x-api-key", "host"]), credential_values, max_size=3))
@example({"x-api-key": [" k "]})
@example({"x-api-key": ["k"], "authorization": []})
@example({"x-api-key": ["k"], "authorization": ["Bearer k2"]})
def test_credential_answers_as_before(headers: dict[str, list[str]]) -> None:
    from sidecar.errors import Unauthorized

    def answer(fn: Any) -> Any:
        try:
            return ("ok", fn(headers))
        except Unauthorized as exc:
            return ("Unauthorized", str(exc))
    assert answer(c.credential) == answer(ref.credential)
