"""The decision event's direct writer (`decisionlog.writer`, used by `decisionlog.record` once `configure`
ran) writes the lines structlog's bound logger wrote before: the same bytes — field order, key names, level,
timestamp format, masking, JSON — for allow, deny and error decisions, row batches and shadow mode, on the
file and stdout sinks, and nothing below the configured level. The reference is the former `record` (kept
below verbatim) logging through structlog."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from sidecar import decisionlog
from sidecar.exchange import Exchange
from sidecar.governance import Principal

ROOT = Path(__file__).resolve().parents[2]
STAMP = "2026-12-02T04:50:00.123456Z"
ISO_UTC = re.compile(r'"timestamp": ?"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?Z)"')


class FixedExchange(Exchange):
    """An exchange whose latency does not move between the two writes being compared."""

    __slots__ = ()

    def elapsed_us(self) -> int:
        return 1234


def reference_record(logger: Any, ex: Exchange, status: int, *, policy_sha256: str | None = None, mode: str = "enforce") -> None:
    """The decision event of schema version 1 (docs/decision-log.md) logged through `logger` (a structlog bound
    logger): the fields in their documented order."""
    shadow = {"would_deny": ex.would_deny, "would_deny_reasons": ex.would_deny_reasons or None,
              "would_deny_row_ids": ex.would_deny_row_ids[:100] or None} if mode != "enforce" else {}
    logger.info(
        "decision",
        schema_version=1,
        request_id=ex.request_id,
        client=ex.client,
        path=ex.raw_path[:1024],
        auth=ex.auth,
        principal=ex.principal.describe() if ex.principal else None,
        key_id=ex.key_id,
        method=ex.method,
        operation=ex.operation,
        action=ex.action,
        deny_action=ex.deny_action,
        resource=ex.resource,
        decision=ex.decision,
        reason=ex.reason,
        status=status,
        mode=mode,
        policy_sha256=policy_sha256,
        actions=ex.actions or None,
        policies=sorted(ex.policies),
        deny_policies=sorted(ex.deny_policies) or None,
        evaluation_errors=ex.evaluation_errors or None,
        rows_allowed=ex.rows_allowed,
        rows_denied=ex.rows_denied,
        rows_hidden_superseded=ex.rows_hidden_superseded,
        rows_hidden_deleted=ex.rows_hidden_deleted,
        rows_unknown=ex.rows_unknown,
        row_deny_reasons=ex.row_deny_reasons or None,
        row_ids=ex.row_ids[:100],
        denied_row_ids=ex.denied_row_ids[:100] or None,
        **shadow,
        latency_us=ex.elapsed_us(),
        stripped_headers=ex.stripped_headers or None,
    )


def cases() -> list[tuple[Exchange, int, dict[str, Any]]]:
    """(exchange, status, record keywords): allow, deny, error, row batches, shadow mode, odd values."""
    agent = Principal(kind="agent", key_id="k1", tenant="t", fleet="red", agent="a", trust=2, roles=("ops",))
    out: list[tuple[Exchange, int, dict[str, Any]]] = []
    ex = FixedExchange("POST", "/api/v2/tenants/t/databases/db/collections/c/get", request_id="r-allow")
    ex.principal, ex.key_id, ex.operation, ex.action, ex.resource = agent, "k1", "get", "read", 'Memory::"chroma:c:x"'
    ex.decision, ex.policies, ex.rows_allowed, ex.row_ids = "allow", {"p2", "p1"}, 1, ["x"]
    ex.client, ex.auth, ex.actions = "127.0.0.1:50123", "x-api-key", ["list", "read"]
    out.append((ex, 200, {"policy_sha256": "ab" * 32}))
    ex = FixedExchange("POST", "/q", request_id="r-batch")  # a query: 25 rows, some dropped, ids cut at 20
    ex.principal, ex.key_id, ex.operation, ex.action, ex.decision = agent, "k1", "query", "read", "allow"
    ex.policies, ex.deny_policies = {"fleet_read", "tenant_read"}, {"forbid_pii"}
    ex.rows_allowed, ex.rows_denied, ex.rows_hidden_superseded, ex.rows_hidden_deleted, ex.rows_unknown = 20, 2, 1, 1, 1
    ex.row_deny_reasons = {"forbid": 2, "superseded_row": 1, "deleted_row": 1, "unknown_row": 1}
    ex.row_ids = [f"row-{i}" for i in range(125)]  # cut at 100
    ex.denied_row_ids = ["d1", "d2"]
    ex.client, ex.auth = "[::1]:4242", "authorization"
    ex.stripped_headers = ["x-chroma-token", "authorization"]
    out.append((ex, 200, {"policy_sha256": "cd" * 32}))
    ex = FixedExchange("POST", "/add", request_id="r-deny")
    ex.principal, ex.key_id, ex.operation, ex.action = agent, "k1", "add", "write"
    ex.decision, ex.reason, ex.deny_policies = "deny", "forbid", {"no_low_trust_writes"}
    ex.deny_action, ex.actions, ex.denied_row_ids = "write", ["list", "write"], ["n1"]
    ex.evaluation_errors = ['p9: error while evaluating policy: attribute "…" not found']
    out.append((ex, 403, {"policy_sha256": "ef" * 32}))
    ex = FixedExchange("GET", "/nope" + "x" * 2000, request_id="r-unauth")  # no principal, nothing routed; path cut
    ex.decision, ex.reason, ex.key_id, ex.auth, ex.client = "deny", "not_authenticated", "0123abcd", "x-api-key", "10.0.0.9:1"
    out.append((ex, 401, {}))
    ex = FixedExchange("POST", "/get", request_id="r-error")
    ex.principal, ex.key_id, ex.operation, ex.decision, ex.reason = agent, "k1", "get", "error", "backend_timeout"
    out.append((ex, 504, {"policy_sha256": None}))
    ex = FixedExchange("POST", "/get", request_id="r-shadow")
    ex.principal, ex.key_id, ex.operation, ex.action, ex.decision = agent, "k1", "get", "read", "allow"
    ex.would_deny, ex.would_deny_reasons, ex.would_deny_row_ids = 3, {"no_permit": 3}, ["a", "b", "c"]
    out.append((ex, 200, {"policy_sha256": "01" * 32, "mode": "shadow"}))
    ex = FixedExchange("POST", "/get", request_id="r-shadow-none")
    ex.decision = "allow"
    out.append((ex, 200, {"mode": "shadow"}))
    ex = FixedExchange("POST", "/get", request_id="r-shadow-all")
    ex.decision = "allow"
    out.append((ex, 200, {"mode": "shadow-all"}))
    ex = FixedExchange("POST", "/get", request_id="r-odd")  # non-ASCII, quotes, a huge count (stdlib fallback)
    ex.principal = Principal(kind="admin", key_id="k\"2", tenant="té\u2028nant")
    ex.decision, ex.rows_allowed, ex.row_ids = "allow", 2**70, ["é", "\"q\"", "\\"]
    out.append((ex, 200, {}))
    return out


class Lines:
    """A sink logger that keeps what it is given."""

    def __init__(self) -> None:
        self.lines: list[Any] = []

    def info(self, message: Any) -> None:
        self.lines.append(message)


def fixed_stamp(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    event["timestamp"] = STAMP
    return event


@pytest.mark.parametrize("mask", [(), ("principal", "row_ids", "resource", "stripped_headers")])
def test_same_lines_as_structlogs_bound_logger(mask: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    ref_sink, new_sink = Lines(), Lines()
    ref = structlog.wrap_logger(ref_sink, processors=decisionlog.processors(mask, fixed_stamp),
                                wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    monkeypatch.setattr(decisionlog, "_write", decisionlog.writer(decisionlog.processors(mask, fixed_stamp), new_sink))
    for ex, status, kw in cases():
        reference_record(ref, ex, status, **kw)
        decisionlog.record(ex, status, **kw)
    assert new_sink.lines == ref_sink.lines and len(new_sink.lines) == len(cases())
    assert all(isinstance(line, str) for line in new_sink.lines)
    first = json.loads(new_sink.lines[0])
    assert list(first)[-3:] == ["event", "level", "timestamp"] and first["event"] == "decision"
    assert '"rows_allowed": 1180591620717411303424' in new_sink.lines[-1]  # the stdlib encoder took the big int


_SCRIPT = """
import sys, structlog
sys.path.insert(0, {root!r})
from pathlib import Path
from sidecar import decisionlog
from tests.unit.test_decisionlog_lines import cases, reference_record
decisionlog.configure({level!r}, {sink!r}, Path({path!r}), mask={mask!r})
ref = structlog.get_logger("memwarden.decision")  # the configured structlog chain, as `record` used it
for ex, status, kw in cases():
    reference_record(ref, ex, status, **kw)
    decisionlog.record(ex, status, **kw)
    structlog.get_logger("memwarden.pipeline").warning("between", n=1)  # other events still through structlog
