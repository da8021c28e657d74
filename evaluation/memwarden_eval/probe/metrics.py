"""Metrics over probe events; everything in a summary is recomputable from events.jsonl alone.

Event kinds (one JSON object per line):

- ``probe``: one governance probe — ``experiment, target, path, principal, row, expected`` ("allow" or
  "deny" under the reference scope predicate of docs/design.md §3), ``observed`` ("allow" when the row
  or its content came back, else "deny"), ``status`` (HTTP status), ``latency_ms``.
- ``latency``: one timed operation — ``experiment, target, op, ms``.
- ``not_supported``: ``experiment, target, path, reason``.

Leak rate = observed allow / expected-deny probes; miss rate = observed deny / expected-allow probes,
each with a 95% Wilson score interval (Wilson 1927; z = 1.959964).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

Z95 = 1.959963984540054


@dataclass(frozen=True, slots=True)
class Rate:
    """k of n with its 95% Wilson interval; `p`, `lo`, `hi` are None when n == 0."""

    k: int
    n: int
    p: float | None
    lo: float | None
    hi: float | None

    def fmt(self) -> str:
        if self.n == 0 or self.p is None or self.lo is None or self.hi is None:
            return "n/a (0 probes)"
        return f"{self.p:.3f} [{self.lo:.3f}, {self.hi:.3f}] ({self.k}/{self.n})"


def wilson(k: int, n: int, z: float = Z95) -> Rate:
    """Wilson score interval for k successes in n trials. Raises ValueError unless 0 <= k <= n."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k} n={n}")
    if n == 0:
        return Rate(0, 0, None, None, None)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At k == 0 and k == n the exact bounds are 0 and 1; rounding would otherwise leave 1 - 1e-16.
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return Rate(k, n, p, lo, hi)


def quantile(values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile (q in [0, 1]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class PathSummary:
    experiment: str
    path: str
    target: str
    leak: Rate
    miss: Rate


@dataclass(frozen=True, slots=True)
class LatencySummary:
    experiment: str
    op: str
    target: str
    n: int
    p50: float | None
    p95: float | None
    p99: float | None


def summarize(events: Iterable[dict[str, Any]]) -> tuple[list[PathSummary], list[LatencySummary], list[dict[str, Any]]]:
    """(per-path leak/miss, per-op latency quantiles, not-supported entries) from raw events."""
    counts: dict[tuple[str, str, str], list[int]] = {}
    lat: dict[tuple[str, str, str], list[float]] = {}
    unsupported: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in events:
        kind = e.get("kind")
        if kind == "probe":
            c = counts.setdefault((e["experiment"], e["path"], e["target"]), [0, 0, 0, 0])
            if e["expected"] == "deny":
                c[1] += 1
                c[0] += e["observed"] == "allow"
            else:
                c[3] += 1
                c[2] += e["observed"] == "deny"
        elif kind == "latency":
            lat.setdefault((e["experiment"], e["op"], e["target"]), []).append(float(e["ms"]))
        elif kind == "not_supported":
            unsupported[(e["experiment"], e["path"], e["target"])] = e
    paths = [PathSummary(x, p, t, wilson(c[0], c[1]), wilson(c[2], c[3])) for (x, p, t), c in sorted(counts.items())]
    lats = [LatencySummary(x, o, t, len(v), quantile(v, 0.5), quantile(v, 0.95), quantile(v, 0.99))
            for (x, o, t), v in sorted(lat.items())]
    return paths, lats, [unsupported[k] for k in sorted(unsupported)]
