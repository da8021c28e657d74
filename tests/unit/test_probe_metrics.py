"""Probe metrics on synthetic event streams (Wilson intervals at the edges, empty denominators)."""

from __future__ import annotations

import math

import pytest

from sidecar.probe.metrics import quantile, summarize, wilson


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
