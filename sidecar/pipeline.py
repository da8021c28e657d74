"""The request pipeline of docs/design.md §1 and its fail-closed outer guard.

    canonicalize → authenticate → route (``/_memwarden/memories/{id}/lineage``: `sidecar.lineage`) → [profile: authorize → rewrite → forward → filter] → record

`Pipeline.run` never raises: a `MemwardenError` becomes its status and JSON body; any other
exception becomes 500 with no backend data (fail closed, cf. starlette's ServerErrorMiddleware —
not mitmproxy's `safecall`, which continues the flow). Every request yields one decision-log event
whose ``decision`` follows the answer (`outcome`): ``allow`` only for a 2xx the policies allowed,
``deny`` when memwarden refused it (authentication, Cedar, an unknown or hidden row or collection, an
unmapped or blocked route), ``error`` for everything else (bad request, conflict, body too large,
backend failures and the backend's own 4xx, internal errors), each with its ``reason``.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import structlog

from sidecar import decisionlog, lineage
from sidecar.backends.base import Profile
from sidecar.errors import Forbidden, MemwardenError, NotFound, PayloadTooLarge, RequestTimeout, Unauthorized, to_body
from sidecar.exchange import Exchange
from sidecar.ledger import Ledger
from sidecar.ledger.base import parse_key
from sidecar.ledger.cache import enter_request, leave_request
from sidecar.stages import canonicalize
from sidecar.stages.authorize import Authorizer

log = structlog.get_logger("memwarden.pipeline")
# A key id as keys are made (`sidecar.ledger.base.new_key_secret`: 16 hex digits), or any short id of that
# alphabet; another text in a presented key's id position is not logged.
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}").fullmatch


def outcome(exc: MemwardenError, ex: Exchange) -> tuple[str, str]:
    """(decision, reason) of a refused request: the raise site's reason if it named one; for a 403/404
    without one, the reason of the denial or withheld row just before it (Cedar's ``forbid``,
    ``no_permit``, ``evaluation_error``, or ``unknown_row``/``deleted_row``/``superseded_row``); else the
    error class's default (`sidecar.errors`)."""
    if not exc.explicit_reason and isinstance(exc, (Forbidden, NotFound)) and ex.reason:
        return "deny", ex.reason
    return exc.decision, exc.reason


