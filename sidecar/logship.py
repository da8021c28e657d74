"""Decision-log shipping over HTTP: the audit pipeline's remote sink, beside stdout or the file (docs/decision-log.md
"Shipping to a collector"), in the manner of OPA's decision-log reporting.

The request path only *enqueues*: `Shipper.enqueue` appends the event's JSON line to a bounded in-memory buffer under a
lock held for a few list operations, and never waits for the network, raises or fails a request. A background thread
(`Shipper.start`) ships:

- **batching** — a batch is sent once `batch_max` events wait, or `flush_s` seconds after the previous flush (so an
  event waits at most about `flush_s` seconds plus the send while the collector answers);
- **body** — one HTTP ``POST`` of the batch to the configured URL, gzip-compressed (``Content-Encoding: gzip``),
  either NDJSON (``application/x-ndjson``: one event per line, each line ending in ``\\n``; the default) or one JSON
  array (``application/json``, what OPA's decision-log API sends). Each event is the decision event of the other sinks
  (``schema_version``, ``policy_sha256``, ...) with one more field at the end: ``instance``, naming the sidecar
  instance (``DECISION_LOG_INSTANCE``, default the host name — a pod's name);
- **retry** — a batch the collector did not take (a connection error, a timeout, any non-2xx answer but those below)
  is sent again after an exponential backoff with jitter (`backoff_delay`: ``retry_base_s * 2**n`` capped at
  `retry_max_s`, a uniform draw from its upper half; at least a numeric ``Retry-After`` within the cap), until it is
  taken; a batch refused for its content (HTTP 400, 415, 422 — it would never be taken) is dropped, counted and
  logged; one too large for the collector (413) is split in halves, down to single events. Any 2xx is success;
- **bounded buffer** — at most `buffer_max` events wait (plus the one batch being sent); an event arriving at a full
  buffer pushes out the **oldest** waiting event, which is dropped and counted: the newest events are kept (the log of
  an ongoing incident over a stale backlog);
- **counted and logged** — every event is shipped or counted as dropped by reason (`stats`, the Prometheus series
  ``memwarden_decision_log_dropped_total{reason}`` — ``buffer_full``, ``rejected``, ``shutdown`` — of
  `sidecar.metrics.Metrics.watch_decision_log`); drops and failed sends are logged as ``decision_log_dropped`` /
  ``decision_log_send_failed`` warnings at most once per `log_interval_s` each, from the shipping thread;
- **shutdown** — `Shipper.close` sends the batch in flight and everything buffered, retrying, until done or until its
  deadline (`shutdown_s` seconds); what is left then is counted dropped (``shutdown``).

httpx (its public `httpx.Client`) sends; the TLS context verifies an ``https`` collector (a CA bundle setting, else
the system's trust store; optionally a client certificate). ``Authorization: Bearer`` can come from a token file,
re-read when it changes (a rotated, mounted token), and fixed extra headers from a setting.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import socket
import ssl
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Literal, Mapping
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog

__all__ = ["Shipper", "Tee", "backoff_delay", "from_settings"]

# Answers that refuse a batch for its content: it would never be taken, so it is dropped (counted ``rejected``).
# Every other non-2xx answer (401/403 while a token rotates, 404/405 while a collector is redeployed, 429, 5xx) is
# retried: the buffer bounds what waits meanwhile.
REJECT_STATUSES = frozenset({400, 415, 422})  # (413, too large, splits the batch: `Shipper._deliver`)
DROP_REASONS = ("buffer_full", "rejected", "shutdown")
ERROR_KINDS = ("connect", "timeout", "4xx", "5xx", "token_file", "other")
RESERVED_HEADERS = frozenset({"content-type", "content-encoding", "content-length", "host", "transfer-encoding"})

Format = Literal["ndjson", "json"]


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry `attempt` (0 for the first retry): ``d = min(cap_s, base_s * 2**attempt)`` and a
    uniform draw from ``[d/2, d]`` ("equal jitter": replicas that failed together do not retry together, and the wait
    still grows). `rng`: the random source (the `random` module's when None)."""
    exp = min(attempt, 62)  # 2**62 * base is past any cap; keeps the float finite
    d = min(cap_s, base_s * (2.0 ** exp))
    draw = (rng or random).uniform(0.5, 1.0)
    return d * draw


