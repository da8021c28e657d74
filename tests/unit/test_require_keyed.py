"""`Authorizer.require_keyed` (the collection decision of `ChromaProfile._require_collection`, memoised on the
fields its entities are made of) and `require` (memoised on their canonical JSON) answer, record and meter
exactly as the code they replace (`tests/unit/require_reference.py`): the same outcome, exchange fields
(action, resource text, decision, reason, policies, deny policies, evaluation errors, would-denies, policy
set) and Prometheus counts, over Hypothesis sequences of principals, actions and collections (unicode,
``/`` and ``:`` in names, ids that collide once joined), with and without shadow mode, with an engine whose
answers carry evaluation errors; a repeated decision builds no entity and no Cedar request."""

from __future__ import annotations

import time as _time
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.errors import Forbidden
from sidecar.exchange import Exchange
from sidecar.governance import Principal, collection_entity, deployment_entity, namespace_entity
from sidecar.metrics import Metrics
from sidecar.policy import CedarRequest, Decision, PolicyEngine
from sidecar.policy_reload import PolicyHandle, PolicySet
from sidecar.stages.authorize import Authorizer
from tests.unit import require_reference as ref

POLICIES = Path(__file__).resolve().parents[2] / "policies"


class ErringEngine(PolicyEngine):
    """Answers of the real policy set, with an evaluation error added to every answer for `ERRING` actions."""

    ERRING = {"delete_bulk", "admin"}

    def _decide(self, requests: list[CedarRequest], entities_json: str) -> list[Decision]:
        out = super()._decide(requests, entities_json)
        return [Decision(d.allowed, d.policies, ("policy7: error", *d.errors), d.reason or "", ("policy7",))
                if r.action in self.ERRING else d for r, d in zip(requests, out)]


def _handle(engine: PolicyEngine, shadow: bool) -> PolicyHandle:
    h = PolicyHandle.__new__(PolicyHandle)
    h.metrics, h.shadow = Metrics(), shadow
    h.current = PolicySet(engine, "sha", _time.time(), None, "src")  # type: ignore[arg-type]
    return h


def exposition(m: Metrics) -> list[str]:
    """The exposition text without creation times and measured durations."""
    return [line for line in m.render().decode().splitlines() if "_created" not in line
            and not line.startswith(("memwarden_cedar_batch_duration_seconds_bucket",
                                     "memwarden_cedar_batch_duration_seconds_sum"))]


def _outcome(run: Any, p: Principal, policy_set: Any) -> Any:
    ex = Exchange(method="POST", raw_path="/")
    ex.principal = p
    try:
        run(ex)
        outcome: Any = "allow"
    except Forbidden as exc:
        outcome = ("forbidden", exc.reason, str(exc), exc.decision, exc.explicit_reason)
    return (outcome, ex.action, ex.resource, ex.decision, ex.reason, sorted(ex.policies), sorted(ex.deny_policies),
            ex.evaluation_errors, ex.would_deny, ex.would_deny_reasons, ex.would_deny_row_ids, ex.policy_set is policy_set)


names = st.one_of(st.sampled_from(["t", "u", "t/x", "x", "db", "db/x", "c:1", "", "é", "\U0001f600", "\ud800"]),
                  st.text(max_size=6))
principals = st.builds(
    Principal, st.sampled_from(["agent", "agent", "admin", "operator"]), st.sampled_from(["k1", "k2"]),
    st.sampled_from(["t", "u", "t/x", ""]), st.sampled_from(["red", "blue", None]), st.sampled_from(["a", "b", None]),
    st.integers(0, 3), st.sampled_from([(), ("curator",), ("auditor", "curator")]))
tenants = st.sampled_from(["t", "u", "t/x"])  # the principals' tenants: decisions that differ by trust, role, kind
collections = st.tuples(st.sampled_from(["chroma", "mem0", "chroma:x"]), names, st.one_of(tenants, tenants, names),
                        names)  # backend, id, tenant, db
actions = st.sampled_from(["list", "search", "admin", "configure", "manage_tenants", "delete_bulk",
                           "create_collection", "read", "no_such_action"])
plain = st.one_of(st.builds(lambda t, d: (namespace_entity(t, d), None), names, names),
                  st.builds(lambda d: (deployment_entity(d), None), st.sampled_from(["chroma", "mem0:x"])),
                  st.builds(lambda c: (collection_entity(*c), [namespace_entity(c[2], c[3])]), collections))
calls = st.lists(st.tuples(principals, actions, st.one_of(st.tuples(st.just("keyed"), collections),
                                                         st.tuples(st.just("plain"), plain))), min_size=1, max_size=12)
COLLIDING = [(Principal("agent", "k1", "t", "red", "a", 1), "list", ("keyed", ("chroma", "c", "t/x", "db"))),
             (Principal("agent", "k1", "t", "red", "a", 1), "list", ("keyed", ("chroma", "c", "t", "x/db"))),
             (Principal("agent", "k1", "t", "red", "a", 1), "list", ("keyed", ("chroma:c", "d", "t", "db"))),
             (Principal("agent", "k1", "t", "red", "a", 1), "list", ("keyed", ("chroma", "c:d", "t", "db")))]
