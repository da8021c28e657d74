"""Prometheus metrics (prometheus-client), one registry per app, served by `serve_metrics` on a listener of
its own (``METRICS_HOST``:``METRICS_PORT``), never on the API port: counters of Cedar decisions move with
single requests, so an agent that could scrape them would learn about rows it may not read. The same
operator listener serves readiness with its details (``/_memwarden/readyz``: each check, the policy set,
reload errors), which the API port shows only to an operator key.

Series (all prefixed ``memwarden_``; durations in seconds):

- ``requests_total{operation,action,decision,status}`` — one per request, as in the decision log
- ``rows_total{result}`` — rows returned (``allowed``) and dropped by the filter stage: ``denied`` (Cedar),
  ``superseded`` (hidden unless asked for), ``deleted`` (tombstoned or pending), ``unknown`` (not in the ledger),
  ``malformed`` (a backend row whose shape cannot be served)
- ``request_duration_seconds`` — whole pipeline, per request
- ``cedar_decisions_total{action,decision}`` — every Cedar answer (request- and row-level)
- ``cedar_evaluation_errors_total{action,policy}`` — every evaluation error of a policy Cedar reported at
  runtime (an erroring policy is skipped: an erroring forbid lets the request through), shadow mode included;
  an alarm: the gate proves the policies never error on a schema-valid request
- ``cedar_not_applicable_total{action,principal_type}`` — requests the schema makes not applicable (the action
  does not apply to the principal's or the resource's type, or is not declared: an operator key on a tenant
  route, the forgotten-content rule's ``reassert``): denied without asking Cedar; expected traffic, not an error
- ``cedar_batch_duration_seconds`` / ``cedar_batch_size`` — one observation per PDP call
- ``backend_request_duration_seconds{method,outcome}`` — each backend call (outcome ok/error)
- ``ledger_call_duration_seconds{method}`` / ``ledger_errors_total{method}`` — each ledger call
- ``ledger_pool_connections{state}`` — PostgreSQL pool (size/available/waiting), at scrape time
- ``reconciler_runs_total{result}``, ``reconciler_pending_tombstones``,
  ``reconciler_last_run_timestamp_seconds``, ``reconciler_last_success_timestamp_seconds``
- ``policy_reloads_total{result}`` (ok, unchanged, invalid, invariant_violation, error),
  ``policy_last_reload_success`` (1/0), ``policy_set_info{sha256}``
- ``shadow_mode`` (0 enforce, 1 shadow mode ``reads``, 2 shadow mode ``all``), ``shadow_would_deny_total{action}``
- ``ready`` — 1 when the last readyz answered 200
- ``decision_log_shipped_total``, ``decision_log_dropped_total{reason}``, ``decision_log_send_errors_total{kind}``,
  ``decision_log_buffered`` — the decision log's HTTP sink, when configured (`watch_decision_log`)

Foreign exceptions are not swallowed by the wrappers: they are counted and re-raised, so the
pipeline's outer guard still denies (fail closed).
"""

from __future__ import annotations

import inspect
import json
import socket
import threading
import time
from collections import Counter as Tally
from functools import wraps
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE_LATEST", "InstrumentedLedger", "Metrics", "instrument_upstream"]

