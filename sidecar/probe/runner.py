"""Orchestration: provision keys and collections, run the experiments on both targets, write the run dir."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import tempfile
from pathlib import Path
from typing import Any, Callable

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sidecar.harness import start_chroma, start_sidecar
from sidecar.ledger import SQLiteLedger
from sidecar.probe.experiments import EXPERIMENTS, RUNNERS, Embed, Events, Sizes
from sidecar.probe.metrics import summarize
from sidecar.probe.plan import Plan
from sidecar.probe.report import write_report
from sidecar.probe.targets import ChromaTarget

POLICIES = Path(__file__).resolve().parents[2] / "policies"
DATABASE = "probe_db"


def _provision_sidecar(plan: Plan, sidecar_url: str, ledger_path: Path) -> tuple[dict[str, str], dict[str, tuple[str, str, str]]]:
    ledger = SQLiteLedger(ledger_path)
    keys: dict[str, str] = {}
    collections: dict[str, tuple[str, str, str]] = {}
    try:
        for tenant in plan.tenants:
            admin = ledger.create_key("admin", tenant, None, None, 0)[1]
            for a in plan.agents:
                if a.tenant == tenant:
                    keys[a.uid] = ledger.create_key("agent", tenant, a.fleet, a.name, a.trust)[1]
            with httpx.Client(base_url=sidecar_url, headers={"X-API-Key": admin}, timeout=60, trust_env=False) as http:
                http.post("/api/v2/tenants", json={"name": tenant}).raise_for_status()
                http.post(f"/api/v2/tenants/{tenant}/databases", json={"name": DATABASE}).raise_for_status()
                coll = http.post(f"/api/v2/tenants/{tenant}/databases/{DATABASE}/collections", json={"name": "memories"})
                coll.raise_for_status()
                collections[tenant] = (tenant, DATABASE, coll.json()["id"])
    finally:
        ledger.close()
    return keys, collections


def _provision_direct(plan: Plan, chroma_url: str) -> dict[str, tuple[str, str, str]]:
    """One shared collection for every plan tenant: the naive deployment the sidecar is compared with."""
    tenant = f"{plan.nonce}-direct"
    with httpx.Client(base_url=chroma_url, timeout=60, trust_env=False) as http:
        http.post("/api/v2/tenants", json={"name": tenant}).raise_for_status()
        http.post(f"/api/v2/tenants/{tenant}/databases", json={"name": DATABASE}).raise_for_status()
        coll = http.post(f"/api/v2/tenants/{tenant}/databases/{DATABASE}/collections", json={"name": "memories"})
        coll.raise_for_status()
        cid = coll.json()["id"]
    return {t: (tenant, DATABASE, cid) for t in plan.tenants}


async def _run_all(plan: Plan, targets: list[ChromaTarget], experiments: list[str], embed: Embed, sizes: Sizes,
                   on_event: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
    ev = Events(on_event)
    try:
        for name in experiments:
            for target in targets:
                await RUNNERS[name](plan, target, embed, ev, sizes)
    finally:
        for target in targets:
            await target.close()
    return ev.items


def run_probe(plan: Plan, experiments: list[str], chroma_url: str, sidecar_url: str, ledger_path: Path, out: Path,
              embed: Embed, sizes: Sizes | None = None, console: Console | None = None, concurrency: int = 8,
              rate_per_s: float = 500.0) -> Path:
    """Run `experiments` against Chroma directly and through the sidecar; returns the run directory."""
    unknown = set(experiments) - set(EXPERIMENTS)
    if unknown:
        raise ValueError(f"unknown experiments: {sorted(unknown)}")
    sizes = sizes or Sizes()
    console = console or Console()
    keys, side_colls = _provision_sidecar(plan, sidecar_url, ledger_path)
    direct_colls = _provision_direct(plan, chroma_url)
    targets = [ChromaTarget("direct", chroma_url, direct_colls, concurrency=concurrency, rate_per_s=rate_per_s),
               ChromaTarget("sidecar", sidecar_url, side_colls, keys, concurrency=concurrency, rate_per_s=rate_per_s)]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    label = "all" if set(experiments) == set(EXPERIMENTS) else "+".join(experiments)
    run_dir = out / f"{stamp}-{label}-seed{plan.seed}"
    run_dir.mkdir(parents=True, exist_ok=False)
    events_file = open(run_dir / "events.jsonl", "w", encoding="utf-8")
    with Progress(TextColumn("probe {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(label, total=None)

        def on_event(e: dict[str, Any]) -> None:
            events_file.write(json.dumps(e, separators=(",", ":")) + "\n")
            progress.update(task, advance=1, description=f"{e['experiment']} ({e['target']})")

        try:
            asyncio.run(_run_all(plan, targets, experiments, embed, sizes, on_event))
        finally:
            events_file.close()
    meta = {"run": run_dir.name, "seed": plan.seed, "nonce": plan.nonce, "experiments": experiments,
            "plan": f"{len(plan.tenants)} tenants x {len(plan.fleets)} fleets x {len(plan.agents) // (len(plan.tenants) * len(plan.fleets))} agents",
            "targets": {"direct": chroma_url, "sidecar": sidecar_url}}
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    write_report(run_dir)
    return run_dir


def print_table(run_dir: Path, console: Console) -> None:
    from sidecar.probe.report import read_events

    paths, _, _ = summarize(read_events(run_dir))
    table = Table(title=f"memwarden probe: direct Chroma vs through memwarden ({run_dir.name}; 95% Wilson intervals in summary.md)")
    for col in ("experiment", "path", "leak direct", "leak sidecar", "miss direct", "miss sidecar"):
        table.add_column(col)
    keyed: dict[tuple[str, str], dict[str, Any]] = {}
    for p in paths:
        keyed.setdefault((p.experiment, p.path), {})[p.target] = p

    def cell(by: dict[str, Any], target: str, which: str) -> str:
        p = by.get(target)
        r = None if p is None else getattr(p, which)
        if r is None or r.n == 0:
            return "-"
        colour = "green" if (r.k == 0) else ("red" if which == "leak" or target == "sidecar" else "yellow")
        return f"[{colour}]{r.p:.2f}[/{colour}] ({r.k}/{r.n})"

    for (exp, path), by in keyed.items():
        table.add_row(exp, path, cell(by, "direct", "leak"), cell(by, "sidecar", "leak"), cell(by, "direct", "miss"), cell(by, "sidecar", "miss"))
    console.print(table)


def run_embedded(seed: int, experiments: list[str], out: Path, sizes: Sizes | None = None, console: Console | None = None,
                 tenants: int = 1, fleets: int = 4, agents: int = 6) -> Path:
    """Start `chroma run` and the sidecar in a temp dir, run the probe, stop both."""
    from sidecar.embeddings import embed

    console = console or Console()
    plan = Plan.build(seed, tenants, fleets, agents)
    with tempfile.TemporaryDirectory(prefix="memwarden-probe-") as tmp:
        root = Path(tmp)
        chroma = start_chroma(root / "chroma")
        side = None
        try:
            SQLiteLedger(root / "ledger.db").close()
            side = start_sidecar(chroma.url, root / "ledger.db", POLICIES)
            return run_probe(plan, experiments, chroma.url, side.url, root / "ledger.db", out, embed, sizes, console)
        finally:
            if side:
                side.stop()
            chroma.stop()
