"""`Pipeline.run` enters the ledger request scope (`sidecar.ledger.cache.request_scope`) itself: against the
reference (`tests.unit.pipeline_reference`, the stages in a coroutine around ``with request_scope():``), for every
way the stages end — an answer, a denial recorded by the handler, each `MemwardenError` (with and without a
reason, after a recorded denial), an unexpected error, a cancellation — the same status, body, decision and
reason; inside the stages a new scope of the request's own (also across a suspension, and when the caller had
one); after, the caller's scope again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.errors import BadRequest, Forbidden, MemwardenError, NotFound, PayloadTooLarge, RequestTimeout, Unauthorized, UpstreamError
from sidecar.ledger.cache import _SCOPE, RequestScope, request_scope
from sidecar.pipeline import Pipeline
from tests.unit.pipeline_reference import ReferencePipeline

ENDINGS = ["answer", "handler-deny", "forbidden", "forbidden-reason", "notfound-after-deny", "unauthorized", "bad",
           "too-large", "timeout", "upstream", "plain", "internal", "cancel"]


def _stages_for(ending: str, suspend: bool, seen: list[Any]) -> Any:
    async def stages(self: Pipeline, ex: Any, scope: dict[str, Any], receive: Any) -> tuple[int, Any]:
        seen.append(_SCOPE.get())
        if suspend:
            await asyncio.sleep(0)
            seen.append(_SCOPE.get())
        if ending == "answer":
            return 200, {"ids": ["a"]}
        if ending == "handler-deny":
            ex.decision, ex.reason = "deny", None
            return 200, {"deleted": 0}
        if ending == "forbidden":
            raise Forbidden("no")
        if ending == "forbidden-reason":
            raise Forbidden("no", reason="forbid")
        if ending == "notfound-after-deny":
            ex.reason = "deleted_row"
            raise NotFound("gone")
        if ending == "unauthorized":
            raise Unauthorized("missing API key")
        if ending == "bad":
            raise BadRequest("bad")
        if ending == "too-large":
            raise PayloadTooLarge("big")
        if ending == "timeout":
            raise RequestTimeout("slow")
        if ending == "upstream":
            raise UpstreamError("down")
        if ending == "plain":
            raise MemwardenError("client disconnected")
        if ending == "internal":
            raise ValueError("bug")
        raise asyncio.CancelledError()
    return stages


def _outcome(cls: type[Pipeline], ending: str, suspend: bool, outer: bool) -> Any:
    seen: list[Any] = []
    pipeline = type("P", (cls,), {"_run_stages": _stages_for(ending, suspend, seen)})(None, None, 1024, None)  # type: ignore[arg-type]

    async def main() -> Any:
        scope = {"method": "POST", "raw_path": b"/api/v2/x"}
        mine = None
        if outer:
            with request_scope() as mine:
                result = await _run(pipeline, scope)
                after = _SCOPE.get() is mine
        else:
            result = await _run(pipeline, scope)
            after = _SCOPE.get() is None
        fresh = all(isinstance(s, RequestScope) and s is not mine and s.ledger is None and s.token is None for s in seen)
        return result, after, fresh, len(seen), len({id(s) for s in seen})
    return asyncio.run(main())


async def _run(pipeline: Pipeline, scope: dict[str, Any]) -> Any:
    try:
        status, body, ex = await pipeline.run(scope, None)
    except asyncio.CancelledError:
        return "cancelled"
    return status, body, ex.decision, ex.reason


@settings(max_examples=80, deadline=None)
@given(ending=st.sampled_from(ENDINGS), suspend=st.booleans(), outer=st.booleans())
def test_run_enters_the_request_scope_as_the_reference(ending: str, suspend: bool, outer: bool) -> None:
    new = _outcome(Pipeline, ending, suspend, outer)
    assert new == _outcome(ReferencePipeline, ending, suspend, outer)
    assert new[1] and new[2] and new[4] == 1  # the caller's scope after; inside, one new scope of its own


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_ending_as_the_reference(ending: str) -> None:
    for suspend in (False, True):
        for outer in (False, True):
            assert _outcome(Pipeline, ending, suspend, outer) == _outcome(ReferencePipeline, ending, suspend, outer)
