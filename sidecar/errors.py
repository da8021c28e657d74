"""The sidecar's exception tree. Every error knows its HTTP status; `to_body` maps one to JSON.

Each also knows how the decision log records it (`decision`, `reason`; class defaults below, a
raise site may name a more precise reason — Cedar's deny reason, ``unknown_row``, …)::

    MemwardenError                 500  internal (never leaks detail)          error  internal_error
    ├── BadRequest                 400  malformed/ambiguous input, governed    error  bad_request
    │                                   keys set by the client
    ├── Unauthorized               401  missing, unknown, revoked or           deny   not_authenticated
    │                                   ambiguous credential
    ├── Forbidden                  403  Cedar said Deny or NoDecision          deny   not_permitted
    ├── NotFound                   404  unmapped route, unknown/foreign        deny   not_found
    │                                   collection or row
    ├── RequestTimeout             408  headers or body not received within    error  request_timeout
    │                                   their deadline
    ├── Conflict                   409  id already governed (or tombstoned)    error  conflict
    ├── PayloadTooLarge            413  body (or number of ids) over the       error  payload_too_large
    │                                   configured limit
    ├── UpstreamError              502  backend down, 5xx, or a body that is   error  backend_error
    │   │                               not the expected JSON
    │   ├── BackendServerError     502  the backend's own 5xx answer            error  backend_error
    │   └── BackendAnswerTooLarge  502  one backend answer over                 error  backend_answer_too_large
    │                                   BACKEND_MAX_RESPONSE_BYTES (rows the caller may read)
    ├── Overloaded                 503  more requests in flight than the       error  overloaded
    │                                   sidecar takes at once
    ├── LedgerUnavailable          503  PostgreSQL ledger unreachable, or no   error  ledger_unavailable
    │                                   pooled connection free in time
    ├── UpstreamTimeout            504  backend did not answer in time         error  backend_timeout
    └── BackendClientError        4xx  the backend's own 4xx (its status;     error  backend_rejected
                                        never its text)
    PolicyLoadError                    start-up only: schema/policies missing or invalid
    LedgerOpenError                    start-up only (and every command that opens the ledger): the ledger
                                       cannot be opened — PostgreSQL unreachable, database missing, credentials
                                       refused, schema not migrated, an SQLite file that cannot be opened
"""

from __future__ import annotations


class MemwardenError(Exception):
    status: int = 500
    code: str = "internal"
    decision: str = "error"  # decision-log outcome: allow | deny | error
    reason: str = "internal_error"

    def __init__(self, message: str = "internal error", *, reason: str | None = None,
                 decision: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.explicit_reason = reason is not None
        if reason is not None:
            self.reason = reason
        if decision is not None:
            self.decision = decision


class BadRequest(MemwardenError):
    status, code, reason = 400, "bad_request", "bad_request"


class Unauthorized(MemwardenError):
    status, code, decision, reason = 401, "unauthenticated", "deny", "not_authenticated"


class Forbidden(MemwardenError):
    status, code, decision, reason = 403, "forbidden", "deny", "not_permitted"


class NotFound(MemwardenError):
    status, code, decision, reason = 404, "not_found", "deny", "not_found"


class RequestTimeout(MemwardenError):
    status, code, reason = 408, "request_timeout", "request_timeout"


class Conflict(MemwardenError):
    status, code, reason = 409, "conflict", "conflict"


class PayloadTooLarge(MemwardenError):
    status, code, reason = 413, "payload_too_large", "payload_too_large"


class UpstreamError(MemwardenError):
    status, code, reason = 502, "bad_gateway", "backend_error"


class BackendServerError(UpstreamError):
    """A 5xx answered by the backend itself (it was reached and replied); `backend_status` is its status.
    Answered as any `UpstreamError` (502); a read whose plan sent an id list may retry under the metadata
    filter on it (`sidecar.backends.chroma.ChromaProfile._pushdown`)."""

    def __init__(self, backend_status: int) -> None:
        super().__init__(f"backend answered {backend_status}")
        self.backend_status = backend_status


class BackendAnswerTooLarge(UpstreamError):
    """One backend answer was over ``BACKEND_MAX_RESPONSE_BYTES`` (`Upstream.call`; nothing of it is read further).
    Backend profiles fetch content only for rows the caller may read, so what raises this to a client is rows it may
    read (docs/design.md, "Row size"); `cap` is the setting's value, bytes."""

    reason = "backend_answer_too_large"

    def __init__(self, cap: int) -> None:
        super().__init__(f"backend answer too large: over the limit of {cap} bytes per backend answer "
                         "(MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES); ask for fewer rows (limit, n_results, top_k)")
        self.cap = cap


class Overloaded(MemwardenError):
    status, code, reason = 503, "overloaded", "overloaded"


class LedgerUnavailable(MemwardenError):
    """The shared (PostgreSQL) ledger could not be reached or had no pooled connection free within
    its timeout (psycopg ``OperationalError``, ``psycopg_pool.PoolTimeout``): the request is denied."""

    status, code, reason = 503, "ledger_unavailable", "ledger_unavailable"


class UpstreamTimeout(MemwardenError):
    status, code, reason = 504, "gateway_timeout", "backend_timeout"


class BackendClientError(MemwardenError):
    """A 4xx answered by the backend itself; `status` is the backend's."""

    code, reason = "backend_rejected", "backend_rejected"

    def __init__(self, status: int, message: str, *, reason: str | None = None) -> None:
        super().__init__(message, reason=reason)
        self.status = status


class PolicyLoadError(Exception):
    """The policy set or schema could not be loaded; raised at start-up, never per request."""


def to_body(exc: MemwardenError) -> dict[str, str]:
    """JSON body for an error response: ``{"error": code, "message": text}``."""
    return {"error": exc.code, "message": exc.message}


class LedgerOpenError(RuntimeError):
    """The ledger could not be opened (`sidecar.ledger.open_ledger`): PostgreSQL unreachable, the database
    missing, the credentials refused, the schema older than the code with migrations off
    (`sidecar.ledger.postgres.SchemaOutOfDate`), an SQLite file that cannot be created or read. The message is
    one line naming the ledger (a URL without its password) and what to check."""
