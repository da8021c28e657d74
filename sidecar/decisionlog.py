"""Stage 8 — record: one structured JSON decision-log event per request (structlog's processors; the
decision event itself is written by `writer`, without the bound logger). The decision log is the audit
trail: it is written whatever the process log level (``LOG_LEVEL`` filters the other events only) and is
turned off only explicitly (``DECISION_LOG=off``). Schema: docs/decision-log.md (``schema_version`` 1).

Fields (event ``decision``), in this order:

- ``schema_version`` (`SCHEMA_VERSION`), ``request_id``, ``client`` (the peer, ``host:port``), ``path`` (the
  request path as sent, without the query, at most `PATH_MAX` characters), ``auth`` (the credential header
  presented: ``x-api-key``, ``bearer``, ``bearer+x-api-key`` or ``none``), ``principal`` (Cedar uid, None
  unless authenticated), ``key_id`` (the key id the credential names, also when it did not authenticate),
  ``method``, ``operation``;
- ``action`` — the operation's Cedar action (one per operation, whatever the outcome: an add is ``write``,
  a get ``read``); ``deny_action`` — the Cedar action whose denial refused the request (``deny`` only);
  ``resource`` (the request-level resource), ``status`` (HTTP, as sent);
- ``decision`` — ``allow`` (served as the policies allowed), ``deny`` (refused by memwarden: not
  authenticated, Cedar's Deny, an unknown or hidden row or collection, an unmapped or blocked route)
  or ``error`` (not an access decision: bad request, conflict, body too large, backend failure or the
  backend's own 4xx, internal error); ``reason`` for anything but ``allow``: ``no_permit``, ``forbid``,
  ``evaluation_error``, ``not_applicable``, ``unknown_row``, ``deleted_row``, ``superseded_row``,
  ``changing_row``, ``unknown_collection``, ``not_authenticated``, ``not_permitted``, ``not_found``,
  ``unmapped_route``, ``blocked_route``, ``bad_request``, ``conflict``, ``payload_too_large``,
  ``backend_error``, ``backend_timeout``, ``backend_rejected``, ``backend_not_found``, ``internal_error``
  (`sidecar.errors`, `sidecar.pipeline`);
- ``policy_sha256`` — the policy set the request was decided under (the one in force when it was
  not decided by Cedar at all); ``mode`` (``enforce``, ``shadow`` — shadow mode ``reads`` — or
  ``shadow-all``);
- ``actions`` — every Cedar action decided for the request, in the order first asked;
- ``policies`` — the determining policy ids of every Cedar answer; ``deny_policies`` — those of the
  denials (the forbids that matched, the policies that raised an evaluation error);
- ``evaluation_errors`` — Cedar evaluation errors, ``"<policy id>: <message>"`` with quoted values
  elided (at most 20);
- one counting rule for every operation, each row the request named or matched counted once by its outcome:
  ``rows_allowed`` (every decision it needed allowed: served, or acted on), ``rows_denied`` (a Cedar decision
  refused it), ``rows_hidden_superseded``, ``rows_hidden_deleted`` (tombstoned, pending or changing),
  ``rows_unknown`` (not governed by the ledger), ``row_deny_reasons`` (reason → rows), ``row_ids`` (the
  rows allowed, at most `IDS_MAX`) and ``denied_row_ids`` (the rows refused, Cedar's or withheld, at most
  `IDS_MAX`);
- shadow mode: ``would_deny`` (decisions enforcement would have denied), ``would_deny_reasons``,
  ``would_deny_row_ids`` (at most `IDS_MAX`);
- ``latency_us`` (from the request's arrival to the response handed to the connection; the event is
  written after it), ``stripped_headers``; then ``event``, ``level``, ``timestamp`` (UTC, ISO 8601).

Memory content, query text, filters and keys are never logged.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import orjson
import structlog

from sidecar import logsinks
from sidecar.exchange import Exchange
from sidecar.governance import Principal

SCHEMA_VERSION = 1  # the decision event's ``schema_version`` (docs/decision-log.md)
PATH_MAX = 1024  # characters of the request path logged
IDS_MAX = 100  # row ids logged per list (``row_ids``, ``denied_row_ids``, ``would_deny_row_ids``)

_configured = False
_off = False  # ``DECISION_LOG=off``: `record` writes nothing
_write: Callable[[dict[str, Any]], None] | None = None  # the decision event's writer, set by `configure`
# `recorder`'s function for `_write` (set with it by `configure`), used by `record` while `_write` is that writer.
_record: Callable[[Exchange, int, str | None, str], None] | None = None
_record_of: Any = None


def dumps(obj: Any, default: Callable[[Any], Any] | None = None, **_: Any) -> str:
    """JSON text of a log event with orjson (UTF-8, non-string keys as strings, `default` for other
    types); anything orjson refuses (an integer over 64 bits, say) goes to the standard library encoder,
    so an event is never lost to serialisation."""
    try:
        return orjson.dumps(obj, default=default, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(obj, default=default)


def fallback(obj: Any) -> Any:
    """The JSON stand-in of a value JSON has no form for, as structlog's renderer makes it by default: the
    value's ``__structlog__()`` if it has one, else its ``repr``."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


