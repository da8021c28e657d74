"""Decision-log sinks for structlog: stdout (default) or a size-rotated file; optional field masking.

`logger_factory(sink, path, max_bytes, backups)` returns a structlog logger factory;
`MaskFields(names)` is a processor replacing the values of the named event fields by
``"mask:" + HMAC-SHA256(per-process random key, value)[:16]`` (lists element-wise), so masked
values still correlate within one process's log but cannot be reversed by guessing.
Rotation: stdlib `logging.handlers.RotatingFileHandler` (rotate above `max_bytes` bytes, keep
`backups` files ``path.1`` … ``path.N``); each line is flushed as it is written.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import logging.handlers
import os
import sys
from pathlib import Path
from typing import Any, Callable, MutableMapping

import structlog

_MASK_KEY = os.urandom(32)


class MaskFields:
    """structlog processor: mask the values of `names` (never the event name or level)."""

    def __init__(self, names: list[str] | tuple[str, ...]) -> None:
        self.names = frozenset(n for n in names if n and n not in ("event", "level", "timestamp"))

    @staticmethod
    def _mask(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return [MaskFields._mask(v) for v in value]
        digest = hmac.new(_MASK_KEY, str(value).encode("utf-8"), hashlib.sha256).hexdigest()[:16]
        return f"mask:{digest}"

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for name in self.names & event.keys():
            event[name] = self._mask(event[name])
        return event


class RotatingFileLogger:
    """A structlog-compatible logger writing each rendered line to a rotating file."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._logger = logging.Logger(f"memwarden.sink.{path}", level=logging.INFO)
        self._logger.propagate = False
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger.addHandler(handler)

    def msg(self, message: str) -> None:
        self._logger.info(message)

    log = debug = info = warn = warning = err = error = critical = exception = failure = fatal = msg


def logger_factory(sink: str = "stdout", path: Path | None = None, max_bytes: int = 100 * 1024 * 1024,
                   backups: int = 5) -> Callable[..., Any]:
    """A structlog logger factory for `sink` (``stdout`` or ``file``). Raises ValueError otherwise."""
    if sink == "stdout":
        return structlog.PrintLoggerFactory(file=sys.stdout)
    if sink == "file":
        if path is None:
            raise ValueError("the file sink needs a path (MEMWARDEN_DECISION_LOG_PATH)")
        shared = RotatingFileLogger(Path(path), max_bytes, backups)
        return lambda *args: shared
    raise ValueError(f"unknown decision-log sink {sink!r} (stdout or file)")
