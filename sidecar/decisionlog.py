"""Stage 8 — record: one structured JSON decision-log event per request (structlog).

Fields: request_id, principal, operation, action, resource, decision, policies (determining ids),
rows_allowed, rows_denied, row_ids (at most 20), status, latency_us, stripped_headers.
Memory content, query text and keys are never logged.
"""

from __future__ import annotations

import logging
import sys

import structlog

from sidecar.exchange import Exchange

_configured = False


def configure(level: str = "INFO") -> None:
    global _configured
    if _configured:
        return
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping().get(level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
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
