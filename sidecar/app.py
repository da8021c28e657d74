"""ASGI application: `create_app(settings)` wires ledger, PDP, backend profile and pipeline.

Routes: ``/_memwarden/healthz`` (process up), ``/_memwarden/readyz`` (ledger, policies, backend, not
draining: 200 or 503 with ``{"ready": …}`` only; the details — each check, the policy set in force, reload
errors, the mode — to an operator key, and on the metrics listener, `readiness`); everything else goes
through the pipeline, including the authenticated
``/_memwarden/memories/{id}/lineage`` (`sidecar.lineage`). Prometheus metrics are served on a separate
listener (``METRICS_HOST``:``METRICS_PORT``), never on the API port.

`create_app` admits the policy set through the same gate as every reload (`sidecar.policy_reload.admit`:
parse, schema validation, every invariant including the package's baseline, the policy unit tests) and
raises `PolicyRefused` (a `PolicyLoadError`) when it fails: no app is built, so a refused set never
serves a request, whichever way the app is started.
"""

from __future__ import annotations

import asyncio
import json
import signal
from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpx
import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar import decisionlog, logship
from sidecar.answer import answer_bytes
from sidecar.backends.chroma import ChromaProfile
from sidecar.backends.mem0 import Mem0Profile
from sidecar.config import Settings, backend_tls_context
from sidecar.identity import Identity
from sidecar.ledger import Ledger, ledger_from_settings, offloop
from sidecar.ledger.cache import CachingLedger
from sidecar.ledger.postgres import PostgresLedger
from sidecar.ledger.sqlite import SQLiteLedger
from sidecar.logship import Shipper
from sidecar.metrics import (InstrumentedLedger, Metrics, instrument_reconciler,
                              instrument_upstream)
from sidecar.pipeline import Pipeline
from sidecar.policy_reload import PolicyHandle
from sidecar.stages.authorize import Authorizer
from sidecar.stages.canonicalize import credential
from sidecar.stages.forward import Upstream
from sidecar.tls import ServerTls

# Unauthenticated probes served by FastAPI; every other path (``/_memwarden/memories/…`` and
# ``/_memwarden/metrics`` included) goes through the pipeline, which authenticates first. Prometheus
# metrics have their own listener (`sidecar.metrics.serve_metrics`, started by ``memwarden serve``).
INTERNAL_ROUTES = frozenset({b"/_memwarden/healthz", b"/_memwarden/readyz"})


