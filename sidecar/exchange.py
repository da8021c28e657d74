"""The one object every pipeline stage reads and writes for a request (cf. mitmproxy's flow)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sidecar.governance import Principal


def new_request_id() -> str:
    """A random request id: the 32 lowercase hex digits of a version-4 (random) RFC 4122 UUID
    (``uuid.uuid4().hex``: 16 bytes of ``os.urandom``)."""
    return uuid.uuid4().hex


@dataclass(slots=True)
class Exchange:
    """State of one request through the pipeline.

    `segments` are the percent-decoded path segments; `query` the validated scalar query parameters;
    `body` the parsed JSON body (or None); `client` the peer address (``host:port``, None when the server
    gave none), `auth` the credential header presented (``x-api-key``, ``bearer``, both joined by ``+``, or
    ``none``) and `key_id` the key id it names (``mwk_<key id>.…``), set before the key is checked. The rest
    is the decision-log record (`sidecar.decisionlog`): `action` the operation's Cedar action, `actions`
    every Cedar action decided (in the order first asked) and `deny_action` the one whose denial refused the
    request; `decision` (allow | deny | error, None until decided) and `reason`; `policy_set` the policy set
    the request is decided under (pinned on its first Cedar call); `policies` the determining ids of every
    Cedar answer and `deny_policies` those of the denials (forbids, erroring policies); row counts by
    outcome and `row_deny_reasons` (reason → rows), `row_ids` (allowed) and `denied_row_ids` (refused);
    `evaluation_errors` (sanitised, see `sidecar.policy.Decision`); in shadow mode `would_deny` decisions
    with their reasons and rows.
    """

    method: str
    raw_path: str
    segments: list[str] = field(default_factory=list)
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    principal: Principal | None = None
    key_id: str | None = None
    client: str | None = None
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
    rows_malformed: int = 0  # backend rows dropped because their shape cannot be served (see authorize.well_formed_rows)
    rows_hidden_superseded: int = 0
    rows_hidden_deleted: int = 0
    rows_unknown: int = 0
    row_deny_reasons: dict[str, int] = field(default_factory=dict)
    evaluation_errors: list[str] = field(default_factory=list)
    would_deny: int = 0
    would_deny_reasons: dict[str, int] = field(default_factory=dict)
    would_deny_row_ids: list[str] = field(default_factory=list)
    # (action, resource) of every would-deny counted: a row decided twice in one request (on its ledger row,
    # then on the fetched row) is one would-deny
    would_deny_seen: set[tuple[str, tuple[str, str]]] = field(default_factory=set)
    row_ids: list[str] = field(default_factory=list)
    denied_row_ids: list[str] = field(default_factory=list)
    # Ledger rows read for this request's read decisions, by (backend, collection, row id): reused by the
    # same request's provenance links (one ledger read per row per request; never kept across requests).
    ledger_rows: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    # Ledger rows fetched off the event loop for the read in progress (`Authorizer.prefetch`), by
    # (backend, collection): consumed by that read's decisions and dropped when it ends.
    prefetched: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # The owners' agent entities read with them (agent uid -> entity, None: not an agent the ledger knows).
    prefetched_owners: dict[str, Any] = field(default_factory=dict)
    # (key id, presented key) of a key re-check `Authorizer.authenticate` deferred to this read's first
    # ledger read; None once made (or when none is pending).
    key_recheck: tuple[str, str] | None = None
    stripped_headers: list[str] = field(default_factory=list)
    request_id: str = field(default_factory=new_request_id)
    started_ns: int = field(default_factory=time.perf_counter_ns)

    def elapsed_us(self) -> int:
        return (time.perf_counter_ns() - self.started_ns) // 1000
