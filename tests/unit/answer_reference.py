"""Earlier code of the answer encoding in `sidecar.app.PipelineMiddleware`, kept as a test reference."""

from __future__ import annotations

import json
from typing import Any


def old_payload(body: Any) -> bytes:
    """The answer bytes as `PipelineMiddleware.__call__` made them before `sidecar.answer` (as of fe121ba).
    Raises ``ValueError``, ``TypeError`` or ``RecursionError``, which the entry answers as a 500."""
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