class Services:
    """Everything a request needs, built once at start-up."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None,
                 ledger: Ledger | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.policy = PolicyHandle(settings.policies_dir, self.metrics, shadow=settings.shadow_mode,
                                   invariants_dir=settings.invariants_dir, check_timeout_s=settings.policy_check_timeout_s)
        raw_ledger = ledger or ledger_from_settings(settings)
        if getattr(raw_ledger, "blocking_io", False) and not settings.ledger_off_loop:
            raw_ledger.blocking_io = False  # inline PostgreSQL calls (`ledger_off_loop`)
        if getattr(raw_ledger, "async_io", False) and not settings.ledger_async:
            raw_ledger.async_io = False  # hot-path reads through the synchronous pool too (`ledger_async`)
        if hasattr(raw_ledger, "pool_stats"):
            self.metrics.watch_pool(raw_ledger.pool_stats)
        instrumented = InstrumentedLedger(raw_ledger, self.metrics)
        # Keys, collections and agents from memory while nothing changed (`sidecar.ledger.cache`); keys
        # are never cached on PostgreSQL, where a notification from another replica may be in flight.
        # The token (SQLite: PRAGMA data_version and the connection's write count; PostgreSQL: the count of
        # notifications received, None while the channel is down or a notification waits unread) is read once
        # per request (`request_scope`).
        self.ledger: Ledger = CachingLedger(instrumented, raw_ledger.cache_version, settings.ledger_cache_ttl_s,
                                            cache_keys=not settings.ledger_url,
                                            per_request=isinstance(raw_ledger, (SQLiteLedger, PostgresLedger))) \
            if hasattr(raw_ledger, "cache_version") and settings.ledger_cache_ttl_s > 0 else instrumented
        self.upstream = Upstream(
            str(settings.backend_url), timeout_s=settings.backend_timeout_s,
            max_connections=settings.backend_max_connections, auth_header=settings.backend_auth_header,
            token=settings.backend_token, transport=transport,
            max_response_bytes=settings.backend_max_response_bytes, ssl_context=backend_tls_context(settings),
        )
        instrument_upstream(self.upstream, self.metrics)
        self.authz = Authorizer(self.policy, self.ledger)
        profile_cls = Mem0Profile if settings.backend == "mem0" else ChromaProfile
        self.profile = profile_cls(settings, self.upstream, self.ledger, self.authz)
        self.pipeline = Pipeline(self.profile, self.ledger, settings.max_body_bytes, self.authz,
                                 max_json_depth=settings.max_json_depth, body_timeout_s=settings.body_timeout_s)
        instrument_reconciler(self.profile, self.ledger, self.metrics)
        # Inbound TLS (`sidecar.tls`: the listener's context, reloaded in place) and credentials besides API keys
        # (`sidecar.identity`); both None unless configured. Raises `TlsConfigError` / `JwtConfigError`.
        self.tls: ServerTls | None = None
        if settings.tls_cert is not None and settings.tls_key is not None:
            self.tls = ServerTls(settings.tls_cert, settings.tls_key, settings.tls_client_ca, settings.tls_client_auth,
                                 settings.tls_client_principals)
        self.identity = Identity.from_settings(settings, self.authz, self.tls)
        self.pipeline.identity = self.identity
        self.draining = False  # set on SIGTERM (`sidecar.drain`): readiness fails, requests are still served
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving event loop, while the app runs
        self.shipper: Shipper | None = None  # the decision log's HTTP sink (`create_app`), None unless configured

    def readiness_report(self, timeout_s: float = 30.0) -> tuple[bool, dict[str, object]]:
        """`readiness` from another thread (the metrics listener's): run on the serving event loop, waited
        for at most `timeout_s` seconds; (False, a body saying so) while no loop serves."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return False, {"ready": False, "starting_or_stopped": True}
        try:
            return asyncio.run_coroutine_threadsafe(readiness(self), loop).result(timeout_s)
        except Exception as exc:  # noqa: BLE001 - the loop stopped, or the checks did not finish in time
            return False, {"ready": False, "error": type(exc).__name__}


async def readiness(services: Services) -> tuple[bool, dict[str, object]]:
    """(ready, details): ready when the ledger answers, a policy set is loaded, the backend answers its
    heartbeat and the process is not draining (SIGTERM). The details name each check, the policy set in
    force (`PolicyHandle.status`: digest, counts, the last reload error and its problems, which name paths)
    and the mode; they are for operators only (an operator key on the API port, or the metrics listener).
    Sets the ``memwarden_ready`` gauge."""
    checks = {"ledger": False, "policies": True, "backend": False}
    try:
        checks["ledger"] = services.ledger.ping()
    except Exception:
        checks["ledger"] = False
    try:
        await services.upstream.call("GET", getattr(services.profile, "health_segments", ["api", "v2", "heartbeat"]))
        checks["backend"] = True
    except Exception:
        checks["backend"] = False
    checks["policies"] = services.policy.engine is not None
    ready = all(checks.values()) and not services.draining
    services.metrics.ready.set(1 if ready else 0)
    body: dict[str, object] = {"ready": ready, "checks": checks, "draining": services.draining,
                               "policy": services.policy.status(), "mode": services.policy.mode,
                               "decision_log": services.settings.decision_log}
    if services.shipper is not None:
        body["decision_log_shipping"] = {"url": services.shipper.safe_url, **services.shipper.stats()}
    if services.policy.shadow_mode == "reads":
        body["warning"] = ("SHADOW MODE (reads): Cedar denials of read, list and search are logged but NOT enforced; "
                           "writes, updates and deletes are")
    elif services.policy.shadow_mode == "all":
        body["warning"] = ("SHADOW MODE (all): Cedar denials are logged but NOT enforced, writes and deletes included: "
                           "data the policies protect can be overwritten or destroyed")
    return ready, body


async def _operator(services: Services, request: Request) -> bool:
    """Whether `request` carries a valid operator key (``X-API-Key`` or ``Authorization: Bearer``, as the
    pipeline reads them); False for none, any other key, an ambiguous credential or a ledger that does not answer."""
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    try:
        key = credential(headers)
        if key is None:
            return False
        principal = await offloop.authenticate(services.ledger, key)
    except Exception:  # noqa: BLE001 - a refused credential (Unauthorized), the ledger down: no details
        return False
    return principal is not None and principal.kind == "operator"


def create_app(settings: Settings | None = None, *, transport: httpx.AsyncBaseTransport | None = None,
               ledger: Ledger | None = None) -> FastAPI:
    """Build the sidecar app. Raises `PolicyRefused` (a `PolicyLoadError`) if the policy set does not pass the gate."""
    settings = settings or Settings()
    # The HTTP sink of the decision log (`sidecar.logship`), beside stdout or the file: fed by the decision writer,
    # shipped by its own thread from the lifespan's start to its end (a final flush with a deadline).
    shipper = logship.from_settings(settings)
    if not decisionlog.configure(settings.log_level, settings.decision_log_sink, settings.decision_log_path,
                                 settings.decision_log_max_bytes, settings.decision_log_backups,
                                 tuple(f.strip() for f in settings.decision_log_mask.split(",") if f.strip()),
                                 decision_log=settings.decision_log == "on",
                                 ship=shipper.enqueue if shipper is not None else None) and shipper is not None:
        shipper.close(0)  # the decision log was configured by an earlier app of this process: nothing would reach it
        shipper = None
    if settings.decision_log == "off":
        decisionlog.structlog.get_logger("memwarden").error(
            "decision_log_off", message="MEMWARDEN_DECISION_LOG=off: no decision events are written (no audit trail)")
    services = Services(settings, transport, ledger)
    services.shipper = shipper
    if shipper is not None:
        services.metrics.watch_decision_log(shipper.stats)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if shipper is not None:
            shipper.start()
        try:
            await services.profile.reconcile()
        except Exception:  # backend down at start: tombstones stay pending, rows stay hidden
            decisionlog.structlog.get_logger("memwarden").warning("reconcile_failed")
        if offloop.asynchronous(services.ledger):
            await services.ledger.open_async()  # the asynchronous pool lives in this loop
        services.loop = asyncio.get_running_loop()
        tasks = _start_policy_reload(services)
        if settings.reconcile_interval_s > 0:
            tasks.append(asyncio.create_task(_reconcile_forever(services, settings.reconcile_interval_s)))
        if settings.ledger_analyze_interval_s > 0 and hasattr(services.ledger, "refresh_statistics"):
            tasks.append(asyncio.create_task(_refresh_statistics_forever(services, settings.ledger_analyze_interval_s)))
        if settings.erase_interval_s > 0 and settings.erase_data_path is not None:
            from sidecar.erase.schedule import purge_forever

            tasks.append(asyncio.create_task(purge_forever(services.ledger, settings.erase_data_path, settings.erase_interval_s)))
        yield
        services.loop = None
        for task in tasks:
            task.cancel()
        await services.upstream.close()
        await offloop.aclose(services.ledger)
        if shipper is not None:  # after the last request: its decision event is in the buffer
            await asyncio.to_thread(shipper.close)

    app = MemwardenApp(title="memwarden", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = services

    @app.get("/_memwarden/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/_memwarden/readyz")
    async def readyz(request: Request) -> JSONResponse:
        ready, details = await readiness(services)
        body = details if await _operator(services, request) else {"ready": ready}
        return JSONResponse(body, status_code=200 if ready else 503)

    app.add_middleware(PipelineMiddleware, pipeline=services.pipeline, metrics=services.metrics,
                       max_inflight=settings.max_inflight_requests)
    app.pipeline_entry = PipelineMiddleware(None, services.pipeline, metrics=services.metrics,  # type: ignore[arg-type]
                                            max_inflight=settings.max_inflight_requests)
    return app


class MemwardenApp(FastAPI):
    """The FastAPI app, entered directly by pipeline traffic: an HTTP request whose raw path is not one of
    `INTERNAL_ROUTES` goes straight to `pipeline_entry` (a `PipelineMiddleware`) instead of through
    Starlette's middleware stack (its error middleware, FastAPI's telemetry and body-limit layers, the
    router), none of which acts on a request the pipeline answers. An exception escaping the pipeline
    entry is answered as Starlette's error middleware answers it (500 ``Internal Server Error`` unless a
    response was started) and re-raised for the server to log. Everything else (the probes, WebSockets,
    lifespan) goes through FastAPI, where the same `PipelineMiddleware` is the outermost user layer."""

    pipeline_entry: "PipelineMiddleware | None" = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.pipeline_entry
        if entry is None or scope["type"] != "http" or \
                (scope.get("raw_path") or scope.get("path", "").encode("latin-1", "replace")) in INTERNAL_ROUTES:
            await super().__call__(scope, receive, send)
            return
        started = False

        async def _send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await entry(scope, receive, _send)
        except Exception:
            if not started:
                await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
            raise


class PipelineMiddleware:
    """Outermost ASGI layer: every HTTP request whose raw path is not one of `INTERNAL_ROUTES` goes
    through the pipeline — before any framework routing, so no path form (newlines, unmatched
    characters, any method) can be answered by anything but the pipeline."""

    def __init__(self, app: ASGIApp, pipeline: Pipeline, metrics: Metrics | None = None,
                 max_inflight: int | None = None) -> None:
        self.app = app
        self.pipeline = pipeline
        self.metrics = metrics
        self.max_inflight = max_inflight
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no WebSocket routes: refuse before any framework sees it
            await receive()
            await send({"type": "websocket.close", "code": 1008})
            return
        raw = scope.get("raw_path") or scope.get("path", "").encode("latin-1", "replace")
        if scope["type"] != "http" or raw in INTERNAL_ROUTES:
            await self.app(scope, receive, send)
            return
        if self.max_inflight is not None and self.inflight >= self.max_inflight:
            # Over the in-flight bound: answered at once, before authentication or any backend call.
            payload = json.dumps({"error": "overloaded", "message": "too many requests in flight; retry"}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                (b"retry-after", b"1"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": payload})
            return
        self.inflight += 1
        try:
            status, body, ex = await self.pipeline.run(dict(scope), receive)
        finally:
            self.inflight -= 1
        try:
            payload = answer_bytes(body)  # the standard library's bytes (orjson where provably the same)
        except (ValueError, TypeError, RecursionError):  # never a partial body: no rows at all
            status, payload = 500, b'{"error":"internal","message":"internal error"}'
            ex.decision, ex.reason = "error", "internal_error"
        request_id = ex.request_id.encode()
        try:
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                       (b"x-request-id", request_id)]
            if status == 408:  # the rest of the body may still be on its way: do not read it as a next request
                headers.append((b"connection", b"close"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
        finally:
            # The decision event and the metrics come after the answer has been handed to the connection
            # (uvicorn's send writes to the socket before returning), off the caller's wait; also when the
            # client went away mid-send. Neither can change the answer.
            self.pipeline.record(ex, status)
            if self.metrics is not None:
                try:
                    self.metrics.observe_exchange(ex, status)
                except Exception:  # metrics never change the answer already decided
                    pass


def _start_policy_reload(services: Services) -> list[asyncio.Task[None]]:
    """Hot reload: SIGHUP (where the loop allows signal handlers) and, unless the interval is 0, a watcher; of the
    policy set and, with TLS, of the listener's certificate and client-principal map (`sidecar.tls`)."""
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []

    def on_sighup() -> None:
        tasks.append(loop.create_task(asyncio.to_thread(services.policy.reload)))  # type: ignore[arg-type]
        if services.tls is not None:  # in the loop: no handshake runs while the live context is loaded
            services.tls.reload(force=True)

    try:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        pass
    if services.settings.policy_watch_interval_s > 0:
        tasks.append(loop.create_task(services.policy.watch(services.settings.policy_watch_interval_s)))
    if services.tls is not None and services.settings.tls_reload_interval_s > 0:
        tasks.append(loop.create_task(services.tls.watch(services.settings.tls_reload_interval_s)))
    return tasks


async def _refresh_statistics_forever(services: "Services", interval_s: float) -> None:
    """At start-up and every `interval_s`: ANALYZE the PostgreSQL ledger's tables whose planner statistics are
    missing or stale (`PostgresLedger.refresh_statistics`), in a worker thread. A failure is logged and
    retried at the next interval; requests never wait for it."""
    log = structlog.get_logger("memwarden.ledger")
    while True:
        try:
            analyzed = await offloop.call(services.ledger, services.ledger.refresh_statistics)
            if analyzed:
                log.info("ledger_statistics_refreshed", tables=analyzed)
        except Exception as exc:  # ledger down, or not the tables' owner: plans stay as they are
            log.warning("ledger_statistics_refresh_failed", error=type(exc).__name__)
        await asyncio.sleep(interval_s)


async def _reconcile_forever(services: "Services", interval_s: float) -> None:
    """Retry pending backend deletes and re-delete tombstoned rows that reappeared, every `interval_s`."""
    log = structlog.get_logger("memwarden.reconciler")
    while True:
        await asyncio.sleep(interval_s)
        try:
            await services.profile.reconcile()
        except Exception as exc:  # the backend may be down: tombstones stay pending, rows stay hidden
            log.warning("reconcile_failed", error=type(exc).__name__)