"""


@pytest.mark.parametrize("sink", ["file", "stdout"])
@pytest.mark.parametrize("mask", [(), ("principal", "row_ids")])
def test_configured_sinks_write_the_same_lines(sink: str, mask: tuple[str, ...], tmp_path: Path) -> None:
    """In a fresh interpreter (structlog is configured once per process): `configure`, then each decision
    written by the former `record` through structlog and by the new one, on the file or stdout sink."""
    path = tmp_path / "d" / "decisions.jsonl"
    out = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT), level="INFO", sink=sink, path=str(path),
                                                                mask=mask)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    text = path.read_text(encoding="utf-8") if sink == "file" else out.stdout
    lines = text.splitlines()
    assert len(lines) == 3 * len(cases())
    for i in range(len(cases())):
        old, new, other = lines[3 * i: 3 * i + 3]
        stamps = [ISO_UTC.search(line) for line in (old, new)]
        assert all(stamps), (old, new)
        assert ISO_UTC.sub("", old) == ISO_UTC.sub("", new)  # the same bytes but for the clock
        assert '"event":"between"' in other and '"level":"warning"' in other
    if mask:
        assert '"principal":"mask:' in lines[1] and "t/red/a" not in text


@pytest.mark.parametrize("level", ["WARNING", "error", "CRITICAL"])
def test_the_decision_log_does_not_follow_the_log_level(level: str, tmp_path: Path) -> None:
    """Issue 34 (finding 4): the decision log is the audit trail. Above info the process log drops other info
    events, never a decision event: every one is written (on main, ``LOG_LEVEL=WARNING`` wrote none)."""
    path = tmp_path / "decisions.jsonl"
    script = _SCRIPT.replace("for ex,", 'structlog.get_logger("memwarden").info("dropped", n=1)\nfor ex,')
    out = subprocess.run([sys.executable, "-c", script.format(root=str(ROOT), level=level, sink="file",
                                                              path=str(path), mask=())],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = path.read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    decisions = [e for e in events if e["event"] == "decision"]
    # every request's decision event (the reference, logged through structlog's bound logger, is filtered out)
    assert [d["request_id"] for d in decisions] == [ex.request_id for ex, _, _ in cases()]
    assert all(d["schema_version"] == 1 for d in decisions)
    assert not any(e["event"] == "dropped" for e in events)  # the process log still follows the level
    warnings = sum(e["event"] == "between" for e in events)
    assert warnings == (len(cases()) if level.upper() == "WARNING" else 0)


_OFF = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from sidecar import decisionlog
from tests.unit.test_decisionlog_lines import cases
decisionlog.configure("INFO", "file", Path({path!r}), decision_log=False)
for ex, status, kw in cases():
    decisionlog.record(ex, status, **kw)
import structlog
structlog.get_logger("memwarden").info("other", n=1)
"""


def test_decision_log_off_writes_no_decision_event(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    out = subprocess.run([sys.executable, "-c", _OFF.format(root=str(ROOT), path=str(path))],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1 and '"event":"other"' in lines[0]


def test_an_unknown_log_level_is_refused() -> None:
    with pytest.raises(ValueError, match="verbose"):
        decisionlog.configure("verbose")