_FAST = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_SLOW = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The sidecar's metric families on a private `CollectorRegistry` (several apps per process in tests)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("memwarden_requests", "Requests by operation, action, decision and HTTP status",
                                ["operation", "action", "decision", "status"], registry=r)
        self.rows = Counter("memwarden_rows", "Rows returned (allowed) and dropped by the filter stage "
                            "(denied, superseded, deleted, unknown)", ["result"], registry=r)
        self.request_duration = Histogram("memwarden_request_duration_seconds", "Whole-pipeline latency per request",
                                          buckets=_SLOW, registry=r)
        self.cedar_decisions = Counter("memwarden_cedar_decisions", "Cedar answers by action and decision",
                                       ["action", "decision"], registry=r)
        self.cedar_evaluation_errors = Counter("memwarden_cedar_evaluation_errors",
                                               "Cedar evaluation errors at runtime, by action and erroring policy",
                                               ["action", "policy"], registry=r)
        self.cedar_not_applicable = Counter("memwarden_cedar_not_applicable",
                                            "Requests the schema makes not applicable (denied without Cedar), by action "
                                            "and principal type", ["action", "principal_type"], registry=r)
        self.cedar_batch = Histogram("memwarden_cedar_batch_duration_seconds", "Latency of one PDP call (a batch)",
                                     buckets=_FAST, registry=r)
        self.cedar_batch_size = Histogram("memwarden_cedar_batch_size", "Cedar requests per PDP call",
                                          buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=r)
        self.backend = Histogram("memwarden_backend_request_duration_seconds", "Latency of one backend call",
                                 ["method", "outcome"], buckets=_SLOW, registry=r)
        self.ledger = Histogram("memwarden_ledger_call_duration_seconds", "Latency of one ledger call (one transaction)",
                                ["method"], buckets=_FAST, registry=r)
        self.ledger_errors = Counter("memwarden_ledger_errors", "Ledger calls that raised", ["method"], registry=r)
        self.ledger_pool = Gauge("memwarden_ledger_pool_connections", "PostgreSQL pool connections by state",
                                 ["state"], registry=r)
        self.reconciler_runs = Counter("memwarden_reconciler_runs", "Reconciler runs by result", ["result"], registry=r)
        self.reconciler_pending = Gauge("memwarden_reconciler_pending_tombstones",
                                        "Tombstones whose backend delete is not confirmed (at the last run)", registry=r)
        self.reconciler_last_run = Gauge("memwarden_reconciler_last_run_timestamp_seconds", "Unix time of the last run",
                                         registry=r)
        self.reconciler_last_success = Gauge("memwarden_reconciler_last_success_timestamp_seconds",
                                             "Unix time of the last successful run", registry=r)
        self.policy_reloads = Counter("memwarden_policy_reloads", "Policy reload attempts by result", ["result"], registry=r)
        self.policy_last_reload_ok = Gauge("memwarden_policy_last_reload_success",
                                           "1 if the last reload attempt was applied (or nothing changed), 0 if rejected",
                                           registry=r)
        self.policy_set = Gauge("memwarden_policy_set_info", "The policy set in force (value 1)", ["sha256"], registry=r)
        self.shadow_mode = Gauge("memwarden_shadow_mode", "Cedar denials logged but NOT enforced: 0 never (enforce), "
                                 "1 of reads (SHADOW_MODE=reads), 2 of every action (SHADOW_MODE=all)", registry=r)
        self.shadow_would_deny = Counter("memwarden_shadow_would_deny", "Denials not enforced because of shadow mode",
                                         ["action"], registry=r)
        self.ready = Gauge("memwarden_ready", "1 when the last readiness check passed", registry=r)
        self.policy_last_reload_ok.set(1)
        # Label children bound on first use (prometheus-client's `labels()` takes a lock and builds a tuple
        # per call), found again by their label values: a bounded set (row results; the routes' operations,
        # actions, decisions and statuses). These families are never `clear()`ed or `remove()`d, so a bound
        # child is the one `labels()` would return; a series still appears only once it is counted.
        self._rows_by_result: dict[str, Any] = {}
        self._requests_by_labels: dict[tuple[Any, Any, Any, Any], Any] = {}
        self._cedar_by_labels: dict[tuple[str, bool], Any] = {}

    # -- observations -----------------------------------------------------------------------
    def observe_exchange(self, ex: Any, status: int) -> None:
        """Count one finished request (an `Exchange`) and its rows."""
        labels = (ex.operation, ex.action or "none", ex.decision or "none", status)
        child = self._requests_by_labels.get(labels)
        if child is None:
            child = self._requests_by_labels[labels] = self.requests.labels(*labels[:3], str(status))
        child.inc()
        # The row counts by result; most are 0 (a request counts nothing for them).
        for result, n in (("allowed", ex.rows_allowed), ("denied", ex.rows_denied),
                          ("superseded", ex.rows_hidden_superseded), ("deleted", ex.rows_hidden_deleted),
                          ("unknown", ex.rows_unknown), ("malformed", ex.rows_malformed)):
            if n:
                self._row_child(result).inc(n)
        self.request_duration.observe(ex.elapsed_us() / 1e6)

    def _row_child(self, result: str) -> Any:
        row_child = self._rows_by_result.get(result)
        if row_child is None:
            row_child = self._rows_by_result[result] = self.rows.labels(result)
        return row_child

    def _cedar_child(self, action: str, allowed: bool) -> Any:
        child = self._cedar_by_labels.get((action, allowed))
        if child is None:
            child = self._cedar_by_labels[(action, allowed)] = self.cedar_decisions.labels(
                action, "allow" if allowed else "deny")
        return child

    def observe_cedar(self, actions: list[str], allowed: list[bool], seconds: float) -> None:
        """One PDP call: its duration (`seconds`), its size and one count per answer by (action, decision)."""
        self.cedar_batch.observe(seconds)
        self.cedar_batch_size.observe(len(actions))
        if len(actions) == 1 and len(allowed) == 1:  # a request-level decision: no tally to build
            self._cedar_child(actions[0], bool(allowed[0])).inc()
            return
        for (action, ok), n in Tally(zip(actions, allowed)).items():
            self._cedar_child(action, bool(ok)).inc(n)

    def observe_cedar_one(self, action: str, allowed: Any, seconds: float) -> None:
        """``observe_cedar([action], [allowed], seconds)``: a PDP call of one request (a request-level
        decision, ``bool(allowed)``) taking `seconds`."""
        self.cedar_batch.observe(seconds)
        self.cedar_batch_size.observe(1)
        self._cedar_child(action, bool(allowed)).inc()

    def set_policy_set(self, sha256: str) -> None:
        self.policy_set.clear()
        self.policy_set.labels(sha256).set(1)

    def watch_pool(self, source: Callable[[], dict[str, int]]) -> None:
        """Read PostgreSQL pool statistics from `source` at every scrape (0 when it fails)."""
        def reader(key: str) -> Callable[[], float]:
            def read() -> float:
                try:
                    return float(source().get(key, 0))
                except Exception:
                    return 0.0
            return read

        for state, key in (("size", "pool_size"), ("available", "pool_available"), ("waiting", "requests_waiting")):
            self.ledger_pool.labels(state).set_function(reader(key))

    def watch_decision_log(self, source: Callable[[], dict[str, Any]]) -> None:
        """Export the decision log's HTTP sink counts (`sidecar.logship.Shipper.stats`), read from `source` at every
        scrape: ``memwarden_decision_log_shipped_total`` (events the collector took),
        ``memwarden_decision_log_dropped_total{reason}`` (``buffer_full``: pushed out of the full buffer, oldest
        first; ``rejected``: refused by the collector for their content; ``shutdown``: unsent at the shutdown
        deadline), ``memwarden_decision_log_send_errors_total{kind}`` (failed POSTs: ``connect``, ``timeout``,
        ``4xx``, ``5xx``, ``token_file``, ``other``) and ``memwarden_decision_log_buffered`` (events waiting)."""
        self.registry.register(_DecisionLogCollector(source))

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry)


