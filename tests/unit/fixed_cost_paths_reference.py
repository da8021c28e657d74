"""Earlier code of the per-request fixed costs (as of commit 1b82edf), kept as the references of
`tests/unit/test_fixed_cost_paths.py`: the `Exchange` dataclass with the `__init__` `dataclasses` generates,
`canonical_headers` with its control-byte regular expressions, `canonical_path` with its plain-path regular
expression, `Metrics.observe_cedar` / `observe_exchange` through `Histogram.observe` and `Counter.inc`,
structlog's `PrintLogger.msg` (``print(..., flush=True)``) and `_LineRotatingFileHandler._rolls_over` with one
``fstat`` per line."""

from __future__ import annotations

import os
import re
import stat
import time
from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import Any

from sidecar.errors import BadRequest
from sidecar.exchange import new_request_id
from sidecar.governance import Principal
from sidecar.stages import canonicalize as c


@dataclass(slots=True)
class Exchange:
    """`sidecar.exchange.Exchange` as it was: the same fields, the generated ``__init__``."""

    method: str
    raw_path: str
    segments: list[str] = field(default_factory=list)
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    principal: Principal | None = None
    key_id: str | None = None
    client: str | None = None  # issue 34: the decision log's schema 1 fields
    auth: str = "none"
    operation: str = "unrouted"
    action: str | None = None
    actions: list[str] = field(default_factory=list)
    deny_action: str | None = None
    resource: str | None = None
    decision: str | None = None
    reason: str | None = None
    policy_set: Any = None
    policies: set[str] = field(default_factory=set)
    deny_policies: set[str] = field(default_factory=set)
    rows_allowed: int = 0
    rows_denied: int = 0
    rows_malformed: int = 0
    rows_hidden_superseded: int = 0
    rows_hidden_deleted: int = 0
    rows_unknown: int = 0
    row_deny_reasons: dict[str, int] = field(default_factory=dict)
    evaluation_errors: list[str] = field(default_factory=list)
    would_deny: int = 0
    would_deny_reasons: dict[str, int] = field(default_factory=dict)
    would_deny_row_ids: list[str] = field(default_factory=list)
    would_deny_seen: set[tuple[str, tuple[str, str]]] = field(default_factory=set)
    row_ids: list[str] = field(default_factory=list)
    denied_row_ids: list[str] = field(default_factory=list)
    ledger_rows: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    prefetched: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    prefetched_owners: dict[str, Any] = field(default_factory=dict)
    key_recheck: tuple[str, str] | None = None
    stripped_headers: list[str] = field(default_factory=list)
    request_id: str = field(default_factory=new_request_id)
    started_ns: int = field(default_factory=time.perf_counter_ns)


_CONTROL_BYTES = re.compile(rb"[\x00-\x1f\x7f]")
_CONTROL_BYTES_BUT_TAB = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def canonical_headers(raw_headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, list[str]], list[str]]:
    """`canonicalize.canonical_headers` as it was (control bytes found by two regular expressions)."""
    try:
        if _CONTROL_BYTES.search(b"".join([n for n, _ in raw_headers])) or \
                _CONTROL_BYTES_BUT_TAB.search(b"".join([v for _, v in raw_headers])):
            return c._reference_headers(raw_headers)
    except TypeError:
        return c._reference_headers(raw_headers)
    headers: dict[str, list[str]] = {}
    stripped: list[str] = []
    try:
        for raw_name, raw_value in raw_headers:
            name = raw_name.decode("ascii").lower()
            value = raw_value.decode("utf-8")
            if name in c.METHOD_OVERRIDE_HEADERS:
                raise BadRequest("method override headers are not accepted")
            if name in c.IDENTITY_HEADERS or name.startswith(c.IDENTITY_HEADER_PREFIXES):
                stripped.append(name)
                continue
            values = headers.get(name)
            if values is None:
                headers[name] = [value]
            else:
                values.append(value)
    except UnicodeDecodeError:
        return c._reference_headers(raw_headers)
    return c._framing_checked(headers), stripped


_PLAIN_PATH = re.compile(r"(?:/[A-Za-z0-9._~-]*)+")


def canonical_path(raw_path: bytes) -> list[str]:
    """`canonicalize.canonical_path` as it was (plain paths found by a regular expression)."""
    try:
        path = raw_path.decode("ascii")
    except UnicodeDecodeError as exc:
        raise BadRequest("path must be ASCII (percent-encode other bytes)") from exc
    if not path.startswith("/") or c._CONTROL.search(path):
        raise BadRequest("path must start with '/' and contain no control characters")
    if "//" in path:
        raise BadRequest("empty path segments ('//') are not accepted")
    raw_segments = path[1:].split("/")
    if _PLAIN_PATH.fullmatch(path):
        for s in raw_segments:
            if s in (".", ".."):
                raise BadRequest("dot segments are not accepted")
        return raw_segments
    return [c._decode_segment(s) for s in raw_segments]


def observe_cedar(m: Any, actions: list[str], allowed: list[bool], seconds: float) -> None:
    """`Metrics.observe_cedar` through the library's calls."""
    m.cedar_batch.observe(seconds)
    m.cedar_batch_size.observe(len(actions))
    for (action, ok), n in Tally(zip(actions, allowed)).items():
        m.cedar_decisions.labels(action, "allow" if ok else "deny").inc(n)


def observe_exchange(m: Any, ex: Any, status: int) -> None:
    """`Metrics.observe_exchange` through the library's calls."""
    m.requests.labels(ex.operation, ex.action or "none", ex.decision or "none", str(status)).inc()
    for result, n in (("allowed", ex.rows_allowed), ("denied", ex.rows_denied),
                      ("superseded", ex.rows_hidden_superseded), ("deleted", ex.rows_hidden_deleted),
                      ("unknown", ex.rows_unknown), ("malformed", ex.rows_malformed)):
        if n:
            m.rows.labels(result).inc(n)
    m.request_duration.observe(ex.elapsed_us() / 1e6)


def print_logger_msg(logger: Any, message: str) -> None:
    """structlog 26's `PrintLogger.msg` of `logger`."""
    from structlog._output import stdout

    f = logger._file if logger._file is not stdout else None
    with logger._lock:
        print(message, file=f, flush=True)


def rolls_over(handler: Any, text: str) -> bool:
    """`_LineRotatingFileHandler._rolls_over` as it was: one ``fstat`` of the open file per line."""
    if handler.maxBytes <= 0:
        return False
    if handler.stream is None:
        handler.stream = handler._open()
    st = os.fstat(handler.stream.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_size + len(text) < handler.maxBytes:
        return False
    return not (os.path.exists(handler.baseFilename) and not os.path.isfile(handler.baseFilename))


def credential(headers: dict[str, list[str]]) -> str | None:
    """`canonicalize.credential` as it was (no shortcut for a lone ``X-API-Key``)."""
    from sidecar.errors import Unauthorized

    auth = headers.get("authorization", [])
    api = headers.get("x-api-key", [])
    if len(auth) > 1 or len(api) > 1:
        raise Unauthorized("more than one credential")
    found: list[str] = []
    if auth:
        scheme, _, token = auth[0].strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must be 'Bearer <key>'")
        found.append(token.strip())
    if api:
        found.append(api[0].strip())
    if len(set(found)) > 1:
        raise Unauthorized("more than one credential")
    return found[0] if found else None