def _safe_url(url: str) -> str:
    """`url` without user information, query or fragment (what a log line may name)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Shipper:
    """The HTTP sink of the decision log: `enqueue` (request path; never blocks, never raises), a shipping thread
    (`start`), `close` (flush with a deadline), `stats` (counts for metrics and readiness).

    `url`: the collector's ``http://`` or ``https://`` URL, POSTed to. `instance`: the ``instance`` field added to
    every event. `batch_max`: events per POST at most (>= 1). `flush_s`: seconds between flushes of a partial batch
    (> 0). `buffer_max`: events waiting at most (>= `batch_max`), beyond which the oldest is dropped. `timeout_s`: one
    POST's timeout (connect, read, write, pool), seconds. `retry_base_s`, `retry_max_s`: the backoff's first step and
    cap, seconds. `shutdown_s`: `close`'s default deadline, seconds. `headers`: extra request headers (not
    ``Content-*``/``Host``). `token_file`: a file holding a bearer token sent as ``Authorization: Bearer <token>``,
    re-read when its modification time or size changes. `verify`: the TLS context (or True: the system's trust
    store) for an ``https`` URL. `fmt`: ``ndjson`` or ``json`` (an array). `transport`: an httpx transport (tests:
    `httpx.MockTransport`). `log_interval_s`: drops and failed sends are logged at most once per this many seconds
    each. `rng`: the jitter's random source. Raises ValueError for bounds out of range."""

    def __init__(self, url: str, *, instance: str | None = None, batch_max: int = 100, flush_s: float = 5.0,
                 buffer_max: int = 10_000, timeout_s: float = 10.0, retry_base_s: float = 0.5,
                 retry_max_s: float = 30.0, shutdown_s: float = 5.0, headers: Mapping[str, str] | None = None,
                 token_file: Path | None = None, verify: ssl.SSLContext | bool = True, fmt: Format = "ndjson",
                 transport: httpx.BaseTransport | None = None, log_interval_s: float = 60.0,
                 rng: random.Random | None = None) -> None:
        if batch_max < 1 or buffer_max < batch_max:
            raise ValueError(f"need 1 <= batch_max ({batch_max}) <= buffer_max ({buffer_max})")
        if flush_s <= 0 or timeout_s <= 0 or retry_base_s <= 0 or retry_max_s < retry_base_s or shutdown_s < 0:
            raise ValueError("flush_s, timeout_s, retry_base_s > 0; retry_max_s >= retry_base_s; shutdown_s >= 0")
        if fmt not in ("ndjson", "json"):
            raise ValueError(f"unknown decision-log format {fmt!r} (ndjson or json)")
        bad = sorted(h for h in (headers or {}) if h.lower() in RESERVED_HEADERS)
        if bad:
            raise ValueError(f"headers set by the shipper cannot be configured: {', '.join(bad)}")
        if token_file is not None and any(h.lower() == "authorization" for h in (headers or {})):
            raise ValueError("Authorization comes either from the token file or from the headers, not both")
        self.url = url
        self.safe_url = _safe_url(url)
        self.instance = instance or socket.gethostname()
        self.batch_max, self.flush_s, self.buffer_max = batch_max, flush_s, buffer_max
        self.timeout_s, self.retry_base_s, self.retry_max_s = timeout_s, retry_base_s, retry_max_s
        self.shutdown_s, self.fmt, self.log_interval_s = shutdown_s, fmt, log_interval_s
        self._headers = {"Content-Type": "application/x-ndjson" if fmt == "ndjson" else "application/json",
                         "Content-Encoding": "gzip", **(headers or {})}
        self._token_file = token_file
        self._token: tuple[tuple[int, int], str] | None = None  # ((mtime_ns, size), token) of the file last read
        self._client = httpx.Client(transport=transport, verify=verify, timeout=timeout_s, trust_env=False)
        self._rng = rng or random.Random()
        self._suffix = ',"instance":' + json.dumps(self.instance) + "}"
        # Shared with the request path: `_buf` and `_dropped["buffer_full"]` under `_lock` (held for a few list
        # operations only). Everything else is written by the shipping thread alone (or `close` when none runs).
        self._lock = threading.Lock()
        self._buf: deque[str] = deque()
        self._inflight: list[str] = []
        self._wake = threading.Event()  # set when a full batch waits, and by `close`
        self._stop = threading.Event()  # `close` was called: final flush, then exit
        self._thread: threading.Thread | None = None
        self._closed = False
        self.shipped = 0
        self.batches = 0
        self.accepted = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._errors = dict.fromkeys(ERROR_KINDS, 0)
        self._reported = {"dropped": 0, "errors": 0}
        self._last_log = {"dropped": -float("inf"), "errors": -float("inf")}
        self._last_error: dict[str, Any] = {}
        self._log = structlog.get_logger("memwarden")

    # -- the request path --------------------------------------------------------------------
    def enqueue(self, line: str) -> None:
        """Buffer one decision event (its JSON line: an object, ``{...}``) for shipping. When `buffer_max` events
        already wait, the oldest is dropped (counted, ``buffer_full``); after `close` the event is counted dropped
        (``shutdown``). Never blocks on the network, never raises."""
        try:
            with self._lock:
                if self._closed:
                    self._dropped["shutdown"] += 1
                    return
                buf = self._buf
                if len(buf) >= self.buffer_max:
                    buf.popleft()
                    self._dropped["buffer_full"] += 1
                buf.append(line)
                self.accepted += 1
                full = len(buf) == self.batch_max
            if full:
                self._wake.set()
        except Exception:  # noqa: BLE001 - never fail the request that is being logged
            pass

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the shipping thread (a daemon; once — a second call does nothing)."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="memwarden-decision-log", daemon=True)
        self._thread.start()

    def close(self, deadline_s: float | None = None) -> None:
        """Ship the batch in flight and every buffered event, retrying, for at most `deadline_s` seconds (default
        `shutdown_s`), then stop: events still unsent are counted dropped (``shutdown``) and logged, as are events
        enqueued afterwards. Blocks the caller for about that long at most (run it off an event loop). Idempotent."""
        deadline_s = self.shutdown_s if deadline_s is None else deadline_s
        self._deadline = time.monotonic() + deadline_s
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is None:
            with self._lock:
                if self._closed:
                    return
            self._final_flush()
        else:
            thread.join(deadline_s + self.timeout_s + 1.0)
        self._client.close()

    def stats(self) -> dict[str, Any]:
        """Counts since start: ``shipped`` (events the collector took), ``batches`` (POSTs taken), ``accepted``
        (events enqueued), ``buffered`` (events waiting, the batch in flight included), ``dropped`` (reason ->
        events), ``send_errors`` (kind -> failed POSTs: ``connect``, ``timeout``, ``4xx``, ``5xx``, ``token_file``,
        ``other``)."""
        return {"shipped": self.shipped, "batches": self.batches, "accepted": self.accepted,
                "buffered": len(self._buf) + len(self._inflight), "dropped": dict(self._dropped),
                "send_errors": dict(self._errors)}

    # -- the shipping thread -----------------------------------------------------------------
    _deadline = float("inf")

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_flush - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            now = time.monotonic()
            due = now >= next_flush
            if due:
                next_flush = now + self.flush_s
            while not self._stop.is_set():
                with self._lock:
                    n = len(self._buf)
                    if n == 0 or (n < self.batch_max and not due):
                        break
                    self._inflight = [self._buf.popleft() for _ in range(min(n, self.batch_max))]
                if not self._deliver(self._inflight, final=False):
                    break  # stopping: the batch stays in flight for the final flush
                self._inflight = []
            self._report()
        self._final_flush()

    def _final_flush(self) -> None:
        try:
            while time.monotonic() < self._deadline:
                if not self._inflight:
                    with self._lock:
                        n = len(self._buf)
                        if n == 0:
                            break
                        self._inflight = [self._buf.popleft() for _ in range(min(n, self.batch_max))]
                if not self._deliver(self._inflight, final=True):
                    break
                self._inflight = []
        finally:
            with self._lock:
                self._closed = True
                left = len(self._inflight) + len(self._buf)
                self._buf.clear()
                self._dropped["shutdown"] += left
            self._inflight = []
            self._report(force=True)

    def _deliver(self, batch: list[str], final: bool) -> bool:
        """Ship `batch` (the batch in flight, `_inflight`): True once every event of it was taken or dropped as
        refused; False when stopping (normal operation) or past the deadline (final flush) first — `_inflight` then
        holds the events not yet taken. A batch answered 413 (too large for the collector) is split in halves, each
        sent on its own, down to single events (a single event answered 413 is dropped, ``rejected``)."""
        chunks = [batch]
        while chunks:
            chunk = chunks[0]
            outcome = self._deliver_chunk(chunk, final)
            if outcome == "stopped":
                return False
            if outcome == "too_large" and len(chunk) > 1:
                half = len(chunk) // 2
                chunks[0:1] = [chunk[:half], chunk[half:]]
                continue
            if outcome == "too_large":
                self._dropped["rejected"] += 1
            chunks.pop(0)
            self._inflight = self._inflight[len(chunk):]  # chunks leave the batch in flight from its front
        return True

    def _deliver_chunk(self, chunk: list[str], final: bool) -> str:
        """POST `chunk` until it is taken (``ok``), refused for its content (``rejected``: dropped, counted) or
        too large (``too_large``: 413, for the caller to split); ``stopped`` when stopping or past the deadline."""
        body = self._body(chunk)
        attempt = 0
        while True:
            timeout = self.timeout_s
            if final:
                timeout = min(timeout, self._deadline - time.monotonic())
                if timeout <= 0:
                    return "stopped"
            outcome, retry_after = self._post(body, timeout)
            if outcome == "ok":
                self.shipped += len(chunk)
                self.batches += 1
                return outcome
            if outcome == "rejected":
                self._dropped["rejected"] += len(chunk)
                return outcome
            if outcome == "too_large":
                return outcome
            delay = backoff_delay(attempt, self.retry_base_s, self.retry_max_s, self._rng)
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.retry_max_s))
            attempt += 1
            self._report()
            if final:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    return "stopped"
                time.sleep(min(delay, left))
            elif self._stop.wait(delay):
                return "stopped"

    def _body(self, batch: list[str]) -> bytes:
        """The gzip-compressed body of `batch`: each line with ``instance`` appended, as NDJSON or a JSON array."""
        suffix = self._suffix
        events = [line[:-1] + suffix if line.endswith("}") and len(line) > 2 else line for line in batch]
        text = "".join(e + "\n" for e in events) if self.fmt == "ndjson" else "[" + ",".join(events) + "]"
        return gzip.compress(text.encode("utf-8", "replace"), compresslevel=1, mtime=0)  # fast: CPU is the host's

    def _auth(self) -> dict[str, str]:
        """``Authorization: Bearer`` from the token file (re-read when it changed); {} without one. Raises OSError
        or ValueError (an empty file)."""
        if self._token_file is None:
            return {}
        st = os.stat(self._token_file)
        key = (st.st_mtime_ns, st.st_size)
        if self._token is None or self._token[0] != key:
            token = self._token_file.read_text(encoding="utf-8").strip()
            if not token or any(c in token for c in "\r\n"):
                raise ValueError("the token file holds no single-line token")
            self._token = (key, token)
        return {"Authorization": f"Bearer {self._token[1]}"}

    def _post(self, body: bytes, timeout: float) -> tuple[str, float | None]:
        """One POST: (``ok`` | ``rejected`` | ``too_large`` | ``retry``, the answer's numeric Retry-After seconds or
        None)."""
        try:
            headers = {**self._headers, **self._auth()}
        except (OSError, ValueError) as exc:
            self._error("token_file", None, type(exc).__name__)
            return "retry", None
        try:
            r = self._client.post(self.url, content=body, headers=headers, timeout=timeout)
        except httpx.TimeoutException as exc:
            self._error("timeout", None, type(exc).__name__)
            return "retry", None
        except httpx.TransportError as exc:
            self._error("connect", None, type(exc).__name__)
            return "retry", None
        except Exception as exc:  # noqa: BLE001 - the shipping thread must outlive anything
            self._error("other", None, type(exc).__name__)
            return "retry", None
        status = r.status_code
        if 200 <= status < 300:
            return "ok", None
        retry_after: float | None = None
        try:
            retry_after = float(r.headers.get("retry-after", ""))
        except ValueError:
            pass
        self._error("5xx" if status >= 500 else "4xx" if status >= 400 else "other", status, None)
        if status == 413:
            return "too_large", None
        if status in REJECT_STATUSES:
            return "rejected", None
        return "retry", retry_after

    def _error(self, kind: str, status: int | None, error: str | None) -> None:
        self._errors[kind] += 1
        self._last_error = {"kind": kind, "status": status, "error": error}

    def _report(self, force: bool = False) -> None:
        """Log drops and failed sends since the last report, each at most once per `log_interval_s` (any time when
        `force`: the final report)."""
        now = time.monotonic()
        dropped = sum(self._dropped.values())
        if dropped > self._reported["dropped"] and (force or now - self._last_log["dropped"] >= self.log_interval_s):
            self._log.warning("decision_log_dropped", url=self.safe_url, dropped=dropped - self._reported["dropped"],
                              dropped_total=dict(self._dropped), buffer_max=self.buffer_max)
            self._reported["dropped"], self._last_log["dropped"] = dropped, now
        errors = sum(self._errors.values())
        if errors > self._reported["errors"] and (force or now - self._last_log["errors"] >= self.log_interval_s):
            self._log.warning("decision_log_send_failed", url=self.safe_url, failures=errors - self._reported["errors"],
                              last=dict(self._last_error), buffered=len(self._buf) + len(self._inflight))
            self._reported["errors"], self._last_log["errors"] = errors, now


