"""`Pipeline.run` before h24s entered the ledger request scope itself (`git show 4f38337:sidecar/pipeline.py`): the
stages ran in `_stages`, a coroutine around ``with request_scope():``. Kept as the reference
`tests/unit/test_pipeline_scope.py` compares today's `Pipeline.run` with."""

from __future__ import annotations

from typing import Any

from sidecar.errors import MemwardenError, to_body
from sidecar.exchange import Exchange
from sidecar.ledger.cache import request_scope
from sidecar.pipeline import Pipeline, log, outcome


class ReferencePipeline(Pipeline):
    async def run(self, scope: dict[str, Any], receive: Any) -> tuple[int, Any, Exchange]:
        ex = Exchange(method=scope["method"], raw_path=scope.get("raw_path", b"").decode("latin-1"))
        try:
            status, body = await self._stages(ex, scope, receive)
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
        return status, body, ex

    async def _stages(self, ex: Exchange, scope: dict[str, Any], receive: Any) -> tuple[int, Any]:
        with request_scope():
            return await self._run_stages(ex, scope, receive)
