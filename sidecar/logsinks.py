"""Decision-log sinks for structlog: stdout (default) or a size-rotated file; optional field masking.

`logger_factory(sink, path, max_bytes, backups)` returns a structlog logger factory;
`MaskFields(names)` is a processor replacing the values of the named event fields by
``"mask:" + HMAC-SHA256(per-process random key, value)[:16]`` (lists element-wise), so masked
values still correlate within one process's log but cannot be reversed by guessing.
Rotation: stdlib `logging.handlers.RotatingFileHandler` (rotate above `max_bytes` bytes, keep
`backups` files ``path.1`` … ``path.N``); each line is flushed as it is written. A file deleted or
renamed by someone else (logrotate) is written on until it reaches `max_bytes`, then a new file is opened
at the path; a truncated one (``copytruncate``) is measured as it is now (see
`_LineRotatingFileHandler._rolls_over`). The stdout sink writes each line in one ``write`` call
(`LinePrintLogger`).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import logging.handlers
import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any, Callable, MutableMapping


_MASK_KEY = os.urandom(32)


class MaskFields:
    """structlog processor: mask the values of `names` (never the event name or level).

    A value is replaced by ``mask:`` + the first 16 hex digits of HMAC-SHA256 (a random per-process key)
    of its text's UTF-8 bytes; a lone surrogate (possible in a row id a backend sent as ``"\\ud800"``) is
    encoded with ``surrogatepass``, so such a value is masked too instead of failing the event (a text
    without one hashes the bytes it always did; texts with and without surrogates never share bytes)."""

    def __init__(self, names: list[str] | tuple[str, ...]) -> None:
        self.names = frozenset(n for n in names if n and n not in ("event", "level", "timestamp"))

    @staticmethod
    def _mask(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return [MaskFields._mask(v) for v in value]
        digest = hmac.new(_MASK_KEY, str(value).encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]
        return f"mask:{digest}"

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for name in self.names & event.keys():
            event[name] = self._mask(event[name])
        return event


class _LineRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """`RotatingFileHandler` writing a rendered line without a `LogRecord`: the same rollover rule
    (`shouldRollover`: never a non-regular file; rotate when the line would reach `maxBytes`), the same
    lock, write and flush, and the same error handling (`handleError`, so a full disk never fails the
    request) as ``Logger.info(line)`` through a ``"%(message)s"`` formatter, without the logger's caller
    lookup, record and formatter (most of the cost of a decision event on the file sink)."""

    def write_line(self, line: str) -> None:
        if logging.root.manager.disable >= logging.INFO:  # logging.disable(), as Logger.info honours it
            return
        text = line + self.terminator
        with self.lock:  # `Handler.acquire`/`release` (the handler's RLock), as a context manager
            try:
                stream = self.stream
                if stream is None or self.maxBytes > 0:  # `_rolls_over` opens the stream when there is none
                    if self._rolls_over(text):
                        self.doRollover()
                    stream = self.stream
                    if stream is None:
                        stream = self.stream = self._reopen()
                stream.write(text)
                stream.flush()  # each line reaches the OS before the call returns (Handler.flush, under our lock)
            except Exception:
                self.handleError(logging.LogRecord(self.name or "memwarden.sink", logging.INFO, __file__, 0, line, None, None))

    def _rolls_over(self, text: str) -> bool:
        """`RotatingFileHandler.shouldRollover` (CPython 3.11/3.12) on the formatted `text`, with one
        ``lseek`` of the open file instead of two ``stat`` of the path and a seek and tell: rotate when the
        file's size plus ``len(text)`` reaches `maxBytes` (``maxBytes`` 0: never). The size is the open
        file's now, its end as ``seek(0, 2)`` finds it (every line is flushed: nothing is buffered; the file
        is opened for appending, as `RotatingFileHandler` opens it whenever ``maxBytes`` > 0, so moving its
        offset moves no write), so lines appended by another process and a truncation (``copytruncate``)
        count as they did. Never a non-regular file: the open file is not rotated when it is not one
        (``/dev/stdout`` as the path: a pipe, a terminal; found by one ``fstat`` per opened file, as the type
        of an open file never changes), and, as the stdlib checks, the path is not rotated when it names
        something that is not a regular file — that path check made only at a rotation point, not for every
        line. A path deleted or renamed by someone else is written on (the open file) until its size reaches
        `maxBytes`, then `doRollover` opens a new file at the path (the stdlib's behaviour). Raises OSError
        (reported by `write_line` through `handleError`)."""
        if self.maxBytes <= 0:
            return False
        if self.stream is None:
            self.stream = self._reopen()
        stream = self.stream
        kind = self._kind
        if kind is None or kind[0] is not stream:
            fd = stream.fileno()
            mode = os.fstat(fd).st_mode
            kind = self._kind = (stream, stat.S_ISREG(mode), bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND))
        if not kind[1]:
            return False
        # The descriptor asked of the stream each time (ValueError once the stream is closed, as before).
        if kind[2]:  # appending: the end is the size, and moving the offset there moves no write
            size = os.lseek(stream.fileno(), 0, os.SEEK_END)
        else:
            size = os.fstat(stream.fileno()).st_size
        if size + len(text) < self.maxBytes:
            return False
        return not (os.path.exists(self.baseFilename) and not os.path.isfile(self.baseFilename))

    def _reopen(self) -> Any:
        """The handler's file opened as `logging.FileHandler` opens it (its public ``baseFilename``, ``mode``,
        ``encoding`` and ``errors``; the handler's own opener is private)."""
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors)

    # (the stream, whether it is a regular file, whether it was opened to append), found once per stream opened
    _kind: tuple[Any, bool, bool] | None = None


