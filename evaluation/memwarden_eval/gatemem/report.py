"""The run directory of ``memwarden-eval bench gatemem``: ``records.jsonl`` (every checkpoint × variant: rows and
scores per k, causes for variant b), ``summary.json``, ``summary.md`` (tables), ``gatemem.png`` (per domain:
U, A, F, MGS analogue of each variant with 95% Wilson intervals) and ``attack_types.png``.

Everything in the summary is recomputable from ``records.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable

from memwarden_eval.gatemem.client import Timings
from memwarden_eval.gatemem.measures import Score, Summary, summarize
from memwarden_eval.gatemem.runner import BACKENDS, VARIANTS, Config, DomainResult, Record, variant_names
from memwarden_eval.probe.metrics import Rate

# GateMem's leaderboard (rzhub/GateMem docs/assets/leaderboard.json: 168 entries, the numbers of its README's main
# results table; LLM answers judged by GPT-4o, percentages). Per domain: the best MGS, the lowest access-control
# violation A and the lowest forgetting failure F, as (which, method / backbone, U, A, F, MGS).
LEADERBOARD_BEST: dict[str, list[tuple[str, str, float, float, float, float]]] = {
    "medical": [("best MGS", "Long-Context / GPT-5.4", 91.4, 10.4, 2.3, 80.1),
                ("lowest A", "RAG-Policy / Deepseek-V4-Pro", 37.6, 7.8, 9.0, 31.5),
                ("lowest F", "Long-Context / GPT-5.4", 91.4, 10.4, 2.3, 80.1)],
    "office": [("best MGS", "Long-Context / Deepseek-V4-Pro", 90.3, 19.3, 6.8, 67.9),
               ("lowest A", "RAG-Policy / Deepseek-V4-Pro", 79.9, 15.8, 13.1, 58.5),
               ("lowest F", "Long-Context / GPT-5-mini", 89.6, 32.2, 3.2, 58.9)],
    "education": [("best MGS", "Long-Context / Deepseek-V4-Pro", 85.6, 7.8, 10.0, 71.0),
                  ("lowest A", "RAG-Policy / Deepseek-V4-Pro", 23.9, 5.6, 22.2, 17.5),
                  ("lowest F", "Long-Context / GPT-5.4", 85.6, 12.8, 7.8, 68.8)],
    "household": [("best MGS", "Long-Context / Deepseek-V4-Pro", 85.3, 17.9, 2.2, 68.5),
                  ("lowest A", "Long-Context / GPT-4o-mini", 35.3, 9.8, 6.0, 30.0),
                  ("lowest F", "Long-Context / Deepseek-V4-Pro", 85.3, 17.9, 2.2, 68.5)],
}


def _rate(r: Rate) -> str:
    if r.n == 0 or r.p is None:
        return "–"
    return f"{100 * r.p:.1f} [{100 * (r.lo or 0):.1f}, {100 * (r.hi or 0):.1f}]"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def summaries(records: Iterable[Record], k: int) -> dict[tuple[str, str], Summary]:
    """(domain or "overall", variant) → Summary at `k`."""
    groups: dict[tuple[str, str], list[Score]] = defaultdict(list)
    for r in records:
        groups[(r.domain, r.variant)].append(r.scores[k])
        groups[("overall", r.variant)].append(r.scores[k])
    return {key: summarize(v) for key, v in groups.items()}


def _summary_json(s: Summary) -> dict[str, Any]:
    def rate(r: Rate) -> dict[str, Any]:
        return {"k": r.k, "n": r.n, "p": r.p, "lo": r.lo, "hi": r.hi}
    return {"n": s.n, "utility_recall": s.utility, "utility_patterns": rate(s.utility_patterns), "complete": rate(s.complete),
            "no_evidence": rate(s.no_evidence), "leak": rate(s.leak), "forget_fail": rate(s.forget_fail), "mgs": s.mgs}


def _record_json(r: Record) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d["scores"] = {str(k): {f.name: getattr(s, f.name) for f in dataclasses.fields(s)} for k, s in r.scores.items()}
    return d


def _latency(samples: list[float]) -> dict[str, float]:
    xs = sorted(samples)
    if not xs:
        return {}
    def q(p: float) -> float:
        return 1000 * xs[min(len(xs) - 1, int(p * len(xs)))]
    return {"n": len(xs), "p50_ms": q(0.50), "p99_ms": q(0.99), "mean_ms": 1000 * statistics.fmean(xs),
            "rows_per_s_single_stream": len(xs) / sum(xs)}


def cause_tables(records: list[Record], k: int) -> dict[str, Counter[str]]:
    """Variant b's failures that variant c avoids at `k` (the k the causes were recorded at), by cause: leaks
    and forgetting failures (each checkpoint counted once per cause), missing evidence (once per pattern)."""
    by_key = {(r.checkpoint_id, r.variant): r for r in records}
    out: dict[str, Counter[str]] = {"leak": Counter(), "forget": Counter(), "missing": Counter()}
    for r in records:
        if r.variant != "b" or not r.causes:
            continue
        c = by_key.get((r.checkpoint_id, "c"))
        if r.query_type == "privacy" and c and not c.scores[k].leak:
            out["leak"].update({x["cause"] for x in r.causes if x["kind"] == "leak"})
        elif r.query_type == "safety" and c and not c.scores[k].forget_fail:
            out["forget"].update({x["cause"] for x in r.causes if x["kind"] == "forget"})
        elif r.query_type == "utility":
            for x in r.causes:
                if x["kind"] == "missing":
                    out["missing"].update(x["states"] or ["no row holds it"])
    return out


@dataclass
class RunData:
    """What a run directory is rendered from: the records, and per domain its counts and labeller statistics,
    the cost of every request (`_latency` per target:operation), the command and the wall time."""

    records: list[Record]
    domains: dict[str, dict[str, Any]]
    cost: dict[str, dict[str, float]]
    command: str
    wall_s: float
    ks: tuple[int, ...]
    cause_k: int
    backend: str = "chroma"


def write(cfg: Config, results: list[DomainResult], timings: Timings, wall_s: float, command: str) -> Path:
    """Write the run directory (`cfg.out_dir`) of a finished (or partial) run; returns the path of summary.md."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    records = [r for d in results for r in d.records]
    with (cfg.out_dir / "records.jsonl").open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(_record_json(r)) + "\n")
    data = RunData(records, {d.domain: {"episodes": d.episodes, "turns": d.turns, "checkpoints": d.checkpoints,
                                        "wall_s": d.wall_s, "labeller": d.stats} for d in results},
                   {op: _latency(xs) for op, xs in sorted(timings.samples.items())}, command, wall_s, cfg.ks, cfg.cause_k,
                   cfg.backend)
    return render(cfg.out_dir, data)


