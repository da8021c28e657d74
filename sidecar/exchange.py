"""The one object every pipeline stage reads and writes for a request (cf. mitmproxy's flow)."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from sidecar.governance import Principal


_IDS_PER_DRAW = 1024  # request ids made from one ``os.urandom`` call
_VERSION = bytes((b & 0x0F) | 0x40 for b in range(256))  # byte 6: version 4
_VARIANT = bytes((b & 0x3F) | 0x80 for b in range(256))  # byte 8: variant RFC 4122
_ids: list[str] = []  # drawn, not yet handed out (taken from the end)


def _draw() -> list[str]:
    """`_IDS_PER_DRAW` new request ids from one ``os.urandom`` call: each the 32 lowercase hex digits of 16
    fresh random bytes with the version and variant bits set, as `new_request_id` made each from its own
    16 bytes before (`tests/unit/exchange_reference.py`)."""
    raw = bytearray(os.urandom(16 * _IDS_PER_DRAW))
    raw[6::16] = raw[6::16].translate(_VERSION)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    text = raw.hex()
    return [text[i:i + 32] for i in range(0, len(text), 32)]


def new_request_id() -> str:
    """A random request id: 32 lowercase hex digits of a version-4 (random) RFC 4122 UUID, as
    ``uuid.uuid4().hex`` gives, from 16 bytes of ``os.urandom`` with the version and variant bits set (the
    bytes `uuid.uuid4` draws, without building a `uuid.UUID`). The bytes of 1024 ids are drawn in one
    ``os.urandom`` call (`_draw`) and handed out one by one, each once (``list.pop``, atomic under the GIL,
    so threads never share one); a forked child drops the parent's undrawn ids (``os.register_at_fork``),
    so two processes never hand out the same ones. As unpredictable as before: every id is fresh
    ``os.urandom`` bytes no other id is made of (`tests/unit/exchange_reference.py` keeps the old code)."""
    try:
        return _ids.pop()
    except IndexError:
        _ids.extend(_draw())
        return _ids.pop()


os.register_at_fork(after_in_child=_ids.clear)


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


def _literal_init(cls: type) -> None:
    """Give dataclass `cls` an ``__init__`` with the parameters, defaults and assignments of the one
    `dataclasses` generates (same names, order and defaults; a field with a default factory takes its
    factory's value unless passed), except that a ``list`` or ``dict`` default factory is written as the
    literal ``[]`` / ``{}`` — a new empty container each time, as the factory call makes, without the call
    (most of what building an `Exchange` cost). Made from `dataclasses.fields`, so a field added later is
    covered."""
    names: dict[str, Any] = {"_FACTORY": _FACTORY}
    params, body = [], []
    for f in dataclasses.fields(cls):
        if not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: only plain init fields are supported")
        if f.default_factory is not dataclasses.MISSING:
            literal = {list: "[]", dict: "{}"}.get(f.default_factory)  # type: ignore[call-overload]
            if literal is None:
                names[f"_factory_{f.name}"] = f.default_factory
                literal = f"_factory_{f.name}()"
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    self.{f.name} = {literal} if {f.name} is _FACTORY else {f.name}")
        elif f.default is not dataclasses.MISSING:
            names[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
            body.append(f"    self.{f.name} = {f.name}")
        else:
            params.append(f.name)
            body.append(f"    self.{f.name} = {f.name}")
    source = f"def __init__(self, {', '.join(params)}) -> None:\n" + "\n".join(body) + "\n"
    exec(source, names)  # noqa: S102 - generated from the dataclass's own field list, as dataclasses does
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]


class _FactoryDefault:
    """The default of a parameter whose field has a default factory (``repr``: like the dataclass's)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _FactoryDefault()
_literal_init(Exchange)
