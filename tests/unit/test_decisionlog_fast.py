"""The decision log's per-line fast paths agree with what they replace:

- `decisionlog.IsoUtcStamper` writes the timestamp text of structlog's ``TimeStamper(fmt="iso", utc=True)``
  (kept here as the reference, on a given instant: ``datetime`` + ``isoformat`` + ``Z``);
- `logsinks._LineRotatingFileHandler._rolls_over` (one ``fstat``) rotates at the lines where the stdlib
  `RotatingFileHandler` rotates, on real files, also when the file is truncated, deleted, renamed or
  appended to by someone else, and never rotates what is not a regular file (a FIFO, ``/dev/null``, a path
  replaced by a directory).
"""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path
from typing import Callable

import pytest
import structlog
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar import decisionlog
from sidecar.decisionlog import IsoUtcStamper
from sidecar.logsinks import RotatingFileLogger
from tests.unit.test_logsink_lines import stdlib_sink  # the stdlib reference sink

# -- the timestamp ----------------------------------------------------------------------------------

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
LAST_NS = 253402300799_999_999_999  # 9999-12-31T23:59:59.999999999Z


def reference_stamp(ns: int) -> str:
    """structlog's ``stamper_iso_utc`` at the instant ``datetime.now`` gives for `ns` (floored to the µs)."""
    return (EPOCH + datetime.timedelta(microseconds=ns // 1000)).isoformat().replace("+00:00", "Z")


instants = st.integers(min_value=0, max_value=LAST_NS)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(instants, st.builds(lambda s, us: s * 10**9 + us * 1000, st.integers(0, 4 * 10**9),
                                               st.sampled_from([0, 1, 999999]))), min_size=1, max_size=20))
@example([1_764_682_377_000_000_000, 1_764_682_377_000_001_000, 1_764_682_377_999_999_999, 1_764_682_378_000_000_000])
@example([0, 999, 1000, LAST_NS])
def test_the_stamper_writes_structlogs_text(seq: list[int]) -> None:
    """One stamper over a sequence (its once-per-second text must not answer for another second)."""
    stamper = IsoUtcStamper()
    for ns in seq + seq[::-1]:
        assert stamper.at(ns) == reference_stamp(ns), ns


def test_the_live_stamp_is_between_two_of_structlogs() -> None:
    ref = structlog.processors.TimeStamper(fmt="iso", utc=True)
    ours = IsoUtcStamper()
    for _ in range(200):
        before = ref(None, "info", {})["timestamp"]
        event = ours(None, "info", {"a": 1})
        after = ref(None, "info", {})["timestamp"]
        assert list(event) == ["a", "timestamp"] and event["timestamp"].endswith("Z")
        parse = datetime.datetime.fromisoformat
        assert parse(before) <= parse(event["timestamp"]) <= parse(after)


def test_the_default_chain_uses_it() -> None:
    chain = decisionlog.processors()
    assert isinstance(chain[1], IsoUtcStamper)


# -- rotation ---------------------------------------------------------------------------------------


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _external_truncate(p: Path) -> None:  # logrotate copytruncate
    with open(p, "r+b") as f:
        f.truncate(0)


def _external_delete(p: Path) -> None:
    p.unlink()


def _external_rename(p: Path) -> None:  # logrotate create: moved aside, a new empty file at the path
    p.rename(p.with_name(p.name + ".moved"))
    p.touch()


def _external_append(p: Path) -> None:  # another process appending to the same file
    with open(p, "ab") as f:
        f.write(b'{"other":"writer"}\n' * 7)


@pytest.mark.parametrize("external", [None, _external_truncate, _external_delete, _external_rename, _external_append])
@pytest.mark.parametrize("max_bytes, backups", [(700, 2), (1500, 0), (333, 3), (50, 1)])
def test_rotates_at_the_stdlib_handlers_lines(tmp_path: Path, max_bytes: int, backups: int,
                                              external: Callable[[Path], None] | None) -> None:
    """Line by line, the same files with the same bytes as the stdlib handler, the same change made by
    someone else to both files every 17 lines (multi-byte characters: the rule adds characters to bytes)."""
    ours, ref = tmp_path / "ours" / "d.jsonl", tmp_path / "ref" / "d.jsonl"
    ref.parent.mkdir()
    sink, logger = RotatingFileLogger(ours, max_bytes, backups), stdlib_sink(ref, max_bytes, backups)
    for i in range(150):
        line = '{"event":"decision","n":%d,"x":"%s"}' % (i, "é" * ((i * 37) % 90))
        sink.info(line)
        logger.info(line)
        if external is not None and i % 17 == 16:
            for p in (ours, ref):
                if p.exists():
                    external(p)
        assert files(ours.parent) == files(ref.parent), i


def test_a_fifo_is_never_rotated_and_gets_every_line(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        sink = RotatingFileLogger(fifo, 10, 2)
        assert stat.S_ISFIFO(os.fstat(sink._handler.stream.fileno()).st_mode)
        for i in range(20):
            sink.info(f"line {i} " + "x" * 20)
        got = os.read(reader, 1 << 16).decode()
    finally:
        os.close(reader)
    assert got.splitlines() == [f"line {i} " + "x" * 20 for i in range(20)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_character_device_is_never_rotated() -> None:
    sink = RotatingFileLogger(Path("/dev/null"), 1, 3)
    for _ in range(3):
        sink.info("x" * 100)
        assert sink._handler._rolls_over("x" * 100 + "\n") is False
    assert not Path("/dev/null.1").exists()


def test_a_path_replaced_by_a_directory_is_not_rotated(tmp_path: Path) -> None:
    """The stdlib never rotates a path naming something other than a regular file; checked at the line
    that would rotate, the same answer."""
    ours, ref = tmp_path / "ours" / "d.jsonl", tmp_path / "ref" / "d.jsonl"
    ref.parent.mkdir()
    sink, logger = RotatingFileLogger(ours, 200, 2), stdlib_sink(ref, 200, 2)
    for i in range(30):
        if i == 2:
            for p in (ours, ref):
                p.unlink()
                p.mkdir()
        sink.info(f"line {i:03d} " + "y" * 30)
        logger.info(f"line {i:03d} " + "y" * 30)
    assert files(ours.parent) == files(ref.parent) == {}
    assert sorted(p.name for p in ours.parent.iterdir()) == ["d.jsonl"]


def test_each_line_is_in_the_file_when_the_call_returns(tmp_path: Path) -> None:
    """Flushed line by line: another reader sees every line as soon as `info` returns."""
    path = tmp_path / "d.jsonl"
    sink = RotatingFileLogger(path, 10**9, 1)
    for i in range(50):
        sink.info(f"l{i}")
        assert path.read_text().splitlines()[-1] == f"l{i}"