class Renderer(structlog.processors.JSONRenderer):
    """``structlog.processors.JSONRenderer(serializer=dumps, default=fallback)``: the last processor of the
    default chain (`processors`), recognised by its type where `writer` and `recorder` write the decision event
    without running the chain (the same `dumps` call with the same `default`)."""

    def __init__(self) -> None:
        super().__init__(serializer=dumps, default=fallback)


class IsoUtcStamper:
    """structlog processor: the event's ``timestamp``, the current UTC time as structlog's
    ``TimeStamper(fmt="iso", utc=True)`` writes it (``datetime.now(timezone.utc).isoformat()`` with
    ``+00:00`` as ``Z``: ``2026-12-02T13:32:57.123456Z``, no fraction when the microsecond is 0), from
    ``time.time_ns()`` floored to the microsecond as ``datetime.now`` floors it; the text up to the seconds
    is built once per second (kept as one (second, text) pair, so threads never mix two seconds')."""

    __slots__ = ("_second",)

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")

    def at(self, ns: int) -> str:
        """The timestamp of `ns` nanoseconds since the epoch (non-negative, before the year 10000)."""
        second, us = divmod(ns // 1000, 1_000_000)
        cached = self._second
        if cached[0] != second:
            cached = self._second = (
                second, datetime.datetime.fromtimestamp(second, datetime.timezone.utc).isoformat()[:-6])
        return f"{cached[1]}.{us:06d}Z" if us else cached[1] + "Z"

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        event["timestamp"] = self.at(time.time_ns())
        return event


def processors(mask: tuple[str, ...] = (), stamper: Any = None) -> list[Any]:
    """The processor chain of every log event: level, ISO-8601 UTC timestamp (`stamper`: `IsoUtcStamper`,
    the text of structlog's ``TimeStamper(fmt="iso", utc=True)``, unless given), `mask`ed fields, the
    exception's formatted traceback as ``exception`` (``log.exception(...)`` or ``exc_info=``: structlog's
    `format_exc_info`), JSON (`dumps`)."""
    return [
        structlog.processors.add_log_level,
        stamper or IsoUtcStamper(),
        *([logsinks.MaskFields(mask)] if mask else []),
        structlog.processors.format_exc_info,
        Renderer(),
    ]


def writer(chain: list[Any], sink: Any) -> Callable[[dict[str, Any]], None]:
    """A function writing one decision event (its fields, in order) to `sink` (a logger of
    `logsinks.logger_factory`) through `chain` (`processors`), as structlog's bound logger would for
    ``info("decision", **fields)`` — the same event dict (the fields, then ``event``), the same processors
    called the same way, the same sink method — without the bound logger's keyword repacking and copies.

    The chain `processors` builds by default (`add_log_level`, an `IsoUtcStamper`, optionally `MaskFields`,
    `format_exc_info`, `Renderer`) is run fused
    (`_fused`): the same keys set in the same order to the same values, the same masking and the same `dumps`
    call, in one function instead of five processor calls (`format_exc_info` is called only for an event with an
    ``exc_info`` field, the only one it changes; a decision event has none). Any other chain runs processor by
    processor."""
    fused = _fused(chain, sink)
    if fused is not None:
        return fused
    info = sink.info

    def write(fields: dict[str, Any]) -> None:
        fields["event"] = "decision"
        event: Any = fields
        for proc in chain:
            event = proc(sink, "info", event)
        info(event)
    return write


def _fused(chain: list[Any], sink: Any) -> Callable[[dict[str, Any]], None] | None:
    """`writer`'s fused form of the default chain, None when `chain` is not of that shape: ``level``
    (``"info"``: what `add_log_level` sets for the info method), ``timestamp`` (`IsoUtcStamper.at` of
    ``time.time_ns()``, as its ``__call__``), `MaskFields` (called as a processor), then the renderer's
    own serializer call (`dumps` with ``default=fallback``, as `Renderer` calls it)."""
    if len(chain) not in (4, 5) or chain[0] is not structlog.processors.add_log_level \
            or chain[-2] is not structlog.processors.format_exc_info:
        return None
    stamper, renderer = chain[1], chain[-1]
    mask = chain[2] if len(chain) == 5 else None
    if type(stamper) is not IsoUtcStamper or (mask is not None and type(mask) is not logsinks.MaskFields):
        return None
    if type(renderer) is not Renderer:
        return None
    default = fallback
    format_exc_info = structlog.processors.format_exc_info
    at, now, info = stamper.at, time.time_ns, sink.info
    encode, option, stdlib_dumps = orjson.dumps, orjson.OPT_NON_STR_KEYS, json.dumps

    def write(fields: dict[str, Any]) -> None:
        fields["event"] = "decision"
        fields["level"] = "info"
        fields["timestamp"] = at(now())
        if mask is not None:
            fields = mask(sink, "info", fields)  # type: ignore[assignment]
        if "exc_info" in fields:  # never in a decision event; `format_exc_info` as the chain would call it
            fields = format_exc_info(sink, "info", fields)
        try:  # `dumps`, inline
            line = encode(fields, default=default, option=option).decode()
        except (TypeError, orjson.JSONEncodeError):
            line = stdlib_dumps(fields, default=default)
        info(line)
    return write


def configure(level: str = "INFO", sink: str = "stdout", path: Path | None = None,
              max_bytes: int = 100 * 1024 * 1024, backups: int = 5, mask: tuple[str, ...] = (),
              decision_log: bool = True, ship: Callable[[str], None] | None = None) -> bool:
    """Configure structlog once per process: JSON lines to `sink` (see `sidecar.logsinks`), `mask`ed fields;
    the process log filtered at `level` (DEBUG, INFO, WARNING, ERROR or CRITICAL, any case; ValueError for
    another). Decision events are written through the same processors to the same sink by `writer` whatever
    `level` is — the decision log is the audit trail — and not at all when `decision_log` is False. `ship`: also
    handed each decision event's line after the sink wrote it (`sidecar.logship.Shipper.enqueue`, through
    `sidecar.logship.Tee`). Returns whether this call configured (False: an earlier call did; nothing changed)."""
    global _configured, _write, _record, _record_of, _off
    levels = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
              "CRITICAL": logging.CRITICAL}
    if level.upper() not in levels:
        raise ValueError(f"unknown log level {level!r}: one of {', '.join(levels)}")
    if _configured:
        return False
    min_level = levels[level.upper()]
    chain = processors(mask)
    factory = logsinks.logger_factory(sink, path, max_bytes, backups)
    structlog.configure(
        processors=chain,
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
    _configured = True
    # The decision event, once per request, skips structlog's bound logger (whose filter would drop it
    # below `min_level`); every other event goes through structlog.
    if decision_log:
        sink_logger = factory("memwarden.decision")
        if ship is not None:
            from sidecar.logship import Tee

            sink_logger = Tee(sink_logger, ship)
        _write = writer(chain, sink_logger)
        _record, _record_of = recorder(chain, sink_logger, _write), _write
    else:
        _off = True
        _write = lambda fields: None  # noqa: E731
    return True


def _where(ex: Exchange) -> tuple[Any, Any]:
    """(client, path) of the event: the peer address and the path cut at `PATH_MAX`."""
    raw = ex.raw_path
    return ex.client, raw[:PATH_MAX] if type(raw) is str and len(raw) > PATH_MAX else raw


def fields(ex: Exchange, status: int, policy_sha256: str | None = None, mode: str = "enforce") -> dict[str, Any]:
    """The decision event's fields for a finished exchange, in log order (module docstring)."""
    principal = ex.principal
    client, path = _where(ex)
    return {
        "schema_version": SCHEMA_VERSION,
        "request_id": ex.request_id,
        "client": client,
        "path": path,
        "auth": ex.auth,
        "principal": principal.describe() if principal else None,
        "key_id": ex.key_id,
        "method": ex.method,
        "operation": ex.operation,
        "action": ex.action,
        "deny_action": ex.deny_action,
        "resource": ex.resource,
        "decision": ex.decision,
        "reason": ex.reason,
        "status": status,
        "mode": mode,
        "policy_sha256": policy_sha256,
        **_row_fields(ex, mode),
    }


def _row_fields(ex: Exchange, mode: str) -> dict[str, Any]:
    """The fields of `fields` after ``policy_sha256`` (``actions`` .. ``stripped_headers``), in log order."""
    deny_policies = ex.deny_policies
    out: dict[str, Any] = {
        "actions": ex.actions or None,
        "policies": sorted(ex.policies),
        "deny_policies": sorted(deny_policies) if deny_policies else None,
        "evaluation_errors": ex.evaluation_errors or None,
        "rows_allowed": ex.rows_allowed,
        "rows_denied": ex.rows_denied,
        "rows_hidden_superseded": ex.rows_hidden_superseded,
        "rows_hidden_deleted": ex.rows_hidden_deleted,
        "rows_unknown": ex.rows_unknown,
        "row_deny_reasons": ex.row_deny_reasons or None,
        "row_ids": ex.row_ids[:IDS_MAX],
        "denied_row_ids": ex.denied_row_ids[:IDS_MAX] or None,
    }
    if mode != "enforce":
        out["would_deny"] = ex.would_deny
        out["would_deny_reasons"] = ex.would_deny_reasons or None
        out["would_deny_row_ids"] = ex.would_deny_row_ids[:IDS_MAX] or None
    out["latency_us"] = ex.elapsed_us()
    out["stripped_headers"] = ex.stripped_headers or None
    return out


def record(ex: Exchange, status: int, *, policy_sha256: str | None = None, mode: str = "enforce") -> None:
    """Emit the decision event for a finished exchange (fields: module docstring): through `writer` once
    `configure` ran, else through structlog's default configuration; nothing when the decision log is off."""
    if _off:
        return
    if _write is _record_of and _record is not None:
        _record(ex, status, policy_sha256, mode)
        return
    event = fields(ex, status, policy_sha256, mode)
    if _write is not None:
        _write(event)
    else:
        structlog.get_logger("memwarden.decision").info("decision", **event)


STATIC_SIZE = 4096  # `recorder`: JSON runs of the request-level fields kept (cleared when full)
_STATIC_KEYS = ("auth", "principal", "key_id", "method", "operation", "action", "deny_action", "resource", "decision",
                "reason", "status", "mode", "policy_sha256")


def recorder(chain: list[Any], sink: Any, write: Callable[[dict[str, Any]], None] | None = None
             ) -> Callable[[Exchange, int, str | None, str], None]:
    """A function writing the decision event of (exchange, status, policy_sha256, mode) to `sink` through
    `chain`: ``write(fields(...))`` (`write`: ``writer(chain, sink)`` unless given), the same line.

    For the default chain without masking (`_fused`'s shape, no `MaskFields`) the line is written without
    the event dict of `fields`: orjson writes a dict as ``{`` + its items' JSON joined by ``,`` + ``}``, each
    item ``"key":`` + the value's own JSON, so the line is put together from three orjson calls with the
    same options and ``default`` — the head (``schema_version``, ``request_id``, ``client``, ``path``), then
    the run of the request-level fields from ``auth`` to ``policy_sha256`` (the same for every request of a
    caller, route and outcome: kept per their values, when each is an exact ``str`` or None and the status an
    exact ``int``, and looked up only for an exact ``int`` status, so equal values mean the same JSON), then a
    dict of the rest (``actions`` .. ``stripped_headers``, ``event``, ``level``, ``timestamp``) without its
    opening brace. If orjson refuses any part, the event is written by `write` as before (the standard
    library encoder's line of the whole event)."""
    if write is None:
        write = writer(chain, sink)
    fused = len(chain) == 4 and _fused(chain, sink) is not None
    if not fused:
        def record_slow(ex: Exchange, status: int, policy_sha256: str | None, mode: str) -> None:
            write(fields(ex, status, policy_sha256, mode))
        return record_slow
    default = fallback
    at, now, info = chain[1].at, time.time_ns, sink.info
    encode, option = orjson.dumps, orjson.OPT_NON_STR_KEYS
    static: dict[tuple[Any, ...], bytes] = {}
    size = STATIC_SIZE
    version, path_max = SCHEMA_VERSION, PATH_MAX

    def record_fast(ex: Exchange, status: int, policy_sha256: str | None, mode: str) -> None:
        principal = ex.principal
        try:
            # The uid determines `describe()` (``"<type>::<id>"``); a principal of another type: described.
            who = principal.uid if type(principal) is Principal else (principal.describe() if principal else None)
            key = (ex.auth, who, ex.key_id, ex.method, ex.operation, ex.action, ex.deny_action, ex.resource,
                   ex.decision, ex.reason, status, mode, policy_sha256)
            # Only an exact ``int`` status is looked up: 200, 200.0 and True == 1 are equal keys of other JSON (a
            # kept run's other values are exact ``str`` or None, equal to no value of another type).
            run = static.get(key) if type(status) is int else None
            if run is None:
                run = encode(dict(zip(_STATIC_KEYS, (
                    key[0], principal.describe() if principal else None, *key[2:]))), default=default,
                    option=option)[1:-1]
                if type(status) is int and all(v is None or type(v) is str for v in key[2:10]) \
                        and (key[0] is None or type(key[0]) is str) \
                        and type(mode) is str and (policy_sha256 is None or type(policy_sha256) is str) \
                        and (who is None or type(who) is str
                             or (type(who) is tuple and len(who) == 2 and type(who[0]) is str and type(who[1]) is str)):
                    if len(static) >= size:
                        static.clear()
                    static[key] = run
            path = ex.raw_path  # `_where`, inline
            if type(path) is str and len(path) > path_max:
                path = path[:path_max]
            head = encode({"schema_version": version, "request_id": ex.request_id, "client": ex.client, "path": path},
                          default=default, option=option)
            rest = _row_fields(ex, mode)
            rest["event"] = "decision"
            rest["level"] = "info"
            rest["timestamp"] = at(now())
            line = b"".join((head[:-1], b",", run, b",", encode(rest, default=default, option=option)[1:])).decode()
        except (TypeError, orjson.JSONEncodeError):  # orjson refused a part: the whole event as before
            write(fields(ex, status, policy_sha256, mode))
            return
        info(line)
    return record_fast