class Tee:
    """A structlog-style logger writing each line to `sink` (a logger of `sidecar.logsinks.logger_factory`) and then
    handing it to `ship` (`Shipper.enqueue`) — also when the sink raised, whose exception then propagates as
    before: every method name structlog may call is the same function."""

    def __init__(self, sink: Any, ship: Callable[[str], None]) -> None:
        write = sink.info

        def both(line: str) -> None:
            try:
                write(line)
            finally:  # the collector still gets the event when the local sink failed (a closed stdout)
                ship(line)

        self.msg = self.log = self.debug = self.info = self.warn = self.warning = both
        self.err = self.error = self.critical = self.exception = self.failure = self.fatal = both


def from_settings(settings: Any, transport: httpx.BaseTransport | None = None) -> Shipper | None:
    """The `Shipper` of `settings` (`sidecar.config.Settings`: ``decision_log_url`` and the other
    ``decision_log_*`` options), None when no URL is set or the decision log is off. Raises what
    `sidecar.stages.http1.client_tls_context` raises for unreadable TLS files."""
    url = getattr(settings, "decision_log_url", None)
    if url is None or settings.decision_log != "on":
        return None
    verify: ssl.SSLContext | bool = True
    if url.scheme == "https":
        from sidecar.stages.http1 import client_tls_context

        verify = client_tls_context(settings.decision_log_ca_bundle, settings.decision_log_client_cert,
                                    settings.decision_log_client_key)
    return Shipper(str(url), instance=settings.decision_log_instance or None,
                   batch_max=settings.decision_log_batch_max, flush_s=settings.decision_log_flush_s,
                   buffer_max=settings.decision_log_buffer_max, timeout_s=settings.decision_log_timeout_s,
                   retry_base_s=settings.decision_log_retry_base_s, retry_max_s=settings.decision_log_retry_max_s,
                   shutdown_s=settings.decision_log_shutdown_s, headers=settings.decision_log_headers,
                   token_file=settings.decision_log_token_file, verify=verify, fmt=settings.decision_log_format,
                   transport=transport)