# Denials, a shadow would-deny (same tenant) and a shadow evaluation error, each twice (memo).
DENIED = [(Principal("agent", "k1", "t", "red", "a", 0), "admin", ("keyed", ("chroma", "c", "t", "db"))),
          (Principal("agent", "k1", "t", "red", "a", 0), "admin", ("keyed", ("chroma", "c", "u", "db"))),
          (Principal("agent", "k1", "t", "red", "a", 0), "configure", ("keyed", ("chroma", "c", "t", "db"))),
          (Principal("admin", "k2", "t"), "delete_bulk", ("keyed", ("chroma", "c", "t", "db")))]


def _new(authz: Authorizer, action: str, call: Any) -> Any:
    kind, value = call
    if kind == "plain":
        resource, extra = value
        return lambda ex: authz.require(ex, action, resource, extra)
    backend, cid, tenant, database = value
    return lambda ex: authz.require_keyed(ex, action, ("Collection", f"{backend}:{cid}"), ("Collection", *value),
                                          lambda: (collection_entity(*value), [namespace_entity(tenant, database)]))


def _old(authz: Authorizer, action: str, call: Any) -> Any:
    kind, value = call
    if kind == "plain":
        resource, extra = value
    else:
        resource, extra = collection_entity(*value), [namespace_entity(value[2], value[3])]
    return lambda ex: ref.require(authz, ex, action, resource, extra)


@settings(max_examples=250, deadline=None)
@given(calls, st.booleans(), st.booleans())
@example(COLLIDING, False, False)
@example(COLLIDING, True, False)
@example(DENIED, False, False)
@example(DENIED, True, False)
@example(DENIED, False, True)
def test_keyed_and_plain_request_decisions_answer_record_and_meter_as_before(sequence: Any, shadow: bool, erring: bool) -> None:
    cls = ErringEngine if erring else PolicyEngine
    new, old = _handle(cls.load(POLICIES), shadow), _handle(cls.load(POLICIES), shadow)
    fast, reference = Authorizer(new, None), Authorizer(old, None)  # type: ignore[arg-type]
    for _ in range(2):  # the second time from the memo
        for p, action, call in sequence:
            assert _outcome(_new(fast, action, call), p, new.current) == _outcome(_old(reference, action, call), p, old.current)
    assert exposition(new.metrics) == exposition(old.metrics)


def test_a_repeated_keyed_decision_builds_no_entity_and_no_request(monkeypatch: Any) -> None:
    h = _handle(PolicyEngine.load(POLICIES), False)
    authz = Authorizer(h, None)  # type: ignore[arg-type]
    built: list[str] = []
    requests: list[Any] = []
    real = CedarRequest

    def counting_request(*args: Any) -> CedarRequest:
        requests.append(args)
        return real(*args)
    monkeypatch.setattr("sidecar.stages.authorize.CedarRequest", counting_request)
    p = Principal("agent", "k1", "t", "red", "a", 2)
    for _ in range(3):
        ex = Exchange(method="POST", raw_path="/")
        ex.principal = p
        authz.require_keyed(ex, "list", ("Collection", "chroma:c1"), ("Collection", "chroma", "c1", "t", "db"),
                            lambda: (built.append("x"), (collection_entity("chroma", "c1", "t", "db"),
                                                         [namespace_entity("t", "db")]))[1])
        assert ex.decision == "allow" and ex.resource == "Collection::chroma:c1" and ex.policies
    assert built == ["x"] and len(requests) == 1


def test_an_unhashable_principal_takes_the_general_path() -> None:
    h = _handle(PolicyEngine.load(POLICIES), False)
    authz, reference = Authorizer(h, None), Authorizer(_handle(PolicyEngine.load(POLICIES), False), None)  # type: ignore[arg-type]
    p = Principal("agent", "k1", "t", "red", "a", 2, ["curator"])  # type: ignore[arg-type]  # a list: not hashable
    value = ("chroma", "c1", "t", "db")
    assert _outcome(_new(authz, "list", ("keyed", value)), p, h.current) == \
        _outcome(_old(reference, "list", ("keyed", value)), p, reference.policy.current)


def test_the_chroma_collection_decision_is_keyed_only_for_str_fields(monkeypatch: Any) -> None:
    from types import SimpleNamespace

    from sidecar.backends.chroma import ChromaProfile
    from sidecar.ledger import CollectionRecord

    h = _handle(PolicyEngine.load(POLICIES), False)
    authz = Authorizer(h, None)  # type: ignore[arg-type]
    seen: list[str] = []
    monkeypatch.setattr(authz, "require_keyed", lambda *a: seen.append("keyed"))
    monkeypatch.setattr(authz, "require", lambda *a: seen.append("plain"))
    prof = ChromaProfile.__new__(ChromaProfile)
    prof.authz = authz
    for rec in (CollectionRecord("chroma", "c1", "t", "db", "c", "t/admin", 0),
                CollectionRecord("chroma", "c1", "t", 1, "c", "t/admin", 0)):  # type: ignore[arg-type]
        prof._collection = lambda ex, params, rec=rec: rec  # type: ignore[method-assign]
        prof._require_collection(SimpleNamespace(), {}, "list")  # type: ignore[arg-type]
    assert seen == ["keyed", "plain"]