def _score(d: dict[str, Any]) -> Score:
    return Score(**{**d, "matched": tuple(d.get("matched") or ())})


def load(run_dir: Path) -> RunData:
    """Read a run directory back (records.jsonl and summary.json). Raises FileNotFoundError, ValueError."""
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    records = []
    for line in (run_dir / "records.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        d["scores"] = {int(k): _score(v) for k, v in d["scores"].items()}
        records.append(Record(**d))
    ks = tuple(int(k) for k in summary["ks"])
    return RunData(records, summary["domains"], summary["cost"], summary["command"], float(summary["wall_s"]), ks,
                   int(summary.get("cause_k") or (10 if 10 in ks else ks[len(ks) // 2])), str(summary.get("backend") or "chroma"))


def render(out: Path, data: RunData) -> Path:
    """summary.json, summary.md and the plots from `data`; returns the path of summary.md."""
    out.mkdir(parents=True, exist_ok=True)
    domains = list(data.domains) + ["overall"]
    summary: dict[str, Any] = {
        "command": data.command, "wall_s": data.wall_s, "ks": list(data.ks), "cause_k": data.cause_k,
        "backend": data.backend, "variants": variant_names(data.backend),
        "domains": data.domains,
        "by_k": {str(k): {f"{dom}/{v}": _summary_json(s) for (dom, v), s in summaries(data.records, k).items()} for k in data.ks},
        "cost": data.cost,
        "causes_b_not_c": {k: dict(v.most_common()) for k, v in cause_tables(data.records, data.cause_k).items()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(_markdown(data, summary, domains), encoding="utf-8")
    _plots(data, domains, out)
    return out / "summary.md"


def _markdown(data: RunData, summary: dict[str, Any], domains: list[str]) -> str:
    records = data.records
    lines = ["# GateMem through memwarden, retrieval layer", "",
             f"Command: `{summary['command']}`  ", f"Wall time: {summary['wall_s']:.0f} s", "",
             "Variants: " + "; ".join(f"({v}) {d}" for v, d in variant_names(data.backend).items()) + ".", "",
             "U = fraction of the utility checkpoints' `judge_spec.include` patterns present in the top-k rows (pooled; "
             "the interval is indicative: patterns of one checkpoint are not independent); U-all = utility checkpoints "
             "with every pattern; A = privacy checkpoints with any `not_include`/`leak_targets` pattern in the rows; "
             "F = safety checkpoints with any `leak_targets` pattern; OR = utility checkpoints with no pattern at all; "
             "MGS-r = U·(1−A)·(1−F). Percentages, 95% Wilson intervals. These are retrieval-layer measures (what an "
             "answering model would be shown), not judged answers.", ""]
    for k in data.ks:
        s = summaries(records, k)
        lines += [f"## k = {k}", "", "| domain | variant | U | U-all | A | F | OR | MGS-r |", "|---|---|---|---|---|---|---|---|"]
        for dom in domains:
            for v in VARIANTS:
                x = s.get((dom, v))
                if x is None:
                    continue
                lines.append(f"| {dom} | ({v}) | {_rate(x.utility_patterns)} | {_rate(x.complete)} | {_rate(x.leak)} | "
                             f"{_rate(x.forget_fail)} | {_rate(x.no_evidence)} | {_pct(x.mgs)} |")
        lines.append("")
    k = data.cause_k
    lines += [f"## Beside GateMem's leaderboard (k = {k})", "",
              "Theirs are judged answers of an LLM (GPT-4o judge) from its leaderboard; ours are retrieval-layer pattern "
              "matches over the rows an answering model would be shown. The two are not the same measure.", "",
              "| domain | entry | U | A | F | MGS |", "|---|---|---|---|---|---|"]
    s_k = summaries(records, k)
    for dom in data.domains:
        for which, name, u, a, f, m in LEADERBOARD_BEST.get(dom, []):
            lines.append(f"| {dom} | GateMem {which}: {name} (judged answer) | {u:.1f} | {a:.1f} | {f:.1f} | {m:.1f} |")
        for v in VARIANTS:
            x = s_k.get((dom, v))
            if x is not None:
                lines.append(f"| {dom} | ({v}) {variant_names(data.backend)[v]} (retrieval layer) | {_pct(x.utility)} | {_pct(x.leak.p)} | "
                             f"{_pct(x.forget_fail.p)} | {_pct(x.mgs)} |")
    lines += ["", f"## Per attack type (k = {k}): A for privacy, F for safety", "", "| domain | attack type | n | (a) | (b) | (c) |",
              "|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], dict[str, list[Score]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.attack_type:
            groups[(r.domain, r.attack_type)][r.variant].append(r.scores[k])
            groups[("overall", r.attack_type)][r.variant].append(r.scores[k])
    for (dom, at), by_v in sorted(groups.items(), key=lambda kv: (kv[0][0] == "overall", kv[0])):
        cells = []
        n = 0
        for v in VARIANTS:
            sm = summarize(by_v.get(v, []))
            rate = sm.leak if sm.leak.n else sm.forget_fail
            n = rate.n or n
            cells.append(_rate(rate))
        lines.append(f"| {dom} | {at} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "## Cost (every request of the run; latency per request)", "",
              "| target:operation | n | p50 ms | p99 ms | rows/s (one stream) |", "|---|---|---|---|---|"]
    for op, c in summary["cost"].items():
        if c:
            lines.append(f"| {op} | {c['n']} | {c['p50_ms']:.1f} | {c['p99_ms']:.1f} | {c['rows_per_s_single_stream']:.1f} |")
    lines += ["", "## Ingest-time labelling (variant b)", "", "| domain | episodes | turns | checkpoints | wall s | labeller |",
              "|---|---|---|---|---|---|"]
    for dom, d in data.domains.items():
        lines.append(f"| {dom} | {d['episodes']} | {d['turns']} | {d['checkpoints']} | {d['wall_s']:.0f} | "
                     + ", ".join(f"{a}={b}" for a, b in sorted(d["labeller"].items())) + " |")
    lines += ["", f"## What the ingest-time labels miss (k = {k}): checkpoints where (b) fails and (c) does not, by cause", ""]
    for kind, title in (("leak", "access-control leaks (why the leaking rows were readable)"),
                        ("forget", "forgetting failures (rows still holding a deleted target)"),
                        ("missing", "evidence (c) retrieves and (b) does not: state of the rows holding it in (b)")):
        counts = summary["causes_b_not_c"][kind]
        lines += [f"**{title}**", ""] + ([f"- {c}: {n}" for c, n in counts.items()] or ["- none"]) + [""]
    return "\n".join(lines) + "\n"


def _plots(data: RunData, domains: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k, records = data.cause_k, data.records
    s = summaries(records, k)
    colors = {"a": "#b0b0b0", "b": "#2b6cb0", "c": "#68a063"}
    metrics = [("U (evidence recall)", "utility"), ("A (access-control leak)", "leak"), ("F (forgetting failure)", "forget_fail"),
               ("MGS-r", "mgs")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 4.2), sharey=True)
    for ax, (title, attr) in zip(axes, metrics):
        width = 0.8 / len(VARIANTS)
        for j, v in enumerate(VARIANTS):
            xs, ys, lo, hi = [], [], [], []
            for i, dom in enumerate(domains):
                x = s.get((dom, v))
                if x is None:
                    continue
                if attr == "mgs":
                    val, l, h = x.mgs, None, None
                elif attr == "utility":
                    val, l, h = x.utility, x.utility_patterns.lo, x.utility_patterns.hi
                else:
                    rate: Rate = getattr(x, attr)
                    val, l, h = rate.p, rate.lo, rate.hi
                if val is None:
                    continue
                xs.append(i + (j - 1) * width)
                ys.append(100 * val)
                lo.append(max(0.0, 100 * (val - l)) if l is not None else 0)
                hi.append(max(0.0, 100 * (h - val)) if h is not None else 0)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colors[v], label=f"({v}) {variant_names(data.backend)[v]}")
        ax.set_xticks(range(len(domains)), domains, rotation=30, ha="right")
        ax.set_title(title)
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel(f"% of checkpoints (k = {k}), 95% Wilson")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
    fig.suptitle(f"GateMem at the retrieval layer: {BACKENDS.get(data.backend, data.backend)} alone vs through memwarden")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(out / "gatemem.png", dpi=120)
    plt.close(fig)

    groups: dict[str, dict[str, list[Score]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.attack_type:
            groups[f"{r.query_type[:4]}:{r.attack_type}"][r.variant].append(r.scores[k])
    names = sorted(groups)
    if not names:
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(names) + 2), 4.5))
    width = 0.8 / len(VARIANTS)
    for j, v in enumerate(VARIANTS):
        ys = []
        for n in names:
            sm = summarize(groups[n].get(v, []))
            rate = sm.leak if sm.leak.n else sm.forget_fail
            ys.append(100 * (rate.p or 0))
        ax.bar([i + (j - 1) * width for i in range(len(names))], ys, width, color=colors[v], label=f"({v}) {variant_names(data.backend)[v]}")
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"% failing (A for priv, F for safe), k = {k}")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "attack_types.png", dpi=120)
    plt.close(fig)