class _DecisionLogCollector(Collector):
    """The series of `Metrics.watch_decision_log`, from its source's counts at scrape time (none when it fails)."""

    def __init__(self, source: Callable[[], dict[str, Any]]) -> None:
        self._source = source

    def describe(self) -> Iterable[Metric]:
        return []  # no describe-time collection: the source is read at scrape time only

    def collect(self) -> Iterable[Metric]:
        try:
            stats = self._source()
        except Exception:  # noqa: BLE001 - a scrape never fails for it
            return
        shipped = CounterMetricFamily("memwarden_decision_log_shipped", "Decision events the HTTP collector took")
        shipped.add_metric([], stats["shipped"])
        dropped = CounterMetricFamily("memwarden_decision_log_dropped", "Decision events dropped by the HTTP sink, by "
                                      "reason (buffer_full, rejected, shutdown)", labels=["reason"])
        for reason, n in stats["dropped"].items():
            dropped.add_metric([reason], n)
        errors = CounterMetricFamily("memwarden_decision_log_send_errors", "Failed POSTs of decision-event batches, "
                                     "by kind", labels=["kind"])
        for kind, n in stats["send_errors"].items():
            errors.add_metric([kind], n)
        buffered = GaugeMetricFamily("memwarden_decision_log_buffered", "Decision events waiting to be shipped")
        buffered.add_metric([], stats["buffered"])
        yield from (shipped, dropped, errors, buffered)



