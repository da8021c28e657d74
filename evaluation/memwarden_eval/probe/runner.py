"""Orchestration: provision keys (and Chroma collections), run the experiments on both targets of one
backend (directly and through the sidecar), write the run directory."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
import tempfile
from pathlib import Path
from typing import Any, Callable

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sidecar.config import default_policies_dir
from memwarden_eval.harness import Server, start_chroma, start_mem0, start_sidecar
from sidecar.ledger import SQLiteLedger
from memwarden_eval.probe.experiments import EXPERIMENTS, RUNNERS, Embed, Events, Sizes
from memwarden_eval.probe.metrics import summarize
from memwarden_eval.probe.plan import Plan
from memwarden_eval.probe.report import write_report
from memwarden_eval.probe.targets import ChromaTarget, Mem0Target, Target

POLICIES = default_policies_dir()  # the packaged default set (a checkout: its policies/)
DATABASE = "probe_db"
BACKENDS = ("chroma", "mem0")
BACKEND_LABEL = {"chroma": "Chroma", "mem0": "Mem0"}


def _provision_keys(plan: Plan, ledger_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(agent uid → key, tenant → admin key), created in the sidecar's ledger."""
    ledger = SQLiteLedger(ledger_path)
    keys: dict[str, str] = {}
    admins: dict[str, str] = {}
    try:
        for tenant in plan.tenants:
            admins[tenant] = ledger.create_key("admin", tenant, None, None, 0)[1]
            for a in plan.agents:
                if a.tenant == tenant:
                    keys[a.uid] = ledger.create_key("agent", tenant, a.fleet, a.name, a.trust)[1]
    finally:
        ledger.close()
    return keys, admins


def _provision_sidecar(plan: Plan, sidecar_url: str, ledger_path: Path) -> tuple[dict[str, str], dict[str, tuple[str, str, str]]]:
    keys, admins = _provision_keys(plan, ledger_path)
    collections: dict[str, tuple[str, str, str]] = {}
    for tenant in plan.tenants:
        with httpx.Client(base_url=sidecar_url, headers={"X-API-Key": admins[tenant]}, timeout=60, trust_env=False) as http:
            http.post("/api/v2/tenants", json={"name": tenant}).raise_for_status()
            http.post(f"/api/v2/tenants/{tenant}/databases", json={"name": DATABASE}).raise_for_status()
            coll = http.post(f"/api/v2/tenants/{tenant}/databases/{DATABASE}/collections", json={"name": "memories"})
            coll.raise_for_status()
            collections[tenant] = (tenant, DATABASE, coll.json()["id"])
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


