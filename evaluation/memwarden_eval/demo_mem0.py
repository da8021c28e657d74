"""``memwarden-eval demo --backend mem0``: the demo scenario of `memwarden_eval.demo` through the Mem0 profile.

Starts our Mem0-REST-compatible server (memwarden_eval.mem0_server: the real `mem0ai` `Memory`, infer=False,
Qdrant local mode, offline all-MiniLM-L6-v2) and the sidecar with ``MEMWARDEN_BACKEND=mem0``; every
writer adds its memories over Mem0's REST API, the red writer deletes its private scratchpad, and
every principal lists (``GET /memories``), searches (``POST /search`` with each memory's text) and
probes the other tenant's memory ids (``GET /memories/{id}``). Exit 0 only if what each principal saw
equals what cedarpy allows, and every cross-tenant probe is 404.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from memwarden_eval.demo import AGENTS, MEMORIES, POLICIES, TENANTS, Outcome, _expected, _principal, _print, _scenario_rows
from memwarden_eval.harness import Server, start_mem0, start_sidecar
from sidecar.ledger import SQLiteLedger
from sidecar.policy import PolicyEngine


def run_mem0_demo(workdir: Path | None = None, console: Console | None = None) -> int:
    console = console or Console(width=None if Console().is_terminal else 150)
    tmp = tempfile.TemporaryDirectory(prefix="memwarden-demo-mem0-") if workdir is None else None
    root = Path(tmp.name) if tmp else Path(workdir)  # type: ignore[arg-type]
    mem0: Server | None = None
    sidecar: Server | None = None
    backend_key = "mem0-" + secrets.token_hex(16)
    try:
        console.print("[bold]memwarden-eval demo[/bold] (Mem0) — starting the Mem0 REST server on the real mem0ai Memory ...")
        mem0 = start_mem0(root / "mem0", backend_key)
        console.print(f"Mem0 REST server on {mem0.url}")
        ledger = SQLiteLedger(root / "ledger.db")
        keys: dict[tuple[str, str], str] = {}
        for tenant in TENANTS:
            keys[(tenant, "admin")] = ledger.create_key("admin", tenant, None, None, 0)[1]
            for fleet, agent, trust in AGENTS:
                keys[(tenant, f"{fleet}/{agent}")] = ledger.create_key("agent", tenant, fleet, agent, trust)[1]
        ledger.close()
        sidecar = start_sidecar(mem0.url, root / "ledger.db", POLICIES, extra_env={
            "MEMWARDEN_BACKEND": "mem0", "MEMWARDEN_BACKEND_AUTH_HEADER": "X-API-Key", "MEMWARDEN_BACKEND_TOKEN": backend_key})
        console.print(f"memwarden sidecar on {sidecar.url} (backend mem0), policies from {POLICIES}")

        def http(key: str) -> httpx.Client:
            return httpx.Client(base_url=sidecar.url, headers={"X-API-Key": key}, timeout=60, trust_env=False)

        ids: dict[str, str] = {}  # scenario row name -> Mem0 id
        written: dict[str, list[tuple[str, str, dict[str, Any], str]]] = {}
        for tenant in TENANTS:
            written[tenant] = []
            for i, (writer, scope, extra, text) in enumerate(MEMORIES):
                with http(keys[(tenant, writer)]) as h:
                    r = h.post("/memories", json={"messages": [{"role": "user", "content": text}], "infer": False,
                                                  "user_id": "customer-1", "metadata": {"mw_scope": scope, **extra}})
                r.raise_for_status()
                ids[f"{tenant}-m{i}"] = r.json()["results"][0]["id"]
                written[tenant].append((f"{tenant}-m{i}", writer, extra, scope))
            with http(keys[(tenant, "red/writer")]) as h:
                h.delete(f"/memories/{ids[f'{tenant}-m0']}").raise_for_status()
        back = {v: k for k, v in ids.items()}

        engine = PolicyEngine.load(POLICIES)
        outcomes: list[Outcome] = []
        for tenant in TENANTS:
            other = TENANTS[1 - TENANTS.index(tenant)]
            rows = _scenario_rows(tenant, written[tenant], deleted={f"{tenant}-m0"})
            for name in ["admin"] + [f"{f}/{a}" for f, a, _ in AGENTS]:
                principal = _principal(tenant, name)
                expected = _expected(engine, principal, rows)
                with http(keys[(tenant, name)]) as h:
                    listed = h.get("/memories").json()["results"]
                    seen_get = {back.get(r["id"], r["id"]) for r in listed}
                    seen_query: set[str] = set()
                    for _, _, _, text in MEMORIES:
                        hits = h.post("/search", json={"query": text, "top_k": len(MEMORIES), "threshold": 0.0}).json()["results"]
                        seen_query |= {back.get(r["id"], r["id"]) for r in hits}
                    probes = {h.get(f"/memories/{ids[f'{other}-m{i}']}").status_code for i in range(len(MEMORIES))}
                label = "admin" if name == "admin" else str(principal.trust)
                outcomes.append(Outcome(f"{tenant}/{name}", label, expected, seen_get, seen_query, len(listed),
                                        404 if probes == {404} else max(probes)))
        _print(console, outcomes)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            console.print(f"[red]FAIL[/red]: {len(failed)} principals saw something the policies do not allow or missed something they do")
            return 1
        total = sum(len(o.expected) for o in outcomes)
        console.print(f"[green]OK[/green] (Mem0): {len(outcomes)} principals, {total} authorised row views, 0 leaks, 0 misses; "
                      "other tenants' memory ids all 404; the deleted memory is gone on list, search and get.")
        return 0
    finally:
        if sidecar:
            sidecar.stop()
        if mem0:
            mem0.stop()
        if tmp:
            tmp.cleanup()
