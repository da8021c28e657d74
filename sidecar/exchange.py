"""The one object every pipeline stage reads and writes for a request (cf. mitmproxy's flow)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sidecar.governance import Principal


@dataclass(slots=True)
class Exchange:
    """State of one request through the pipeline.

    `segments` are the percent-decoded path segments; `query` the validated scalar query parameters;
    `body` the parsed JSON body (or None). `decisions` collects every Cedar answer for the decision log.
    """

    method: str
    raw_path: str
    segments: list[str] = field(default_factory=list)
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    principal: Principal | None = None
    operation: str = "unrouted"
    action: str | None = None
    resource: str | None = None
    decision: str = "deny"
    policies: set[str] = field(default_factory=set)
    rows_allowed: int = 0
    rows_denied: int = 0
    rows_malformed: int = 0  # backend rows dropped because their shape cannot be served (see authorize.well_formed_rows)
    row_ids: list[str] = field(default_factory=list)
    stripped_headers: list[str] = field(default_factory=list)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_ns: int = field(default_factory=time.perf_counter_ns)

    def elapsed_us(self) -> int:
        return (time.perf_counter_ns() - self.started_ns) // 1000
