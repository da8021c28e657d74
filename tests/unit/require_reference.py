"""The request-level Cedar decision as it was before `Authorizer.require_keyed` (commit fe121ba): `require`
builds the resource's uid text, `_request_decision` keys the memo by the canonical JSON of the entities,
builds the `CedarRequest` every time and hands it to `PolicyHandle.decide_request` (then
`PolicyEngine.decide_keyed`), and `Authorizer._record` records the answer. Kept as the reference of
`tests/unit/test_require_keyed.py`; functions of an `Authorizer` (its policy handle and `_record`)."""

from __future__ import annotations

import time
from typing import Any, Callable

from sidecar.errors import Forbidden
from sidecar.exchange import Exchange
from sidecar.governance import Principal
from sidecar.policy import CedarRequest, Decision, canonical_json


def decide_keyed(engine: Any, key: Any, request: CedarRequest, entities: Callable[[], list[dict[str, Any]]]) -> Decision:
    hit = engine._keyed_memo.get(key)
    if hit is not None:
        return hit
    decision = engine.decide([request], entities())[0]
    if not decision.errors:
        if len(engine._keyed_memo) >= engine.MEMO_SIZE:
            engine._keyed_memo.pop(next(iter(engine._keyed_memo)), None)
        engine._keyed_memo[key] = decision
    return decision


def decide_request(handle: Any, key: Any, request: CedarRequest, entities: Callable[[], list[dict[str, Any]]],
                   policy_set: Any = None) -> Decision:
    ps = policy_set or handle.current
    if handle.shadow:
        return handle.decide([request], entities(), ps)[0]
    t0 = time.perf_counter()
    decision = decide_keyed(ps.engine, key, request, entities)
    # `Metrics.observe_cedar` of one answer as it was (before `Metrics.observe_cedar_one`): the library's calls
    seconds, m = time.perf_counter() - t0, handle.metrics
    m.cedar_batch.observe(seconds)
    m.cedar_batch_size.observe(1)
    m.cedar_decisions.labels(request.action, "allow" if decision.allowed else "deny").inc(1)
    for pid in decision.error_policies:
        handle.metrics.cedar_evaluation_errors.labels(request.action, pid).inc()
    if decision.reason == "not_applicable":  # issue 34: metered on their own (the engine asks Cedar no more)
        handle.metrics.cedar_not_applicable.labels(request.action, request.principal[0]).inc()
    return decision


def request_decision(authz: Any, ex: Exchange, p: Principal, action: str, resource: dict[str, Any],
                     extra: list[dict[str, Any]] | None) -> Decision:
    has_keyed = getattr(authz.policy, "decide_request", None) is not None
    try:
        key = (p, action, canonical_json([resource, *(extra or ())])) if has_keyed else None
        hash(key)
    except TypeError:
        key = None
    if key is None:
        return authz.decide(ex, *authz.request_batch(p, action, resource, extra))[0]
    if ex.policy_set is None:
        ex.policy_set = authz.policy.current
    uid = resource["uid"]
    request = CedarRequest(p.uid, action, (uid["type"], uid["id"]))
    decision = decide_request(authz.policy, key, request, lambda: authz.request_batch(p, action, resource, extra)[1],
                              ex.policy_set)
    return authz._record(ex, [request], [decision])[0]


def require(authz: Any, ex: Exchange, action: str, resource: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> None:
    p = ex.principal
    assert p is not None
    uid = resource["uid"]
    ex.action, ex.resource = action, f'{uid["type"]}::{uid["id"]}'
    decision = request_decision(authz, ex, p, action, resource, extra)
    if not decision.allowed:
        ex.decision = "deny"
        raise Forbidden(f"{action} is not permitted", reason=decision.reason)
    ex.decision = "allow"
