"""The pipeline entry of `sidecar.app` (`MemwardenApp.__call__`, `PipelineMiddleware`) as it was before the
answer was written on uvicorn's cycle in one go: the reference of `tests/unit/test_entry_direct_write.py`
(the same bytes on the wire). Not used by the sidecar."""

from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar.app import INTERNAL_ROUTES
from sidecar.metrics import Metrics
from sidecar.pipeline import Pipeline


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
            payload = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        except (ValueError, TypeError, RecursionError):  # never a partial body: no rows at all
            status, payload = 500, b'{"error":"internal","message":"internal error"}'
            ex.decision, ex.reason = "error", "internal_error"
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                   (b"x-request-id", ex.request_id.encode())]
        if status == 408:  # the rest of the body may still be on its way: do not read it as a next request
            headers.append((b"connection", b"close"))
        try:
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
