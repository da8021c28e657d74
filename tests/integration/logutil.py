"""Reading a sidecar's decision log (the JSON-lines file sink) in integration tests."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

# Every decision event carries these fields (sidecar/decisionlog.py, docs/decision-log.md: schema version 1).
FIELDS = {"schema_version", "request_id", "client", "path", "auth", "principal", "key_id", "method", "operation",
          "action", "deny_action", "resource", "decision", "reason", "status", "mode", "policy_sha256", "actions",
          "policies", "deny_policies", "evaluation_errors", "rows_allowed", "rows_denied", "rows_hidden_superseded",
          "rows_hidden_deleted", "rows_unknown", "row_deny_reasons", "row_ids", "denied_row_ids", "latency_us",
          "stripped_headers", "event", "level", "timestamp"}


def complete_lines(log: Path) -> list[str]:
    """The lines of `log` the sidecar has finished writing: a last line without its newline is still being
    written (a reader may see part of one write) and is left for the next read."""
    if not log.exists():
        return []
    return log.read_text(encoding="utf-8", errors="replace").split("\n")[:-1]


def decision(log: Path, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The decision event of `request_id` (the response's X-Request-Id) in the sink file `log`."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in complete_lines(log):
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("event") == "decision" and event.get("request_id") == request_id:
                assert FIELDS <= set(event), FIELDS - set(event)
                assert event["schema_version"] == 1
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no decision event for request {request_id} in {log}")
        time.sleep(0.05)


def file_sink(path: Path, **extra: str) -> dict[str, str]:
    """Environment for a sidecar logging to the file `path`."""
    return {"MEMWARDEN_DECISION_LOG_SINK": "file", "MEMWARDEN_DECISION_LOG_PATH": str(path), **extra}


def decisions(log: Path) -> list[dict[str, Any]]:
    """Every decision event in the sink file `log` so far."""
    events = [json.loads(line) for line in complete_lines(log) if line.strip()]
    return [e for e in events if e.get("event") == "decision"]
