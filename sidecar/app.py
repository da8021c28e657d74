"""ASGI application: `create_app(settings)` wires ledger, PDP, backend profile and pipeline.

Routes: ``/_memwarden/healthz`` (process up), ``/_memwarden/readyz`` (ledger, policies, backend);
everything else goes through the pipeline. Start-up fails (PolicyLoadError) when the policy set or
schema does not load.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from sidecar import decisionlog
from sidecar.backends.chroma import ChromaProfile
from sidecar.config import Settings
from sidecar.ledger import Ledger, ledger_from_settings
from sidecar.pipeline import Pipeline
from sidecar.policy import PolicyEngine
from sidecar.stages.authorize import Authorizer
from sidecar.stages.forward import Upstream

INTERNAL_PREFIX = b"/_memwarden/"


class Services:
    """Everything a request needs, built once at start-up."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None,
                 ledger: Ledger | None = None) -> None:
        self.settings = settings
        self.engine = PolicyEngine.load(settings.policies_dir)
        self.ledger = ledger or ledger_from_settings(settings)
        self.upstream = Upstream(
            str(settings.backend_url), timeout_s=settings.backend_timeout_s,
            max_connections=settings.backend_max_connections, auth_header=settings.backend_auth_header,
            token=settings.backend_token, transport=transport,
        )
        self.authz = Authorizer(self.engine, self.ledger)
        self.profile = ChromaProfile(settings, self.upstream, self.ledger, self.authz)
        self.pipeline = Pipeline(self.profile, self.ledger, settings.max_body_bytes)


def create_app(settings: Settings | None = None, *, transport: httpx.AsyncBaseTransport | None = None,
               ledger: Ledger | None = None) -> FastAPI:
    """Build the sidecar app. Raises `PolicyLoadError` if policies/schema do not load."""
    settings = settings or Settings()
    decisionlog.configure(settings.log_level)
    services = Services(settings, transport, ledger)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await services.profile.reconcile()
        except Exception:  # backend down at start: tombstones stay pending, rows stay hidden
            decisionlog.structlog.get_logger("memwarden").warning("reconcile_failed")
        yield
        await services.upstream.close()

    app = FastAPI(title="memwarden", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = services

    @app.get("/_memwarden/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/_memwarden/readyz")
    async def readyz() -> JSONResponse:
        checks = {"ledger": False, "policies": True, "backend": False}
        try:
            checks["ledger"] = services.ledger.ping()
        except Exception:
            checks["ledger"] = False
        try:
            await services.upstream.call("GET", ["api", "v2", "heartbeat"])
            checks["backend"] = True
        except Exception:
            checks["backend"] = False
        ready = all(checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    app.add_middleware(PipelineMiddleware, pipeline=services.pipeline)
    return app


class PipelineMiddleware:
    """Outermost ASGI layer: every HTTP request whose raw path is not under ``/_memwarden/`` goes
    through the pipeline — before any framework routing, so no path form (newlines, unmatched
    characters, any method) can be answered by anything but the pipeline."""

    def __init__(self, app: ASGIApp, pipeline: Pipeline) -> None:
        self.app = app
        self.pipeline = pipeline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") or scope.get("path", "").encode("latin-1", "replace")
        if scope["type"] != "http" or raw.startswith(INTERNAL_PREFIX):
            await self.app(scope, receive, send)
            return
        status, body, ex = await self.pipeline.run(dict(scope), receive)
        payload = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
            (b"x-request-id", ex.request_id.encode()),
        ]})
        await send({"type": "http.response.body", "body": payload})
