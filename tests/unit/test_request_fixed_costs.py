"""The per-request fast paths of issue #17 (fixed CPU per request) agree with what they replace:

- `Metrics.observe_exchange` / `observe_cedar` with label children bound on first use give the exposition
  text of the old code (``labels(...)`` per call, a `collections.Counter` per PDP call), kept here as the
  reference;
- `InstrumentedLedger` / `CachingLedger` store the methods they forward on the instance: every call is
  still timed and counted once (errors too), every write through the cache still drops the caches, and
  data attributes (``blocking_io``, ``async_io``) are read live;
- `RouteTable.match` (routes indexed by method and length) answers as `match_routes` over the whole table;
- `new_request_id` has the format of ``uuid.uuid4().hex``.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter as Tally
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.backends import chroma, mem0
from sidecar.backends.base import RouteTable, match_routes
from sidecar.exchange import Exchange, new_request_id
from sidecar.ledger import CollectionRecord, SQLiteLedger, now_us
from sidecar.ledger.cache import CachingLedger
from sidecar.metrics import InstrumentedLedger, Metrics

# -- metrics ------------------------------------------------------------------------------------------


def reference_observe_exchange(m: Metrics, ex: Any, status: int) -> None:
    """`Metrics.observe_exchange` before the bound children (commit 8afa8b0)."""
    m.requests.labels(ex.operation, ex.action or "none", ex.decision or "none", str(status)).inc()
    for result, n in (("allowed", ex.rows_allowed), ("denied", ex.rows_denied),
                      ("superseded", ex.rows_hidden_superseded), ("deleted", ex.rows_hidden_deleted),
                      ("unknown", ex.rows_unknown), ("malformed", ex.rows_malformed)):
        if n:
            m.rows.labels(result).inc(n)
    m.request_duration.observe(ex.elapsed_us() / 1e6)


def reference_observe_cedar(m: Metrics, actions: list[str], allowed: list[bool], seconds: float) -> None:
    """`Metrics.observe_cedar` before the bound children (commit 8afa8b0)."""
    m.cedar_batch.observe(seconds)
    m.cedar_batch_size.observe(len(actions))
    for (action, ok), n in Tally(zip(actions, allowed)).items():
        m.cedar_decisions.labels(action, "allow" if ok else "deny").inc(n)


def exposition(m: Metrics) -> str:
    """The exposition text without the ``_created`` timestamps (creation times differ between registries)."""
    return "\n".join(line for line in m.render().decode().splitlines() if "_created" not in line)


counts = st.integers(min_value=0, max_value=3)
exchanges = st.builds(
    lambda op, action, decision, status, rows, us: SimpleNamespace(
        status=status, operation=op, action=action, decision=decision, rows_allowed=rows[0], rows_denied=rows[1],
        rows_hidden_superseded=rows[2], rows_hidden_deleted=rows[3], rows_unknown=rows[4], rows_malformed=rows[5],
        elapsed_us=lambda: us),
    st.sampled_from(["get", "query", "unrouted", "add"]), st.sampled_from([None, "list", "search", "write"]),
    st.sampled_from([None, "allow", "deny", "error"]), st.sampled_from([200, 401, 403, 404, 500]),
    st.tuples(counts, counts, counts, counts, counts, counts), st.integers(min_value=0, max_value=3_000_000))
cedar_calls = st.lists(st.tuples(st.sampled_from(["list", "search", "read", "write"]), st.booleans()),
                       max_size=6).map(lambda pairs: ([a for a, _ in pairs], [ok for _, ok in pairs]))
events = st.lists(st.one_of(st.tuples(st.just("exchange"), exchanges, st.none()),
                            st.tuples(st.just("cedar"), cedar_calls, st.floats(min_value=0, max_value=2))),
                  max_size=30)


@settings(max_examples=300, deadline=None)
@given(events)
def test_bound_metric_children_count_what_labels_per_call_counted(sequence: list[Any]) -> None:
    new, old = Metrics(), Metrics()
    for kind, value, extra in sequence:
        if kind == "exchange":
            new.observe_exchange(value, value.status)
            reference_observe_exchange(old, value, value.status)
        else:
            actions, allowed = value
            new.observe_cedar(actions, allowed, extra)
            reference_observe_cedar(old, actions, allowed, extra)
    assert exposition(new) == exposition(old)


def test_a_row_result_series_appears_only_once_counted() -> None:
    m = Metrics()
    m.observe_exchange(Exchange(method="GET", raw_path="/"), 200)
    assert "memwarden_rows_total{" not in m.render().decode()
    ex = Exchange(method="GET", raw_path="/")
    ex.rows_denied = 2
    m.observe_exchange(ex, 200)
    text = m.render().decode()
    assert 'memwarden_rows_total{result="denied"} 2.0' in text and 'result="allowed"' not in text


# -- the ledger wrappers ------------------------------------------------------------------------------


def _samples(m: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in m.registry.collect():
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_wrapped_methods_are_stored_once_and_every_call_is_timed_and_counted(tmp_path: Path) -> None:
    raw = SQLiteLedger(tmp_path / "l.db")
    m = Metrics()
    inst = InstrumentedLedger(raw, m)
    cached = CachingLedger(inst, raw.cache_version, ttl_s=3600)
    raw.register_collection(CollectionRecord("chroma", "c1", "t", "db", "c", "t/admin", now_us()))
    for _ in range(5):
        assert cached.get_rows("chroma", "c1", ["r1"]) == {}  # READ_ONLY: forwarded, not cached
        assert cached.ping() and inst.ping()  # through the cache, and directly (no cache: LEDGER_CACHE_TTL_S=0)
    assert "get_rows" in vars(inst) and "get_rows" in vars(cached)  # found by plain lookup from now on
    counts = _samples(m, "memwarden_ledger_call_duration_seconds_count")
    assert counts[(("method", "get_rows"),)] == 5 and counts[(("method", "ping"),)] == 10
    with pytest.raises(Exception):
        cached.get_rows("chroma", "c1", None)  # type: ignore[arg-type]
    with pytest.raises(Exception):
        cached.get_rows("chroma", "c1", None)  # type: ignore[arg-type]
    assert _samples(m, "memwarden_ledger_errors_total")[(("method", "get_rows"),)] == 2
    assert _samples(m, "memwarden_ledger_call_duration_seconds_count")[(("method", "get_rows"),)] == 7


def test_every_write_through_the_cache_drops_it_also_once_its_method_is_stored(tmp_path: Path) -> None:
    raw = SQLiteLedger(tmp_path / "l.db")
    cached = CachingLedger(InstrumentedLedger(raw, Metrics()), raw.cache_version, ttl_s=3600)
    keys = []
    for i in range(3):
        rec, key = cached.create_key("agent", "t", "red", f"a{i}", 1)  # a write: drops the caches
        keys.append((rec, key))
        assert cached.authenticate(key) is not None
        assert cached._keys  # cached until the next write
    assert "create_key" in vars(cached) and "revoke_key" not in vars(cached)
    for rec, key in keys:
        assert cached.revoke_key(rec.key_id)
        assert not cached._keys and cached.authenticate(key) is None


def test_data_attributes_are_read_live_through_both_wrappers(tmp_path: Path) -> None:
    class Inner:
        blocking_io = True

        def ping(self) -> bool:
            return True

    inner = Inner()
    inst = InstrumentedLedger(inner, Metrics())
    cached = CachingLedger(inst, lambda: 1, ttl_s=60)
    assert cached.blocking_io is True and cached.async_io is False and inst.async_io is False
    inner.blocking_io = False
    inner.async_io = True  # type: ignore[attr-defined]
    assert cached.blocking_io is False and cached.async_io is True
    inner.label = "x"  # type: ignore[attr-defined]
    assert cached.label == "x"
    inner.label = "y"  # type: ignore[attr-defined]
    assert cached.label == "y"


def test_a_cache_over_a_ledger_that_may_change_its_methods_does_not_keep_them(tmp_path: Path) -> None:
    """Over an object that is not an `InstrumentedLedger`, a method is looked up at every call, as before."""
    raw = SQLiteLedger(tmp_path / "l.db")
    cached = CachingLedger(raw, raw.cache_version, ttl_s=3600)
    assert cached.ping() is True
    raw.ping = lambda: "replaced"  # type: ignore[method-assign]
    assert cached.ping() == "replaced" and "ping" not in vars(cached)


# -- routes -------------------------------------------------------------------------------------------


def _segment_pool(table: list[tuple[str, tuple[str, ...], str]]) -> list[str]:
    literals = sorted({p for _, pattern, _ in table for p in pattern if not p.startswith("{")})
    return literals + ["", "x", "c1", "API", "get "]


@pytest.mark.parametrize("table", [chroma.ROUTES, mem0.ROUTES], ids=["chroma", "mem0"])
@settings(max_examples=1500, deadline=None)
@given(data=st.data())
def test_route_table_matches_as_match_routes(table: Any, data: Any) -> None:
    pool = _segment_pool(table)
    methods = sorted({m for m, _, _ in table}) + ["HEAD", "get"]
    if data.draw(st.booleans()):  # near a real route: a pattern with some items replaced
        method, pattern, _ = data.draw(st.sampled_from(table))
        segments = [data.draw(st.sampled_from(pool)) if p.startswith("{") or data.draw(st.integers(0, 9)) == 0 else p
                    for p in pattern]
        if data.draw(st.integers(0, 5)) == 0:
            segments = segments[:-1] if data.draw(st.booleans()) else segments + [data.draw(st.sampled_from(pool))]
        method = data.draw(st.sampled_from([method, *methods]))
    else:
        method = data.draw(st.sampled_from(methods))
        segments = data.draw(st.lists(st.sampled_from(pool), max_size=10))
    assert RouteTable(table).match(method, segments) == match_routes(table, method, segments)


def test_profiles_match_through_their_route_tables() -> None:
    for module in (chroma, mem0):
        for method, pattern, op in module.ROUTES:
            segments = [("p" + p[1:-1]) if p.startswith("{") else p for p in pattern]
            assert module.ROUTE_TABLE.match(method, segments) == match_routes(module.ROUTES, method, segments)


# -- request ids --------------------------------------------------------------------------------------


def test_request_ids_have_the_format_of_uuid4_hex() -> None:
    seen = set()
    for _ in range(2000):
        rid = new_request_id()
        u = uuid.UUID(hex=rid)
        assert re.fullmatch(r"[0-9a-f]{32}", rid) and u.hex == rid
        assert u.version == 4 and u.variant == uuid.RFC_4122
        seen.add(rid)
    assert len(seen) == 2000
    assert len({new_request_id()[12] for _ in range(200)}) == 1  # the version digit
    assert {new_request_id()[16] for _ in range(400)} <= set("89ab")  # the variant digit
    assert len({new_request_id()[16] for _ in range(400)}) == 4
    assert re.fullmatch(r"[0-9a-f]{32}", Exchange(method="GET", raw_path="/").request_id)


# -- headers ------------------------------------------------------------------------------------------

from sidecar.errors import BadRequest  # noqa: E402
from sidecar.stages import canonicalize  # noqa: E402


def _answer(fn: Any, raw: list[tuple[bytes, bytes]]) -> Any:
    try:
        return fn(raw)
    except BadRequest as exc:
        return ("BadRequest", str(exc))


header_names = st.one_of(
    st.sampled_from([b"host", b"Content-Type", b"content-length", b"Content-Length", b"transfer-encoding",
                     b"X-API-Key", b"authorization", b"X-Forwarded-For", b"x-envoy-x", b"X-Memwarden-Agent",
                     b"forwarded", b"x-http-method-override", b"X-Method-Override", b"x-tenant-id", b"a b",
                     b"x\tb", b"x\x00", b"\x7f", b"caf\xc3\xa9", b"\xff"]),
    st.binary(max_size=6))
header_values = st.one_of(
    st.sampled_from([b"", b"1", b" 1 ", b"2", b"application/json", b"chunked", b"a\tb", b"a\nb", b"\x00",
                     b"\x7f", b"caf\xc3\xa9", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98\x80", b"\x1b[0m"]),
    st.binary(max_size=8), st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass")))


@settings(max_examples=4000, deadline=None)
@given(st.lists(st.tuples(header_names, header_values), max_size=8))
@example([(b"content-length", b"1"), (b"Content-Length", b" 1 ")])
@example([(b"x-a", b"\xc3"), (b"x-http-method-override", b"GET")])
@example([(b"x-http-method-override", b"GET"), (b"x-a", b"\xc3")])
def test_canonical_headers_answers_as_the_header_by_header_reference(raw: list[tuple[bytes, bytes]]) -> None:
    assert _answer(canonicalize.canonical_headers, raw) == _answer(canonicalize._reference_headers, raw)


def test_canonical_headers_refuses_what_the_reference_refuses() -> None:
    for raw in ([(b"x-a", b"ok"), (b"x-b", b"bad\x01")], [(b"x\x02", b"v")], [(b"x", b"\xc3")],
                [(b"x-http-method", b"GET")], [(b"content-length", b"1"), (b"Content-Length", b"2")],
                [(b"content-length", b"1"), (b"transfer-encoding", b"chunked")]):
        with pytest.raises(BadRequest) as fast:
            canonicalize.canonical_headers(raw)
        with pytest.raises(BadRequest) as ref:
            canonicalize._reference_headers(raw)
        assert str(fast.value) == str(ref.value)
    assert canonicalize.canonical_headers([(b"X-A", b"a\tb"), (b"x-a", b"c"), (b"X-Forwarded-Host", b"h")]) == (
        {"x-a": ["a\tb", "c"]}, ["x-forwarded-host"])


# -- request-level Cedar decisions ---------------------------------------------------------------------

import time as _time  # noqa: E402

from sidecar.errors import Forbidden  # noqa: E402
from sidecar.governance import Principal, collection_entity, deployment_entity, namespace_entity  # noqa: E402
from sidecar.policy import PolicyEngine  # noqa: E402
from sidecar.policy_reload import PolicyHandle, PolicySet  # noqa: E402
from sidecar.stages.authorize import Authorizer  # noqa: E402

POLICIES = Path(__file__).resolve().parents[2] / "policies"


class ReferenceHandle(PolicyHandle):
    """A `PolicyHandle` without `decide_request`: `Authorizer.require` takes the path it took before the
    keyed memo (`request_batch`, then `decide` with the JSON memo)."""

    decide_request = None  # type: ignore[assignment]


def _handle(cls: type, engine: PolicyEngine, shadow: bool) -> Any:
    h = cls.__new__(cls)
    h.metrics, h.shadow = Metrics(), shadow
    h.current = PolicySet(engine, "sha", _time.time(), None, "src")  # type: ignore[arg-type]
    return h


_ENGINES: dict[str, PolicyEngine] = {}


def _engine() -> PolicyEngine:
    if "e" not in _ENGINES:
        _ENGINES["e"] = PolicyEngine.load(POLICIES)
    return _ENGINES["e"]


principals = st.builds(
    Principal, st.sampled_from(["agent", "agent", "admin", "operator"]), st.sampled_from(["k1", "k2"]),
    st.sampled_from(["t", "u", ""]), st.sampled_from(["red", "blue", None]), st.sampled_from(["a", "b", None]),
    st.integers(0, 3), st.sampled_from([(), ("curator",), ("auditor", "curator")]))
resources = st.one_of(
    st.builds(lambda c, t, d: (collection_entity("chroma", c, t, d), [namespace_entity(t, d)]),
              st.sampled_from(["c1", "c2"]), st.sampled_from(["t", "u"]), st.sampled_from(["db", "db2"])),
    st.builds(lambda c, t, d: (collection_entity("chroma", c, t, d), None),
              st.sampled_from(["c1"]), st.sampled_from(["t", "u"]), st.sampled_from(["db"])),
    st.builds(lambda t, d: (namespace_entity(t, d), None), st.sampled_from(["t", "u"]), st.sampled_from(["db"])),
    st.builds(lambda d: (deployment_entity(d), None), st.sampled_from(["chroma", "mem0:x"])))
calls = st.lists(st.tuples(principals, st.sampled_from(["list", "search", "admin", "configure", "manage_tenants",
                                                        "delete_bulk", "create_collection", "read", "no_such_action"]),
                           resources), min_size=1, max_size=12)
SAME_AGENT_OTHER_TRUST = [
    (Principal("agent", "k1", "t", "red", "a", trust), "delete_bulk",
     (collection_entity("chroma", "c1", "t", "db"), [namespace_entity("t", "db")])) for trust in (1, 0)]


def _required(authz: Authorizer, p: Principal, action: str, resource: Any, extra: Any) -> Any:
    ex = Exchange(method="POST", raw_path="/")
    ex.principal = p
    try:
        authz.require(ex, action, resource, extra)
        outcome: Any = "allow"
    except Forbidden as exc:
        outcome = ("forbidden", exc.reason, str(exc))
    return (outcome, ex.action, ex.resource, ex.decision, ex.reason, sorted(ex.policies), sorted(ex.deny_policies),
            ex.evaluation_errors, ex.would_deny, ex.would_deny_reasons, ex.policy_set is not None)


@settings(max_examples=300, deadline=None)
@given(calls, st.booleans())
@example(SAME_AGENT_OTHER_TRUST, False)
def test_keyed_request_decisions_answer_and_record_as_the_general_path(sequence: Any, shadow: bool) -> None:
    engine = _engine()
    new = _handle(PolicyHandle, engine, shadow)
    old = _handle(ReferenceHandle, PolicyEngine.load(POLICIES) if shadow else engine, shadow)
    fast, reference = Authorizer(new, None), Authorizer(old, None)  # type: ignore[arg-type]
    for _ in range(2):  # the second time from the memo
        for p, action, (resource, extra) in sequence:
            assert _required(fast, p, action, resource, extra) == _required(reference, p, action, resource, extra)
    untimed = lambda m: [x for x in exposition(m).splitlines()  # noqa: E731  (durations are measured)
                         if not x.startswith(("memwarden_cedar_batch_duration_seconds_bucket",
                                              "memwarden_cedar_batch_duration_seconds_sum"))]
    assert untimed(new.metrics) == untimed(old.metrics)


def test_a_repeated_request_decision_builds_no_entity_store() -> None:
    h = _handle(PolicyHandle, PolicyEngine.load(POLICIES), False)
    built = []

    class Counting(Authorizer):
        def request_batch(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            built.append(args[1])
            return Authorizer.request_batch(*args, **kwargs)

    authz = Counting(h, None)  # type: ignore[arg-type]
    p = Principal("agent", "k1", "t", "red", "a", 2)
    for _ in range(3):
        assert _required(authz, p, "list", collection_entity("chroma", "c1", "t", "db"),
                         [namespace_entity("t", "db")])[0] == "allow"
    assert built == ["list"]


# -- one token reading per request (SQLite) -----------------------------------------------------------

from sidecar.ledger.cache import request_scope  # noqa: E402


def _counted(raw: SQLiteLedger) -> tuple[Any, list[Any]]:
    readings: list[Any] = []

    def version() -> Any:
        readings.append(raw.cache_version())
        return readings[-1]
    return version, readings


def _keyed_ledger(tmp_path: Path, per_request: bool = True) -> tuple[SQLiteLedger, CachingLedger, list[Any], Any, str]:
    raw = SQLiteLedger(tmp_path / "l.db")
    version, readings = _counted(raw)
    cached = CachingLedger(InstrumentedLedger(raw, Metrics()), version, ttl_s=3600, per_request=per_request)
    rec, key = raw.create_key("agent", "t", "red", "a", 1)
    raw.register_collection(CollectionRecord("chroma", "c1", "t", "db", "c", "t/admin", now_us()))
    return raw, cached, readings, rec, key


def test_a_request_reads_the_token_once_and_the_next_request_sees_a_revocation(tmp_path: Path) -> None:
    raw, cached, readings, rec, key = _keyed_ledger(tmp_path)
    with request_scope():
        assert cached.authenticate(key) is not None
        assert cached.get_collection("chroma", "c1") is not None
        assert cached.agent_entities({"t/red/a"})
        assert cached.authenticate(key) is not None
    assert len(readings) == 1
    SQLiteLedger(tmp_path / "l.db").revoke_key(rec.key_id)  # another process
    with request_scope():
        assert cached.authenticate(key) is None  # the very next request
    SQLiteLedger(tmp_path / "l.db").delete_collection("chroma", "c1", "t/admin", "r")
    with request_scope():
        assert cached.get_collection("chroma", "c1") is None
    assert len(readings) == 3


def test_outside_a_request_or_without_per_request_every_lookup_reads_the_token(tmp_path: Path) -> None:
    raw, cached, readings, rec, key = _keyed_ledger(tmp_path)
    assert cached.authenticate(key) is not None and cached.get_collection("chroma", "c1") is not None
    assert len(readings) == 2
    raw2, cached2, readings2, rec2, key2 = _keyed_ledger(tmp_path / "b", per_request=False)
    with request_scope():
        assert cached2.authenticate(key2) is not None and cached2.get_collection("chroma", "c1") is not None
    assert len(readings2) == 2


def test_a_write_through_the_cache_in_a_request_makes_its_next_lookup_read_again(tmp_path: Path) -> None:
    raw, cached, readings, rec, key = _keyed_ledger(tmp_path)
    with request_scope():
        assert cached.authenticate(key) is not None
        assert cached.revoke_key(rec.key_id)  # a write: the caches are dropped
        assert cached.authenticate(key) is None
    assert len(readings) == 2


def test_a_newer_token_seen_by_another_request_ends_this_requests_reading(tmp_path: Path) -> None:
    raw, cached, readings, rec, key = _keyed_ledger(tmp_path)
    with request_scope():
        assert cached.authenticate(key) is not None
        SQLiteLedger(tmp_path / "l.db").revoke_key(rec.key_id)
        with request_scope():  # another request (its own scope) reads the new token
            assert cached.authenticate(key) is None
        assert cached.authenticate(key) is None  # the caches it read from were dropped: read again
    assert len(readings) == 3


def test_requests_on_one_event_loop_have_their_own_readings(tmp_path: Path) -> None:
    """Concurrent requests (tasks) do not share a reading: each task's scope is its own."""
    import asyncio

    raw, cached, readings, rec, key = _keyed_ledger(tmp_path)
    go = asyncio.Event()

    async def first() -> Any:
        with request_scope():
            ok = cached.authenticate(key) is not None
            await go.wait()
            return ok, cached.get_collection("chroma", "c1")

    async def second() -> Any:
        with request_scope():
            SQLiteLedger(tmp_path / "l.db").delete_collection("chroma", "c1", "t/admin", "r")
            found = cached.get_collection("chroma", "c1")
            go.set()
            return found

    async def both() -> Any:
        return await asyncio.gather(first(), second())

    (ok, seen_by_first), seen_by_second = asyncio.run(both())
    assert ok and seen_by_second is None and seen_by_first is None  # the first's reading was superseded
    assert len(readings) == 3
