"""The sidecar's exception tree. Every error knows its HTTP status; `to_response` maps one to JSON.

::

    MemwardenError                 500  internal (never leaks detail)
    ├── BadRequest                 400  malformed/ambiguous input, governed keys set by the client
    ├── Unauthorized               401  missing, unknown, revoked or ambiguous credential
    ├── Forbidden                  403  Cedar said Deny or NoDecision
    ├── NotFound                   404  unmapped route, unknown/foreign collection or row
    ├── RequestTimeout             408  headers or body not received within their deadline
    ├── Conflict                   409  id already governed (or tombstoned)
    ├── PayloadTooLarge            413  body (or number of ids) over the configured limit
    ├── UpstreamError              502  backend down, 5xx, or a body that is not the expected JSON
    ├── Overloaded                 503  more requests in flight than the sidecar takes at once
    ├── UpstreamTimeout            504  backend did not answer in time
    └── BackendClientError        4xx  the backend's own 4xx, passed through with a sanitised body
    PolicyLoadError                    start-up only: schema/policies missing or invalid
"""

from __future__ import annotations


class MemwardenError(Exception):
    status: int = 500
    code: str = "internal"

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)
        self.message = message


class BadRequest(MemwardenError):
    status, code = 400, "bad_request"


class Unauthorized(MemwardenError):
    status, code = 401, "unauthenticated"


class Forbidden(MemwardenError):
    status, code = 403, "forbidden"


class NotFound(MemwardenError):
    status, code = 404, "not_found"


class RequestTimeout(MemwardenError):
    status, code = 408, "request_timeout"


class Conflict(MemwardenError):
    status, code = 409, "conflict"


class PayloadTooLarge(MemwardenError):
    status, code = 413, "payload_too_large"


class UpstreamError(MemwardenError):
    status, code = 502, "bad_gateway"


class Overloaded(MemwardenError):
    status, code = 503, "overloaded"


class UpstreamTimeout(MemwardenError):
    status, code = 504, "gateway_timeout"


class BackendClientError(MemwardenError):
    """A 4xx answered by the backend itself; `status` is the backend's."""

    code = "backend_rejected"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class PolicyLoadError(Exception):
    """The policy set or schema could not be loaded; raised at start-up, never per request."""


def to_body(exc: MemwardenError) -> dict[str, str]:
    """JSON body for an error response: ``{"error": code, "message": text}``."""
    return {"error": exc.code, "message": exc.message}
