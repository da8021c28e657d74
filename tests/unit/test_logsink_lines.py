"""The file sink writes each decision line without a `LogRecord` (`logsinks._LineRotatingFileHandler`):
the files, their rotation points and contents are those of ``logging.Logger.info(line)`` through the
stdlib `RotatingFileHandler` with a ``"%(message)s"`` formatter, and a write error is reported the
same way (stderr, never raised into the request)."""

from __future__ import annotations

import logging
import logging.handlers
import random
from pathlib import Path

import pytest

from sidecar.logsinks import RotatingFileLogger


def stdlib_sink(path: Path, max_bytes: int, backups: int) -> logging.Logger:
    logger = logging.Logger(f"ref.{path}", level=logging.INFO)
    logger.propagate = False
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    return logger


@pytest.mark.parametrize("max_bytes, backups", [(0, 0), (700, 2), (2000, 3), (150, 1)])
def test_same_files_as_the_stdlib_rotating_handler(tmp_path: Path, max_bytes: int, backups: int) -> None:
    rnd = random.Random(max_bytes)
    lines = ['{"event":"decision","n":%d,"x":"%s"}' % (i, "é" * rnd.randrange(0, 200)) for i in range(120)]
    ours, ref = tmp_path / "ours" / "d.jsonl", tmp_path / "ref" / "d.jsonl"
    ref.parent.mkdir()
    sink = RotatingFileLogger(ours, max_bytes, backups)
    logger = stdlib_sink(ref, max_bytes, backups)
    for line in lines:
        sink.info(line)
        logger.info(line)
    names = sorted(p.name for p in ours.parent.iterdir())
    assert names == sorted(p.name for p in ref.parent.iterdir())
    if max_bytes:
        assert len(names) == backups + 1
    for name in names:
        assert (ours.parent / name).read_bytes() == (ref.parent / name).read_bytes()


def test_a_write_error_is_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sink = RotatingFileLogger(tmp_path / "d.jsonl", 0, 0)
    sink.info("first")

    class Full:
        def write(self, _: str) -> None:
            raise OSError(28, "No space left on device")

        def flush(self) -> None:
            pass

    sink._handler.stream = Full()  # type: ignore[assignment]
    sink.info("second")  # must not raise
    assert "No space left on device" in capsys.readouterr().err
