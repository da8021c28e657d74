"""Stage 6 — forward: one pooled async HTTP client to the backend; the only place httpx errors are mapped.

Client headers are never forwarded: every backend request carries only the sidecar's own headers
(content type and, if configured, the backend credential). Timeouts → `UpstreamTimeout` (504);
connection errors, 5xx and non-JSON bodies → `UpstreamError` (502); backend 4xx → `BackendClientError`.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import httpx

from sidecar.errors import BackendClientError, UpstreamError, UpstreamTimeout


class Upstream:
    """Pooled client for one backend base URL. `call` returns the parsed JSON body of a 2xx answer."""

    def __init__(self, base_url: str, *, timeout_s: float, max_connections: int,
                 auth_header: str | None = None, token: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if token:
            headers[auth_header or "Authorization"] = f"Bearer {token}" if (auth_header or "Authorization").lower() == "authorization" else token
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=httpx.Timeout(timeout_s),
            # Idle connections are dropped after 2 s, below uvicorn's default keep-alive timeout (5 s, the
            # Mem0 REST server's): with httpx's default expiry (5 s) a request could take a connection the
            # backend was closing at that moment and fail as "backend unreachable".
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=2.0),
            headers=headers,
            transport=transport,
            follow_redirects=False,
            trust_env=False,
        )
        self.last_latency_us = 0

    async def close(self) -> None:
        await self._client.aclose()

    async def call(self, method: str, segments: list[str], *, json_body: Any = None,
                   params: dict[str, str] | None = None) -> Any:
        """Send one request; `segments` are re-encoded (RFC 3986 unreserved kept) into the path.

        Returns the decoded JSON (any JSON value). Raises `UpstreamTimeout`, `UpstreamError` or
        `BackendClientError` (status and the backend's error text).
        """
        path = "/" + "/".join(quote(s, safe="") for s in segments)
        content = None if json_body is None else json.dumps(json_body, separators=(",", ":"), allow_nan=False).encode()
        started = time.perf_counter_ns()
        try:
            response = await self._client.request(method, path, content=content, params=params)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("backend timed out") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError("backend unreachable") from exc
        finally:
            self.last_latency_us = (time.perf_counter_ns() - started) // 1000
        if response.status_code >= 500:
            raise UpstreamError(f"backend answered {response.status_code}")
        try:
            payload = response.json() if response.content else None
        except (ValueError, RecursionError) as exc:
            raise UpstreamError("backend answered a non-JSON body") from exc
        if 400 <= response.status_code < 500:
            message = "backend rejected the request"
            if isinstance(payload, dict):
                message = str(payload.get("message") or payload.get("error") or message)[:500]
            raise BackendClientError(response.status_code, message)
        if response.status_code >= 300:
            raise UpstreamError(f"backend answered {response.status_code}")
        return payload