class InstrumentedLedger:
    """A `Ledger` that times every method call into `metrics` and otherwise delegates unchanged.

    A public method's timed wrapper is made on first use and stored on the instance, so later calls
    find it by plain attribute lookup (no `__getattr__` per call); other attributes (``_private``, data
    such as ``blocking_io``) are read from `inner` at every access, as they may change."""

    stable_methods = True  # a method looked up once stays this object's (`sidecar.ledger.cache.CachingLedger`)

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        self._inner = inner
        self._metrics = metrics
        self._wrapped: dict[str, Callable[..., Any]] = {}

    @property
    def inner(self) -> Any:
        return self._inner

    @property
    def blocking_io(self) -> Any:
        """`inner`'s ``blocking_io`` (False when it has none): read by `sidecar.ledger.offloop.blocking`."""
        return getattr(self._inner, "blocking_io", False)

    @property
    def async_io(self) -> Any:
        """`inner`'s ``async_io`` (False when it has none): read by `sidecar.ledger.offloop.asynchronous`."""
        return getattr(self._inner, "async_io", False)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        cached = self._wrapped.get(name)
        if cached is not None:
            return cached
        label = name.removesuffix("_async")  # the asynchronous twin of a method counts as that method
        histogram = self._metrics.ledger.labels(label)
        errors = self._metrics.ledger_errors

        if inspect.iscoroutinefunction(attr):
            @wraps(attr)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await attr(*args, **kwargs)
                except Exception:
                    errors.labels(label).inc()
                    raise
                finally:
                    histogram.observe(time.perf_counter() - t0)

            self._wrapped[name] = self.__dict__[name] = timed_async
            return timed_async

        @wraps(attr)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            except Exception:
                errors.labels(label).inc()
                raise
            finally:
                histogram.observe(time.perf_counter() - t0)

        self._wrapped[name] = self.__dict__[name] = timed
        return timed


def instrument_upstream(upstream: Any, metrics: Metrics) -> None:
    """Time every `upstream.call` (the backend client) into ``backend_request_duration_seconds``."""
    call = upstream.call
    # The label children bound on first use per (method, outcome), as `Metrics` does for its own families:
    # this family is never cleared, so a bound child is the one `labels()` would return.
    children: dict[tuple[str, str], Any] = {}
    clock = time.perf_counter

    def observe(method: str, outcome: str, seconds: float) -> None:
        child = children.get((method, outcome))
        if child is None:
            child = children[(method, outcome)] = metrics.backend.labels(method, outcome)
        child.observe(seconds)

    @wraps(call)
    async def timed(method: str, *args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            result = await call(method, *args, **kwargs)
        except BaseException:
            observe(method, "error", clock() - t0)
            raise
        observe(method, "ok", clock() - t0)
        return result

    upstream.call = timed


def instrument_reconciler(profile: Any, ledger: Any, metrics: Metrics) -> None:
    """Count every `profile.reconcile()` run (ok/error) and record the pending tombstones after it."""
    import sys

    reconcile = profile.reconcile
    backend = getattr(sys.modules.get(type(profile).__module__), "BACKEND", None)

    @wraps(reconcile)
    async def counted(*args: Any, **kwargs: Any) -> Any:
        now = time.time()
        metrics.reconciler_last_run.set(now)
        try:
            result = await reconcile(*args, **kwargs)
        except Exception:
            metrics.reconciler_runs.labels("error").inc()
            raise
        finally:
            if backend is not None:
                try:
                    metrics.reconciler_pending.set(len(ledger.pending_tombstones(backend)))
                except Exception:
                    pass
        metrics.reconciler_runs.labels("ok").inc()
        metrics.reconciler_last_success.set(now)
        return result

    profile.reconcile = counted


READYZ_PATH = "/_memwarden/readyz"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """No access log on stderr (as prometheus-client's own server)."""


def serve_metrics(metrics: Metrics, host: str, port: int,
                  readyz: Callable[[], tuple[bool, dict[str, Any]]] | None = None) -> Callable[[], None]:
    """Start the operator listener on `host`:`port` (a thread per request; stdlib ``wsgiref`` serving
    prometheus-client's WSGI app): ``GET /_memwarden/readyz`` answers `readyz()` — (ready, details) — as JSON,
    200 or 503; every other path the Prometheus exposition text. Returns a function that stops it. Raises
    OSError when the address is taken or cannot be resolved."""
    exposition = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if readyz is not None and environ.get("PATH_INFO") == READYZ_PATH:
            ready, details = readyz()
            body = json.dumps(details).encode()
            start_response("200 OK" if ready else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        return exposition(environ, start_response)  # type: ignore[no-any-return]

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = family

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="memwarden-metrics", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    return stop
