"""How a request scope was entered and left before h25p (`git show 8912bda:sidecar/pipeline.py`, `Pipeline.run`:
``_SCOPE.set(RequestScope())`` and ``_SCOPE.reset(token)`` on the private context variable, with
`RequestScope` setting its two fields in ``__init__``). Kept as the reference
`tests/unit/test_request_scope_enter.py` compares `sidecar.ledger.cache.enter_request` / `leave_request` with."""

from __future__ import annotations

import contextvars
from typing import Any

from sidecar.ledger.cache import _SCOPE


class ReferenceRequestScope:
    """`sidecar.ledger.cache.RequestScope` as it was (slots, fields set in ``__init__``)."""

    __slots__ = ("ledger", "token")

    def __init__(self) -> None:
        self.ledger: Any = None
        self.token: Any = None


def reference_enter() -> contextvars.Token[Any]:
    return _SCOPE.set(ReferenceRequestScope())  # type: ignore[arg-type]


def reference_leave(token: contextvars.Token[Any]) -> None:
    _SCOPE.reset(token)
