"""`ChromaProfile.match` hands out the route `deferrable` matched just before (h25p: on PostgreSQL a read's route
was matched twice, by `Authorizer.authenticate` through `deferrable` and by the pipeline). Against the code it
replaces — ``ROUTE_TABLE.match`` for every call — over generated sequences of `deferrable` and `match` calls on
several segment lists (the same list, an equal list that is another object, a list changed in place after
`deferrable` saw it, other methods, interleaved as concurrent requests interleave): every answer equals the
reference's, `deferrable` answers as before, and no route object is handed out by `match` twice."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.backends.chroma import DEFERRED_KEY_CHECK, ROUTE_TABLE, ChromaProfile

BASE = ["api", "v2", "tenants", "t", "databases", "db", "collections", "c1"]
PATHS = [BASE + ["get"], BASE + ["query"], BASE + ["add"], BASE + ["count"], BASE, BASE[:6] + ["collections"],
         BASE + ["get", "x"], BASE[:7] + ["", "get"], ["_memwarden", "memories", "r", "lineage"]]
METHODS = ["POST", "GET", "PUT", "DELETE"]
OPS = st.lists(st.tuples(st.sampled_from(["deferrable", "match", "copy", "mutate"]), st.integers(0, 2),
                         st.sampled_from(METHODS), st.integers(0, len(PATHS) - 1)), max_size=25)


def _profile() -> ChromaProfile:
    p = ChromaProfile.__new__(ChromaProfile)
    p._deferred = None
    return p


@settings(max_examples=500, deadline=None)
@given(ops=OPS, starts=st.lists(st.integers(0, len(PATHS) - 1), min_size=3, max_size=3))
@example(ops=[("deferrable", 0, "POST", 0), ("mutate", 0, "POST", 2), ("match", 0, "POST", 0)], starts=[0, 0, 0])
@example(ops=[("deferrable", 0, "POST", 0), ("match", 1, "POST", 0), ("match", 0, "POST", 0)], starts=[0, 0, 0])
@example(ops=[("deferrable", 0, "POST", 0), ("match", 0, "GET", 0), ("match", 0, "POST", 0)], starts=[0, 1, 0])
def test_match_and_deferrable_as_the_route_table(ops: list[Any], starts: list[int]) -> None:
    profile = _profile()
    lists = [list(PATHS[i]) for i in starts]  # three requests' segment lists
    handed: list[Any] = []
    for op, which, method, path in ops:
        segs = lists[which]
        if op == "deferrable":
            route = ROUTE_TABLE.match(method, segs)
            assert profile.deferrable(method, segs) is (route is not None and route.op in DEFERRED_KEY_CHECK)
        elif op == "match":
            got = profile.match(method, segs)
            assert got == ROUTE_TABLE.match(method, segs)
            if got is not None:
                assert all(got is not h for h in handed)
                handed.append(got)
        elif op == "copy":  # another request with the same path: an equal list, another object
            lists[which] = list(segs)
        else:  # the list changed in place (the pipeline never does this; the answer must follow it anyway)
            segs[:] = PATHS[path]


def test_the_usual_sequence_matches_once(monkeypatch: Any) -> None:
    profile = _profile()
    calls: list[Any] = []
    real = ROUTE_TABLE.match
    monkeypatch.setattr("sidecar.backends.chroma.ROUTE_TABLE", type("T", (), {"match": staticmethod(
        lambda m, s: calls.append(m) or real(m, s))})())
    segs = BASE + ["get"]
    assert profile.deferrable("POST", segs)
    route = profile.match("POST", segs)
    assert route is not None and route.op == "get" and route.params["collection"] == "c1"
    assert len(calls) == 1
    assert profile.match("POST", segs) == route and len(calls) == 2  # handed out once only