async def _run_all(plan: Plan, targets: list[Target], experiments: list[str], embed: Embed, sizes: Sizes,
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


def _targets(plan: Plan, backend: str, backend_url: str, sidecar_url: str, ledger_path: Path, backend_key: str | None,
             concurrency: int, rate_per_s: float) -> list[Target]:
    if backend == "chroma":
        keys, side_colls = _provision_sidecar(plan, sidecar_url, ledger_path)
        direct_colls = _provision_direct(plan, backend_url)
        return [ChromaTarget("direct", backend_url, direct_colls, concurrency=concurrency, rate_per_s=rate_per_s),
                ChromaTarget("sidecar", sidecar_url, side_colls, keys, concurrency=concurrency, rate_per_s=rate_per_s)]
    # Mem0: no collections; each target files the run's memories under its own user_id.
    keys, _ = _provision_keys(plan, ledger_path)
    return [Mem0Target("direct", backend_url, f"probe-{plan.nonce}-direct", backend_key=backend_key,
                       concurrency=concurrency, rate_per_s=rate_per_s),
            Mem0Target("sidecar", sidecar_url, f"probe-{plan.nonce}-sidecar", keys, concurrency=concurrency,
                       rate_per_s=rate_per_s)]


def no_embed(texts: list[str]) -> list[list[float]]:
    """Mem0 embeds server-side: the probe sends text only."""
    return [[] for _ in texts]


def run_probe(plan: Plan, experiments: list[str], backend_url: str, sidecar_url: str, ledger_path: Path, out: Path,
              embed: Embed, sizes: Sizes | None = None, console: Console | None = None, concurrency: int = 8,
              rate_per_s: float = 500.0, backend: str = "chroma", backend_key: str | None = None) -> Path:
    """Run `experiments` against `backend` (``chroma`` or ``mem0``) at `backend_url` directly and through the
    sidecar at `sidecar_url` (whose ledger is `ledger_path`: keys are provisioned there); returns the run
    directory. `backend_key` is Mem0's API key for the direct target."""
    unknown = set(experiments) - set(EXPERIMENTS)
    if unknown:
        raise ValueError(f"unknown experiments: {sorted(unknown)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
    sizes = sizes or Sizes()
    console = console or Console()
    targets = _targets(plan, backend, backend_url, sidecar_url, ledger_path, backend_key, concurrency, rate_per_s)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    label = "all" if set(experiments) == set(EXPERIMENTS) else "+".join(experiments)
    run_dir = out / f"{stamp}-{backend}-{label}-seed{plan.seed}"
    run_dir.mkdir(parents=True, exist_ok=False)
    events_file = open(run_dir / "events.jsonl", "w", encoding="utf-8")
    with Progress(TextColumn("probe {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(label, total=None)

        def on_event(e: dict[str, Any]) -> None:
            events_file.write(json.dumps(e, separators=(",", ":")) + "\n")
            progress.update(task, advance=1, description=f"{e['experiment']} ({e['target']} {backend})")

        try:
            asyncio.run(_run_all(plan, targets, experiments, embed, sizes, on_event))
        finally:
            events_file.close()
    meta = {"run": run_dir.name, "backend": backend, "seed": plan.seed, "nonce": plan.nonce, "experiments": experiments,
            "plan": f"{len(plan.tenants)} tenants x {len(plan.fleets)} fleets x {len(plan.agents) // (len(plan.tenants) * len(plan.fleets))} agents",
            "targets": {"direct": backend_url, "sidecar": sidecar_url}}
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    write_report(run_dir)
    return run_dir


def print_table(run_dir: Path, console: Console) -> None:
    from memwarden_eval.probe.report import read_events, read_meta

    paths, _, _ = summarize(read_events(run_dir))
    backend = BACKEND_LABEL.get(str(read_meta(run_dir).get("backend", "chroma")), "backend")
    table = Table(title=f"memwarden-eval probe: direct {backend} vs through memwarden ({run_dir.name}; 95% Wilson intervals in summary.md)")
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
                 tenants: int = 1, fleets: int = 4, agents: int = 6, backend: str = "chroma") -> Path:
    """Start the backend (`chroma run`, or our Mem0 REST server on the real mem0ai Memory) and the sidecar
    in front of it in a temp dir, run the probe, stop both."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
    console = console or Console()
    plan = Plan.build(seed, tenants, fleets, agents)
    with tempfile.TemporaryDirectory(prefix="memwarden-probe-") as tmp:
        root = Path(tmp)
        server: Server | None = None
        side: Server | None = None
        try:
            SQLiteLedger(root / "ledger.db").close()
            if backend == "chroma":
                from memwarden_eval.embeddings import embed

                server = start_chroma(root / "chroma")
                side = start_sidecar(server.url, root / "ledger.db", POLICIES)
                return run_probe(plan, experiments, server.url, side.url, root / "ledger.db", out, embed, sizes, console)
            key = "mem0-" + secrets.token_hex(16)
            server = start_mem0(root / "mem0", key)
            side = start_sidecar(server.url, root / "ledger.db", POLICIES, extra_env={
                "MEMWARDEN_BACKEND": "mem0", "MEMWARDEN_BACKEND_AUTH_HEADER": "X-API-Key", "MEMWARDEN_BACKEND_TOKEN": key})
            return run_probe(plan, experiments, server.url, side.url, root / "ledger.db", out, no_embed, sizes, console,
                             backend="mem0", backend_key=key)
        finally:
            if side:
                side.stop()
            if server:
                server.stop()
