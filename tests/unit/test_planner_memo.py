"""`QueryPlanner` with its memos (the admitted share kept per counts entry and principal fields, plans kept per
(share, k)) against the planner of de70fd8, kept as `tests/unit/planner_reference.py`: the same plans (values),
shares, staleness and reads of the ledger's counts over generated sequences of plan / share / observe / warm /
ageing on several collections, principals (agents of several trusts and fleets, admins, operators, equal
principals built twice), every mode, factors and caps, counts with every scope, status and empty ones."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import planner
from sidecar.governance import Principal
from tests.unit import planner_reference as reference

PRINCIPALS = [Principal("agent", "k1", "t", "red", "a", 1), Principal("agent", "k1", "t", "red", "a", 1),
              Principal("agent", "k2", "t", "red", "a", 2), Principal("agent", "k3", "t", "blue", "b", 0),
              Principal("agent", "k4", "t", "blue", "a", 3, ("auditor",)), Principal("admin", "k5", "t"),
              Principal("operator", "k6", "")]
count_rows = st.lists(st.tuples(st.sampled_from(["agent", "fleet", "tenant", "restricted"]), st.sampled_from(["red", "blue"]),
                                st.sampled_from(["t/red/a", "t/blue/b", "t/blue/a"]),
                                st.lists(st.sampled_from(["t/red/a", "t/blue/b"]), max_size=2).map(tuple),
                                st.sampled_from(["active", "active", "superseded", "deleted", "pending"]),
                                st.integers(0, 50)), max_size=6)
ops = st.lists(st.one_of(
    st.tuples(st.just("plan"), st.integers(0, 6), st.sampled_from(["c1", "c2"]), st.integers(0, 60), st.booleans()),
    st.tuples(st.just("share"), st.integers(0, 6), st.sampled_from(["c1", "c2"]), st.booleans()),
    st.tuples(st.just("observe"), st.integers(0, 6), st.sampled_from(["c1", "c2"]), st.integers(-1, 40), st.integers(0, 40)),
    st.tuples(st.just("warm"), st.sampled_from(["c1", "c2"]), count_rows),
    st.tuples(st.just("age"), st.floats(0, 40)),
    st.tuples(st.just("set_counts"), st.sampled_from(["c1", "c2"]), count_rows),
), max_size=40)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def run(module: Any, mode: str, factor: int, cap: int, initial: dict[str, Any], steps: list[Any], monkeypatch: Any) -> list[Any]:
    clock = Clock()
    monkeypatch.setattr(module.time, "monotonic", clock.monotonic)
    counts = dict(initial)
    reads: list[str] = []

    def read(cid: str) -> Any:
        reads.append(cid)
        return counts[cid]

    qp = module.QueryPlanner(mode, factor, cap, read, ttl_s=10.0)
    out: list[Any] = []
    for step in steps:
        op = step[0]
        if op == "plan":
            plan = qp.plan(PRINCIPALS[step[1]], step[2], step[3], wide=step[4])
            out.append(("plan", plan.unfiltered, plan.n_fetch, type(plan.n_fetch)))
        elif op == "share":
            out.append(("share", qp.share(PRINCIPALS[step[1]], step[2], wide=step[3])))
        elif op == "observe":
            qp.observe(PRINCIPALS[step[1]], step[2], step[3], step[4])
        elif op == "warm":
            qp.warm(step[1], step[2])
        elif op == "age":
            clock.now += step[1]
        else:
            counts[step[1]] = step[2]
        out.append(("stale", qp.stale("c1"), qp.stale("c2"), list(reads), qp.describe()))
    return out


@settings(max_examples=400, deadline=None)
@given(mode=st.sampled_from(["auto", "auto", "pushdown", "postfilter-first"]), factor=st.integers(0, 4),
       cap=st.sampled_from([1, 7, 30, 100_000]), c1=count_rows, c2=count_rows, steps=ops)
def test_planner_agrees_with_the_reference(mode: str, factor: int, cap: int, c1: Any, c2: Any, steps: list[Any]) -> None:
    import pytest
    with pytest.MonkeyPatch.context() as mp:
        new = run(planner, mode, factor, cap, {"c1": c1, "c2": c2}, steps, mp)
    with pytest.MonkeyPatch.context() as mp:
        old = run(reference, mode, factor, cap, {"c1": c1, "c2": c2}, steps, mp)
    assert new == old


def test_a_refresh_drops_the_kept_shares(monkeypatch: Any) -> None:
    """The share kept for a principal belongs to the counts it was computed from: new counts (a refresh after
    ``ttl_s`` or a `warm`) give the new share at once."""
    clock = Clock()
    monkeypatch.setattr(planner.time, "monotonic", clock.monotonic)
    rows = {"c": [("tenant", "red", "t/red/x", (), "active", 10)]}
    qp = planner.QueryPlanner("auto", 2, 100_000, lambda cid: rows[cid], ttl_s=10.0)
    a = PRINCIPALS[0]
    assert qp.share(a, "c") == 1.0
    rows["c"] = [("tenant", "red", "t/red/x", (), "active", 10), ("agent", "red", "t/red/z", (), "active", 30)]
    assert qp.share(a, "c") == 1.0  # kept for ttl_s, as before
    clock.now += 11
    assert qp.share(a, "c") == 0.25 and qp.plan(a, "c", 10) == planner.Plan(True, planner.overfetch_size(0.25, 10, 2, 100_000))
    qp.warm("c", [("tenant", "red", "t/red/x", (), "active", 10)])
    assert qp.share(a, "c") == 1.0 and qp.plan(a, "c", 10) == planner.Plan(True, 10)