class RotatingFileLogger:
    """A structlog-compatible logger writing each rendered line to a rotating file."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._logger = logging.Logger(f"memwarden.sink.{path}", level=logging.INFO)
        self._logger.propagate = False
        handler = _LineRotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger.addHandler(handler)
        self._handler = handler
        # Every method name structlog may call is the handler's `write_line` itself, bound on the instance
        # (no forwarding call per line); the class's `msg` below is the same thing for the type checker.
        for name in _METHODS:
            setattr(self, name, handler.write_line)

    def msg(self, message: str) -> None:
        """Write the rendered `message` as one line (`_LineRotatingFileHandler.write_line`)."""
        self._handler.write_line(message)

    log = debug = info = warn = warning = err = error = critical = exception = failure = fatal = msg


_METHODS = ("msg", "log", "debug", "info", "warn", "warning", "err", "error", "critical", "exception", "failure", "fatal")


_FILE_LOCKS: dict[int, threading.Lock] = {}  # one lock per file written to (by id; 0: the current sys.stdout)
_FILE_LOCKS_GUARD = threading.Lock()


def _lock_for(file: Any) -> threading.Lock:
    key = 0 if file is None else id(file)
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(key, threading.Lock())


class LinePrintLogger:
    """A structlog logger (any object with the level methods) writing each rendered line to `file` in one
    ``write`` call — the message and its newline as one string, then ``flush()`` — under a lock per file, the
    bytes ``print(message, file=file, flush=True)`` writes (structlog's `PrintLogger`), which an unbuffered
    stdout (``PYTHONUNBUFFERED=1``, ``python -u``) turns into two system calls per line. `file` None: the
    interpreter's ``sys.stdout`` at each call (nothing is written while it is None)."""

    def __init__(self, file: Any = None) -> None:
        self._file = file
        self._lock = _lock_for(file)

    def msg(self, message: str) -> None:
        """Write `message` and a newline in one call, then flush."""
        f = self._file if self._file is not None else sys.stdout
        text = (message if type(message) is str else str(message)) + "\n"
        with self._lock:
            if f is None:
                return
            f.write(text)
            f.flush()

    log = debug = info = warn = warning = err = error = critical = exception = failure = fatal = msg


class LinePrintLoggerFactory:
    """A structlog logger factory making `LinePrintLogger` objects (a new one per call, on `file`; None: the
    current ``sys.stdout`` at each write)."""

    def __init__(self, file: Any = None) -> None:
        self._file = file

    def __call__(self, *args: Any) -> LinePrintLogger:
        return LinePrintLogger(self._file)


def logger_factory(sink: str = "stdout", path: Path | None = None, max_bytes: int = 100 * 1024 * 1024,
                   backups: int = 5) -> Callable[..., Any]:
    """A structlog logger factory for `sink` (``stdout`` or ``file``). Raises ValueError otherwise."""
    if sink == "stdout":
        return LinePrintLoggerFactory()  # the current sys.stdout at each write, as structlog's own
    if sink == "file":
        if path is None:
            raise ValueError("the file sink needs a path (MEMWARDEN_DECISION_LOG_PATH)")
        shared = RotatingFileLogger(Path(path), max_bytes, backups)
        return lambda *args: shared
    raise ValueError(f"unknown decision-log sink {sink!r} (stdout or file)")
