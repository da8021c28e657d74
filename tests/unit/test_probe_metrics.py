"""Probe metrics on synthetic event streams (Wilson intervals at the edges, empty denominators), and the
contradiction experiment's accounting against in-process fake targets (`httpx.MockTransport`)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import pytest

from sidecar.probe.experiments import Events, Sizes, contradiction
from sidecar.probe.metrics import quantile, summarize, wilson
from sidecar.probe.plan import Plan
from sidecar.probe.targets import ChromaTarget


def test_wilson_edges_and_known_values() -> None:
    zero = wilson(0, 20)
    assert zero.p == 0.0 and zero.lo == 0.0 and zero.hi == pytest.approx(0.1611, abs=1e-4)
    full = wilson(20, 20)
    assert full.p == 1.0 and full.hi == 1.0 and full.lo == pytest.approx(0.8389, abs=1e-4)
    half = wilson(50, 100)  # textbook: [0.4038, 0.5962]
    assert (half.lo, half.hi) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))
    empty = wilson(0, 0)
    assert empty.n == 0 and empty.p is None and "n/a" in empty.fmt()
    for k, n in ((1, 0), (-1, 3), (4, 3)):
        with pytest.raises(ValueError):
            wilson(k, n)
    for k in range(0, 11):
        r = wilson(k, 10)
        assert r.lo is not None and r.hi is not None and r.lo <= r.p <= r.hi  # type: ignore[operator]


def test_quantiles() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.99) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile(list(map(float, range(101))), 0.95) == 95.0


def test_summary_from_events() -> None:
    events = [
        {"kind": "probe", "experiment": "leakage", "target": "direct", "path": "get", "expected": "deny", "observed": "allow"},
        {"kind": "probe", "experiment": "leakage", "target": "direct", "path": "get", "expected": "deny", "observed": "deny"},
        {"kind": "probe", "experiment": "leakage", "target": "direct", "path": "get", "expected": "allow", "observed": "allow"},
        {"kind": "probe", "experiment": "leakage", "target": "sidecar", "path": "get", "expected": "allow", "observed": "deny"},
        {"kind": "latency", "experiment": "provenance", "target": "sidecar", "op": "hop", "ms": 2.0},
        {"kind": "latency", "experiment": "provenance", "target": "sidecar", "op": "hop", "ms": 4.0},
        {"kind": "not_supported", "experiment": "forgetting", "target": "direct", "path": "history", "reason": "no route"},
    ]
    paths, lats, unsupported = summarize(events)
    direct = next(p for p in paths if p.target == "direct")
    assert (direct.leak.k, direct.leak.n, direct.miss.k, direct.miss.n) == (1, 2, 0, 1)
    side = next(p for p in paths if p.target == "sidecar")
    assert side.leak.n == 0 and side.leak.p is None and side.miss.p == 1.0
    assert lats[0].n == 2 and lats[0].p50 == 3.0 and math.isclose(lats[0].p99 or 0, 3.98)
    assert unsupported[0]["path"] == "history"


class FakeChroma:
    """A Chroma v2 stand-in for the contradiction experiment. With ``governed`` it behaves like the
    sidecar for a single-valued predicate: a row carrying ``mw_subject``/``mw_predicate`` supersedes the
    active row with the same pair, and superseded rows are not served. Without it, every row is served."""

    def __init__(self, governed: bool) -> None:
        self.governed = governed
        self.rows: dict[str, tuple[str, dict[str, Any], bool]] = {}  # id -> (document, metadata, active)
        self.added: list[dict[str, Any]] = []
        self.wheres: list[Any] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        op = request.url.path.rsplit("/", 1)[1]
        if op == "add":
            for rid, doc, meta in zip(body["ids"], body["documents"], body["metadatas"]):
                self.added.append(meta)
                if self.governed and meta.get("mw_predicate") == "pipeline_status":
                    for old, (d, m, active) in list(self.rows.items()):
                        if active and (m.get("mw_subject"), m.get("mw_predicate")) == (meta["mw_subject"], meta["mw_predicate"]):
                            self.rows[old] = (d, m, False)
                self.rows[rid] = (doc, meta, True)
            return httpx.Response(200, json=True)
        served = [(rid, d, m) for rid, (d, m, active) in self.rows.items() if active]
        if op == "get":
            self.wheres.append(body.get("where"))
            terms = (body.get("where") or {}).get("$and", [])
            hits = [r for r in served if all(r[2].get(k) == v for term in terms for k, v in term.items())]
            return httpx.Response(200, json={"ids": [r[0] for r in hits], "documents": [r[1] for r in hits],
                                             "metadatas": [r[2] for r in hits]})
        if op == "query":
            hits = served[: body["n_results"] * 100]  # every row is "near": the superseded one must not be among them
            return httpx.Response(200, json={"ids": [[r[0] for r in hits]], "documents": [[r[1] for r in hits]],
                                             "metadatas": [[r[2] for r in hits]]})
        return httpx.Response(404, json={"error": "unexpected"})


def test_contradiction_experiment_uses_the_governed_triple_through_the_sidecar() -> None:
    plan = Plan.build(5)
    fakes = {"direct": FakeChroma(governed=False), "sidecar": FakeChroma(governed=True)}
    keys = {a.uid: f"key-{a.uid}" for a in plan.agents}

    async def run() -> list[dict[str, Any]]:
        ev = Events()
        for name, fake in fakes.items():
            t = ChromaTarget(name, "http://probe.invalid", {plan.tenants[0]: ("t", "db", "cid")}, keys,
                             transport=httpx.MockTransport(fake))
            try:
                await contradiction(plan, t, lambda texts: [[float(i), 1.0] for i in range(len(texts))], ev, Sizes.tiny())
            finally:
                await t.close()
        return ev.items

    paths, _, _ = summarize(asyncio.run(run()))
    by = {(p.experiment, p.path, p.target): p for p in paths}
    n = 2 * 2 * Sizes.tiny().contradiction_facts  # two modes x (old, new)
    assert len(fakes["sidecar"].added) == len(fakes["direct"].added) == n  # the same facts on both targets
    # the sidecar gets the governed triple and is asked about it; direct gets the same values as plain keys
    assert all(set(m) >= {"mw_subject", "mw_predicate", "mw_object"} and "subject" not in m for m in fakes["sidecar"].added)
    assert all(set(m) >= {"subject", "predicate", "object"} and not any(k.startswith("mw_") for k in m)
               for m in fakes["direct"].added)
    assert [m["mw_object"] for m in fakes["sidecar"].added[:2]] == ["paused", "running"]
    assert all(w == {"$and": [{"mw_subject": w["$and"][0]["mw_subject"]}, {"mw_predicate": "pipeline_status"}]}
               for w in fakes["sidecar"].wheres)
    for mode in ("sequential", "concurrent"):
        side, direct = by[("contradiction", mode, "sidecar")], by[("contradiction", mode, "direct")]
        assert (side.leak.k, side.leak.n) == (0, Sizes.tiny().contradiction_facts)  # stale-read rate 0
        assert direct.leak.p == 1.0  # both facts served
        for target in ("sidecar", "direct"):
            newest = by[("contradiction", f"{mode}-newest", target)].miss
            assert newest.k == 0 and newest.n == Sizes.tiny().contradiction_facts  # newest-visible rate 1
    assert by[("contradiction", "sequential-search", "sidecar")].leak.k == 0
    assert by[("contradiction", "sequential-search", "direct")].leak.p == 1.0
