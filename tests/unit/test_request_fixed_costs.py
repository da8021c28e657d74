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
from hypothesis import given, settings
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
