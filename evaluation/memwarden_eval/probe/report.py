"""Run directory output: events.jsonl, summary.csv, summary.md and PNG plots (matplotlib).

`write_report(dir)` reads only ``events.jsonl`` (and ``meta.json`` for the header), so
``memwarden-eval probe report DIR`` recomputes every summary from the raw events.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from memwarden_eval.probe.metrics import LatencySummary, PathSummary, summarize

RATE_LABEL = {
    "contradiction": ("stale-read rate", "newest-missing rate"),
    "propagation": ("cross-fleet leak rate", "invisibility rate"),
    "provenance": ("-", "error rate"),
    "forgetting": ("recovery/confirmation rate", "over-hiding rate"),
}


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    with open(run_dir / "events.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_meta(run_dir: Path) -> dict[str, Any]:
    """meta.json of a run directory ({} when absent); runs before the backend was recorded were Chroma."""
    path = run_dir / "meta.json"
    meta: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return meta


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def side_by_side(paths: list[PathSummary]) -> list[list[str]]:
    """Rows: experiment, path, direct leak, sidecar leak, direct miss, sidecar miss."""
    keyed: dict[tuple[str, str], dict[str, PathSummary]] = {}
    for p in paths:
        keyed.setdefault((p.experiment, p.path), {})[p.target] = p
    rows = []
    for (exp, path), by in keyed.items():
        def cell(target: str, which: str) -> str:
            p = by.get(target)
            return "-" if p is None else getattr(p, which).fmt()
        rows.append([exp, path, cell("direct", "leak"), cell("sidecar", "leak"), cell("direct", "miss"), cell("sidecar", "miss")])
    return rows


def write_report(run_dir: Path) -> str:
    """Recompute summary.csv, summary.md and plots from events.jsonl; returns the markdown."""
    events = read_events(run_dir)
    meta = read_meta(run_dir)
    paths, lats, unsupported = summarize(events)
    with open(run_dir / "summary.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "experiment", "path_or_op", "target", "k", "n", "rate", "ci_low", "ci_high", "p50_ms", "p95_ms", "p99_ms"])
        for p in paths:
            for kind, r in (("leak", p.leak), ("miss", p.miss)):
                w.writerow([kind, p.experiment, p.path, p.target, r.k, r.n, r.p, r.lo, r.hi, "", "", ""])
        for lt in lats:
            w.writerow(["latency", lt.experiment, lt.op, lt.target, "", lt.n, "", "", "", lt.p50, lt.p95, lt.p99])
        for u in unsupported:
            w.writerow(["not_supported", u["experiment"], u["path"], u["target"], "", "", "", "", "", "", "", ""])
    backend = meta.get("backend", "chroma")
    md = [f"# memwarden-eval probe — {meta.get('run', run_dir.name)}", ""]
    if meta:
        md += [f"backend {backend} (direct = {backend} alone, sidecar = {backend} through memwarden), seed {meta.get('seed')}, "
               f"nonce {meta.get('nonce')}, plan {meta.get('plan')}, experiments {', '.join(meta.get('experiments', []))}", ""]
    md += ["Leak = observed allow over expected-deny probes; miss = observed deny over expected-allow probes;",
           "95% Wilson intervals. Expectations are the reference scope predicate of docs/design.md §3.", "",
           "| experiment | path | leak (direct) | leak (sidecar) | miss (direct) | miss (sidecar) |", "|---|---|---|---|---|---|"]
    md += [f"| {' | '.join(r)} |" for r in side_by_side(paths)]
    md += ["", "Rates by experiment: " + "; ".join(f"{k}: leak = {a}, miss = {b}" for k, (a, b) in RATE_LABEL.items()), ""]
    md += ["| experiment | op | target | n | p50 ms | p95 ms | p99 ms |", "|---|---|---|---|---|---|---|"]
    md += [f"| {lt.experiment} | {lt.op} | {lt.target} | {lt.n} | {_fmt(lt.p50)} | {_fmt(lt.p95)} | {_fmt(lt.p99)} |" for lt in lats]
    if unsupported:
        md += ["", "Not supported:", ""] + [f"- {u['experiment']} / {u['path']} on {u['target']}: {u['reason']}" for u in unsupported]
    text = "\n".join(md) + "\n"
    (run_dir / "summary.md").write_text(text, encoding="utf-8")
    _plots(run_dir, paths, lats)
    return text


def _plots(run_dir: Path, paths: list[PathSummary], lats: list[LatencySummary]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for which in ("leak", "miss"):
        items = [p for p in paths if getattr(p, which).n > 0]
        labels = sorted({f"{p.experiment}/{p.path}" for p in items})
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(labels) + 2), 4.5))
        width = 0.4
        for offset, target in ((-width / 2, "direct"), (width / 2, "sidecar")):
            xs: list[float] = []
            ys: list[float] = []
            err: list[list[float]] = [[], []]
            for i, label in enumerate(labels):
                p = next((q for q in items if f"{q.experiment}/{q.path}" == label and q.target == target), None)
                if p is None:
                    continue
                r = getattr(p, which)
                xs.append(i + offset)
                ys.append(r.p)
                err[0].append(r.p - r.lo)
                err[1].append(r.hi - r.p)
            ax.bar(xs, ys, width, yerr=err, capsize=3, label=target)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"{which} rate (95% Wilson)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(run_dir / f"{which}_rates.png", dpi=110)
        plt.close(fig)
    events = read_events(run_dir)
    series: dict[str, list[float]] = {}
    for e in events:
        if e.get("kind") == "latency":
            series.setdefault(f"{e['experiment']}/{e['op']}/{e['target']}", []).append(float(e["ms"]))
    if series:
        names = sorted(series)
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(names) + 2), 4.5))
        ax.boxplot([series[n] for n in names], showfliers=False)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        fig.tight_layout()
        fig.savefig(run_dir / "latency.png", dpi=110)
        plt.close(fig)
