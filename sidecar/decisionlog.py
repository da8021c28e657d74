"""Stage 8 — record: one structured JSON decision-log event per request (structlog).

Fields: request_id, principal, operation, action, resource, decision, policies (determining ids),
rows_allowed, rows_denied, row_ids (at most 20), status, latency_us, stripped_headers.
Memory content, query text and keys are never logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import structlog

from sidecar import logsinks
from sidecar.exchange import Exchange

_configured = False


def configure(level: str = "INFO", sink: str = "stdout", path: Path | None = None,
              max_bytes: int = 100 * 1024 * 1024, backups: int = 5, mask: tuple[str, ...] = ()) -> None:
    """Configure structlog once per process: JSON lines to `sink` (see `sidecar.logsinks`), `mask`ed fields."""
    global _configured
    if _configured:
        return
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *([logsinks.MaskFields(mask)] if mask else []),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping().get(level.upper(), logging.INFO)),
        logger_factory=logsinks.logger_factory(sink, path, max_bytes, backups),
        cache_logger_on_first_use=True,
    )
    _configured = True


def record(ex: Exchange, status: int) -> None:
    """Emit the decision event for a finished exchange."""
    structlog.get_logger("memwarden.decision").info(
        "decision",
        request_id=ex.request_id,
        principal=ex.principal.describe() if ex.principal else None,
        method=ex.method,
        operation=ex.operation,
        action=ex.action,
        resource=ex.resource,
        decision=ex.decision,
        policies=sorted(ex.policies),
        rows_allowed=ex.rows_allowed,
        rows_denied=ex.rows_denied,
        row_ids=ex.row_ids[:20],
        status=status,
        latency_us=ex.elapsed_us(),
        stripped_headers=ex.stripped_headers or None,
    )