class Pipeline:
    """Ordered stages around one backend profile."""

    def __init__(self, profile: Profile, ledger: Ledger, max_body_bytes: int, authz: Authorizer, *,
                 max_json_depth: int = 32, body_timeout_s: float = 30.0) -> None:
        self.profile = profile
        self.ledger = ledger
        self.authz = authz
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.body_timeout_s = body_timeout_s
        # Credentials besides API keys (`sidecar.identity.Identity`: bearer JWTs, mapped client certificates);
        # None when only API keys are configured (the path below is then the API-key path alone).
        self.identity: Any = None

    async def run(self, scope: dict[str, Any], receive: Any) -> tuple[int, Any, Exchange]:
        """Process one ASGI HTTP request; returns (status, JSON body, exchange). Never raises. The decision
        event is not emitted here: the caller emits it with `record` once the answer is sent."""
        ex = Exchange(method=scope["method"], raw_path=scope.get("raw_path", b"").decode("latin-1"))
        peer = scope.get("client")
        if peer:
            host = str(peer[0])
            ex.client = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
        try:
            # The stages in one ledger request scope (`sidecar.ledger.cache.request_scope`: the caches' token read
            # once per request), entered and left as that context manager does, without its generator.
            scope_token = enter_request()
            try:
                status, body = await self._run_stages(ex, scope, receive)
            finally:
                leave_request(scope_token)
            # A 2xx whose handler recorded a denial (a delete of which no row was permitted) stays a deny.
            if ex.decision == "deny":
                ex.reason = ex.reason or "not_permitted"
            else:
                ex.decision, ex.reason = "allow", None
        except MemwardenError as exc:
            status, body = exc.status, to_body(exc)
            ex.decision, ex.reason = outcome(exc, ex)
        except Exception:  # the outer guard: any unexpected error denies
            log.exception("pipeline_error", request_id=ex.request_id)
            status, body = 500, {"error": "internal", "message": "internal error"}
            ex.decision, ex.reason = "error", "internal_error"
        if ex.decision != "deny":
            ex.deny_action = None  # a denial the request survived (rows filtered out) refused nothing
        return status, body, ex

    def record(self, ex: Exchange, status: int) -> None:
        """Emit the decision event of `ex` answered `status` (`sidecar.decisionlog.record`), under the policy
        set the request was decided by (the current one if it never reached Cedar). The server entry
        (`sidecar.app.PipelineMiddleware`) calls it once per request, after the response was handed to the
        connection, with the status actually sent."""
        policy = self.authz.policy
        mode = getattr(policy, "mode", None) or ("shadow" if policy.shadow else "enforce")
        decisionlog.record(ex, status, policy_sha256=(ex.policy_set or policy.current).sha256, mode=mode)

    async def _run_stages(self, ex: Exchange, scope: dict[str, Any], receive: Any) -> tuple[int, Any]:
        """The stages of one request (`run` enters its ledger request scope)."""
        # 1. canonicalize (target form, path, query, headers; body read under the size and time limits)
        started = time.monotonic()
        ext = (scope.get("extensions") or {}).get("memwarden") or {}
        canonicalize.check_target(ext.get("target"))
        ex.segments = canonicalize.canonical_path(scope.get("raw_path") or scope["path"].encode())
        ex.query = canonicalize.canonical_query(scope.get("query_string", b""))
        headers, ex.stripped_headers = canonicalize.canonical_headers(list(scope.get("headers", [])))
        canonicalize.check_length(headers.get("content-length", []), self.max_body_bytes)
        # 2. authenticate (before the body is read or parsed); the header kind and the key id it names are
        # logged whatever the outcome (a revoked key's id included), never the secret
        api, bearer = "x-api-key" in headers, "authorization" in headers
        ex.auth = ("authorization+x-api-key" if bearer else "x-api-key") if api else "authorization" if bearer else "none"
        key = canonicalize.credential(headers)
        if key is not None:  # the key id an API key names, logged whatever the outcome
            named = parse_key(key)
            if named is not None and _KEY_ID(named[0]) is not None:
                ex.key_id = named[0]
        identity = self.identity
        if identity is not None:  # a bearer JWT, a mapped client certificate, or an API key (`sidecar.identity`)
            principal = await identity.authenticate(ex, key, ext.get("peercert"))
        else:
            if key is None:
                raise Unauthorized("missing API key")
            principal = await self.authz.authenticate(ex, key)
            if principal is None:
                raise Unauthorized("unknown or revoked API key")
        ex.key_id = principal.key_id
        ex.principal = principal
        raw = await self._read_body(receive, started + self.body_timeout_s)
        ctype = headers.get("content-type", [None])[0]
        ex.body = canonicalize.parse_json_body(raw, ctype, self.max_json_depth)
        # 3. route: memwarden's own governed routes, then the profile's; an unmapped route is never forwarded
        if ex.segments[:2] == ["_memwarden", "memories"]:
            if ex.method != "GET" or len(ex.segments) != 4 or ex.segments[3] != "lineage" or not ex.segments[2]:
                raise NotFound("no such route", reason="unmapped_route")
            return 200, lineage.lineage(ex, self.profile, self.ledger, self.authz, ex.segments[2])
        route = self.profile.match(ex.method, ex.segments)
        if route is None:
            raise NotFound("no such route", reason="unmapped_route")
        # 4-7. authorize, rewrite, forward, filter (profile-specific)
        return await self.profile.handle(ex, route)

    async def _read_body(self, receive: Any, deadline: float) -> bytes:
        """The whole body, by `deadline` (``time.monotonic()`` seconds; else `RequestTimeout`, 408) and
        within `max_body_bytes` (else `PayloadTooLarge`, 413)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            # asyncio.timeout, not wait_for: no task per receive (wait_for wraps the coroutine in one).
            # At or past the deadline it is a timeout, as wait_for's zero timeout was.
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                async with asyncio.timeout(remaining):
                    message = await receive()
            except TimeoutError as exc:
                raise RequestTimeout(f"request body not received within {self.body_timeout_s:g} s "
                                     "(MEMWARDEN_BODY_TIMEOUT_S)") from exc
            if message["type"] == "http.disconnect":
                raise MemwardenError("client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise PayloadTooLarge(f"body over {self.max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
