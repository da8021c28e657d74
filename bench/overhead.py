"""Overhead of the sidecar, in one run (a script that prints figures, not a test).

Side by side on one Chroma server: **direct** Chroma, the thinnest Python **passthrough**
(`bench/passthrough.py`, the floor of one Python hop) and **memwarden** under each query plan
(`MEMWARDEN_QUERY_PLAN`; ``pushdown-where``: the pushdown as Chroma's metadata filter, never the ledger's id list;
on request, ``auto-two-trips``: auto with ``ID_PUSHDOWN_INLINE_MAX=0``, a short id list and its rows read in two
statements instead of one),
for get-by-id (1 id) and query k = 1/10/50, at 1 and 16 clients, over
collections where 100 %, 10 % and 1 % of the rows are readable by the caller; on the SQLite and the
PostgreSQL ledger; then again after a second, larger tenant was written to the same Chroma server
(Chroma's metadata index is shared by all its tenants).

    .venv/bin/python bench/overhead.py [--rows 2000] [--dim 384] [--seconds 3] [--ledgers sqlite,postgres]
        [--big-rows 20000] [--ops get,q1,q10,q50] [--clients 1,16] [--readable 100,10,1]
        [--plans pushdown,...] [--pg postgresql://postgres@127.0.0.1:5432/postgres] [--json out.json] [--core]
    .venv/bin/python bench/overhead.py --report out.json     # the targets of a saved run, nothing run

``--core`` adds ``bench/core_passthrough.py`` to every cell: memwarden's own server stack and forward
stage with no governance (the floor of this code base, between the raw passthrough and memwarden).

The load generator is wrk (`apt-get install wrk`) with `bench/post_bodies.lua` cycling pre-built
bodies: one wrk thread, so it takes little of the machine's cores. Per cell it prints p50/p99 (ms),
throughput (req/s), the CPU time per request of the process answering (``cpu``, ms: Chroma itself for
direct, the passthrough, each sidecar; user + system from ``/proc/PID/stat`` over the wrk run) and, for
memwarden, backend calls per request (from its Prometheus counters);
then the added p50 (memwarden − direct), the throughput ratios memwarden/passthrough and
memwarden/direct, and whether every plan returned the same ids (checked on 20 bodies per cell).

Rows: in every collection the readable rows are tenant-scoped rows written by the caller (agent
``f/a``, trust 1); the others are agent-scoped rows of another agent (``g/b``), which the caller may
not read. Get bodies name readable ids. Each ledger phase gets a fresh Chroma server and ledger.
All processes share the machine's cores: compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from sidecar.config import Settings
from memwarden_eval.harness import Server, _wait, free_port, start_chroma, start_sidecar
from sidecar.ledger import open_ledger

HERE = Path(__file__).resolve().parent
POLICIES = HERE.parent / "policies"
LUA = HERE / "post_bodies.lua"
# Each query plan (`MEMWARDEN_QUERY_PLAN`), plus ``pushdown-where``: the pushdown always sent as Chroma's metadata
# ``where`` (``ID_PUSHDOWN_MAX=0``), where the other plans send the ledger's id list of the admitted rows when short.
PLAN_ENV = {**{p: {"MEMWARDEN_QUERY_PLAN": p} for p in typing.get_args(Settings.model_fields["query_plan"].annotation)},
            "pushdown-where": {"MEMWARDEN_QUERY_PLAN": "pushdown", "MEMWARDEN_ID_PUSHDOWN_MAX": "0"},
            "auto-two-trips": {"MEMWARDEN_QUERY_PLAN": "auto", "MEMWARDEN_ID_PUSHDOWN_INLINE_MAX": "0"}}
PLANS = [p for p in PLAN_ENV if p != "auto-two-trips"]  # the default; ``--plans`` may name auto-two-trips too
OPS = {"get": ("get", None), "q1": ("query", 1), "q10": ("query", 10), "q50": ("query", 50)}


def vec(rnd: random.Random, dim: int) -> list[float]:
    v = [rnd.gauss(0, 1) for _ in range(dim)]
    n = sum(x * x for x in v) ** 0.5
    return [round(x / n, 6) for x in v]


def wrk(url: str, bodies: Path, key: str, clients: int, seconds: float) -> dict[str, float]:
    """One wrk run; returns p50/p99 (ms), req/s, errors."""
    out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "30s",
                          "-s", str(LUA), url, "--", str(bodies), key],
                         capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"^WRK (\{.*\})$", out.stdout, re.M)
    if not m:
        raise RuntimeError(f"wrk failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    r = json.loads(m.group(1))
    return {"p50": r["p50_us"] / 1000, "p99": r["p99_us"] / 1000, "rps": r["requests"] / (r["duration_us"] / 1e6),
            "errors": r["errors"] + r["non2xx"], "requests": r["requests"]}


def cpu_ms(pid: int) -> float:
    """CPU time (user + system, all threads) the process `pid` has used so far, in ms (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def counters(metrics_url: str) -> tuple[float, float]:
    """(backend calls, requests) the sidecar counted so far."""
    text = httpx.get(metrics_url, timeout=10, trust_env=False).text

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))
    return total("memwarden_backend_request_duration_seconds_count"), total("memwarden_requests_total")


def start_core(upstream_port: int, root: Path) -> Server:
    """`bench/core_passthrough.py`: memwarden's server core and forward stage without governance."""
    port = free_port()
    log = root / f"core-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(HERE / "core_passthrough.py"), "--listen", str(port),
                             "--upstream", f"http://127.0.0.1:{upstream_port}"], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return _wait(Server("core", f"http://127.0.0.1:{port}", port, proc, log), "/api/v2/heartbeat", 30)


def start_passthrough(upstream_port: int, root: Path) -> Server:
    port = free_port()
    log = root / f"passthrough-{port}.log"
    proc = subprocess.Popen([sys.executable, str(HERE / "passthrough.py"), "--listen", str(port),
                             "--upstream", f"127.0.0.1:{upstream_port}"], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    return _wait(Server("passthrough", f"http://127.0.0.1:{port}", port, proc, log), "/api/v2/heartbeat", 30)


class Phase:
    """One ledger: a fresh Chroma, the ledger, passthrough and one sidecar per plan, seeded collections."""

    def __init__(self, args: argparse.Namespace, ledger: str, root: Path) -> None:
        self.args, self.ledger_kind, self.root = args, ledger, root
        self.pg_db: str | None = None
        self.servers: list[Server] = []
        try:
            self._start(args, ledger, root)
        except BaseException:  # a failed start-up leaves nothing running
            self.stop()
            raise

    def _start(self, args: argparse.Namespace, ledger: str, root: Path) -> None:
        self.chroma = start_chroma(root / "chroma")
        self.servers.append(self.chroma)
        if ledger == "postgres":
            self.pg_db = f"mw_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.pg_db}"')  # type: ignore[arg-type]
            url = args.pg.rpartition("/")[0] + "/" + self.pg_db
            env = {"MEMWARDEN_LEDGER_URL": url}
            led = open_ledger(url)
        else:
            env = {}
            led = open_ledger(str(root / "ledger.db"))
        self.admin = led.create_key("admin", "bench", None, None, 0)[1]
        self.agent = led.create_key("agent", "bench", "f", "a", 1)[1]
        self.other = led.create_key("agent", "bench", "g", "b", 1)[1]
        led.close()
        self.passthrough = start_passthrough(self.chroma.port, root)
        self.servers.append(self.passthrough)
        self.core = start_core(self.chroma.port, root) if getattr(args, "core", False) else None
        if self.core is not None:
            self.servers.append(self.core)
        self.sidecars: dict[str, Server] = {}
        for plan in args.plans:
            side = start_sidecar(self.chroma.url, root / "ledger.db", POLICIES,
                                 extra_env={**env, **PLAN_ENV[plan], "MEMWARDEN_RECONCILE_INTERVAL_S": "0",
                                            "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
                                            "MEMWARDEN_DECISION_LOG_SINK": "file",
                                            "MEMWARDEN_DECISION_LOG_PATH": str(root / f"decisions-{plan}.jsonl")})
            self.sidecars[plan] = side
            self.servers.append(side)

    def seed(self) -> None:
        args, rnd = self.args, random.Random(1)
        side = next(iter(self.sidecars.values())).url
        self.collections: dict[int, tuple[str, list[str]]] = {}
        with httpx.Client(base_url=side, headers={"X-API-Key": self.admin}, timeout=120, trust_env=False) as http:
            http.post("/api/v2/tenants", json={"name": "bench"}).raise_for_status()
            http.post("/api/v2/tenants/bench/databases", json={"name": "benchdb"}).raise_for_status()
            for pct in args.readable:
                r = http.post("/api/v2/tenants/bench/databases/benchdb/collections", json={"name": f"readable-{pct}"})
                if r.status_code != 200:
                    raise RuntimeError(f"create collection: {r.status_code} {r.text[:300]}")
                cid = r.json()["id"]
                self.collections[pct] = (cid, [])
        for pct, (cid, readable) in self.collections.items():
            base = f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}/add"
            every = max(1, round(100 / pct))
            rows = [(f"r{i}", i % every == 0) for i in range(args.rows)]
            readable.extend(i for i, ok in rows if ok)
            for key, mine, scope in ((self.agent, True, "tenant"), (self.other, False, "agent")):
                ids = [i for i, ok in rows if ok == mine]
                with httpx.Client(base_url=side, headers={"X-API-Key": key}, timeout=300, trust_env=False) as http:
                    for s in range(0, len(ids), 250):
                        chunk = ids[s:s + 250]
                        http.post(base, json={"ids": chunk, "embeddings": [vec(rnd, args.dim) for _ in chunk],
                                              "documents": [f"doc {x}" for x in chunk],
                                              "metadatas": [{"mw_scope": scope} for _ in chunk]}).raise_for_status()

    def analyzed(self) -> None:
        """PostgreSQL: wait until the ledger's rows table has planner statistics, as a running sidecar gives it
        within ``LEDGER_ANALYZE_INTERVAL_S`` of the writes (`PostgresLedger.refresh_statistics`): the benchmark
        measures that steady state, not the first minute after a bulk load."""
        if not self.pg_db:
            return
        led = open_ledger(self.args.pg.rpartition("/")[0] + "/" + self.pg_db)
        try:
            deadline = time.monotonic() + 30
            while "rows" not in getattr(led, "inner", led).refresh_statistics() and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            led.close()

    def add_big_tenant(self) -> None:
        """`--big-rows` rows of tenant ``big`` written straight to Chroma, with the metadata the sidecar stamps."""
        args, rnd = self.args, random.Random(2)
        with httpx.Client(base_url=self.chroma.url, timeout=300, trust_env=False) as http:
            http.post("/api/v2/tenants", json={"name": "big"}).raise_for_status()
            http.post("/api/v2/tenants/big/databases", json={"name": "bigdb"}).raise_for_status()
            cid = http.post("/api/v2/tenants/big/databases/bigdb/collections", json={"name": "big"}).json()["id"]
            for s in range(0, args.big_rows, 500):
                n = min(500, args.big_rows - s)
                metas = [{"mw_tenant": "big", "mw_fleet": f"f{i % 7}", "mw_owner": f"big/f{i % 7}/a{i % 31}",
                          "mw_scope": ("agent", "fleet", "tenant")[i % 3], "mw_writer": f"big/f{i % 7}/a{i % 31}",
                          "mw_created_at": 1_700_000_000_000_000 + i, "mw_source": "chroma:add:bench"}
                         for i in range(s, s + n)]
                http.post(f"/api/v2/tenants/big/databases/bigdb/collections/{cid}/add",
                          json={"ids": [f"b{i}" for i in range(s, s + n)], "embeddings": [vec(rnd, args.dim) for _ in range(n)],
                                "documents": [f"big {i}" for i in range(s, s + n)], "metadatas": metas}).raise_for_status()

    def bodies(self, op: str, pct: int) -> Path:
        path = self.root / f"bodies-{op}-{pct}.txt"
        if not path.exists():
            rnd = random.Random(f"{op}:{pct}")
            kind, k = OPS[op]
            _, readable = self.collections[pct]
            if kind == "get":
                lines = [{"ids": [readable[rnd.randrange(len(readable))]], "include": ["documents", "metadatas"]} for _ in range(500)]
            else:
                lines = [{"query_embeddings": [vec(rnd, self.args.dim)], "n_results": k,
                          "include": ["documents", "metadatas", "distances"]} for _ in range(200)]
            path.write_text("\n".join(json.dumps(b, separators=(",", ":")) for b in lines) + "\n")
        return path

    def same_answers(self, op: str, pct: int) -> bool:
        """Every plan answers the first 20 bodies with the same ids (and, for get, the named id). When they do
        not, prints each body on which they differ: every plan's ids and, for a query, distances (Chroma's HNSW
        index is approximate, so an unfiltered over-fetch and a filtered search may rank differently)."""
        kind, _ = OPS[op]
        cid, _ = self.collections[pct]
        path = f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}/{kind}"
        bodies = [json.loads(x) for x in self.bodies(op, pct).read_text().splitlines()[:20]]
        answers: dict[str, list[dict[str, Any]]] = {}
        for plan, side in self.sidecars.items():
            with httpx.Client(base_url=side.url, headers={"X-API-Key": self.agent}, timeout=60, trust_env=False) as http:
                answers[plan] = [http.post(path, json=b).json() for b in bodies]
        ids = {plan: [a["ids"] for a in got] for plan, got in answers.items()}
        if kind == "get" and any(a != [b["ids"] for b in bodies] for a in ids.values()):
            return False
        first = next(iter(ids.values()))
        if all(a == first for a in ids.values()):
            return True
        for j in range(len(bodies)):
            if len({json.dumps(a[j]) for a in ids.values()}) > 1:
                print(f"  answers differ: {op} {pct}% body {j}: " + "; ".join(
                    f"{plan} {answers[plan][j]['ids']} {answers[plan][j].get('distances')}" for plan in answers), flush=True)
        return False

    def stop(self) -> None:
        for s in reversed(self.servers):
            s.stop()
        if self.pg_db:
            with psycopg.connect(self.args.pg, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_db}" WITH (FORCE)')  # type: ignore[arg-type]


def run_matrix(phase: Phase, label: str, results: list[dict[str, Any]]) -> None:
    args = phase.args
    for op in args.ops:
        kind, _ = OPS[op]
        for pct in args.readable:
            cid, _ = phase.collections[pct]
            path = f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}/{kind}"
            bodies = phase.bodies(op, pct)
            same = phase.same_answers(op, pct)  # also the warm-up of every sidecar
            for clients in args.clients:
                cell: dict[str, Any] = {"ledger": phase.ledger_kind, "tenants": label, "op": op, "readable": pct,
                                        "clients": clients, "same_answers": same}
                targets = [("direct", phase.chroma, ""), ("passthrough", phase.passthrough, "")]
                if phase.core is not None:
                    targets.append(("core", phase.core, ""))
                plans = args.plans if kind == "query" else args.plans[:1]
                targets += [(f"mw:{p}", phase.sidecars[p], phase.agent) for p in plans]
                for name, server, key in targets:
                    before = counters(server.metrics_url) if server.metrics_url else (0.0, 0.0)
                    cpu0 = cpu_ms(server.proc.pid)
                    r = wrk(server.url + path, bodies, key, clients, args.seconds)
                    r["cpu_ms"] = (cpu_ms(server.proc.pid) - cpu0) / max(r["requests"], 1)
                    if server.metrics_url:
                        time.sleep(0.5)  # requests still in flight when wrk stopped finish (and are counted)
                        after = counters(server.metrics_url)
                        r["backend_calls"] = (after[0] - before[0]) / max(after[1] - before[1], 1)
                    cell[name] = r
                results.append(cell)
                print_cell(cell, plans)


def print_cell(cell: dict[str, Any], plans: list[str]) -> None:
    d, pt = cell["direct"], cell["passthrough"]
    head = f"{cell['ledger']:<8} {cell['tenants']:<9} {cell['op']:<4} {cell['readable']:>3}% {cell['clients']:>2}c"
    parts = [f"direct {d['p50']:6.2f}ms {d['rps']:6.0f}/s cpu {d['cpu_ms']:.2f}",
             f"pass +{pt['p50'] - d['p50']:5.2f}ms {pt['rps'] / d['rps']:4.2f}x cpu {pt['cpu_ms']:.2f}"]
    if "core" in cell:
        c = cell["core"]
        parts.append(f"core +{c['p50'] - d['p50']:5.2f}ms {c['rps'] / pt['rps']:4.2f}xP cpu {c['cpu_ms']:.2f}")
    for p in plans:
        m = cell[f"mw:{p}"]
        parts.append(f"{p} +{m['p50'] - d['p50']:6.2f}ms {m['rps'] / pt['rps']:4.2f}xP {m['rps'] / d['rps']:4.2f}xD "
                     f"{m['backend_calls']:.2f}calls cpu {m['cpu_ms']:.2f}" + (f" ERR{m['errors']}" if m["errors"] else ""))
    if not cell["same_answers"]:
        parts.append("ANSWERS DIFFER")
    print(head, " | ".join(parts), flush=True)


TARGET_P50_MS = {"get": 0.5, "q10": 1.5}  # added p50 at 1 client, 100 % readable
TARGET_XP = 0.85  # throughput over the passthrough at 16 clients, 100 % readable
FIXED_PLANS = ("pushdown", "postfilter-first")


def report(results: list[dict[str, Any]]) -> int:
    """Print every cell of the targets of issue #17 with its figure and whether it is met: added p50 of ``auto`` at
    one client and 100 % readable (get ≤ +0.5 ms, query k=10 ≤ +1.5 ms), throughput over the passthrough at 16
    clients and 100 % readable (≥ 0.85), and at 10 % and 1 % readable ``auto`` against the better fixed plan
    (backend calls per request no more; p50 and throughput as ratios, noise included). Returns the cells met."""
    met = total = 0
    print("\ntargets (auto at 100 % readable; auto against the better fixed plan below it):")
    for c in results:
        auto = c.get("mw:auto")
        if auto is None:
            continue
        head = f"{c['ledger']:<8} {c['tenants']:<5} {c['op']:<4} {c['readable']:>3}% {c['clients']:>2}c"
        if c["readable"] == 100:
            if c["clients"] == 1 and c["op"] in TARGET_P50_MS:
                added, goal = auto["p50"] - c["direct"]["p50"], TARGET_P50_MS[c["op"]]
                ok = added <= goal
                line = f"added p50 {added:+.2f} ms (target <= +{goal} ms)"
            elif c["clients"] > 1:
                xp = auto["rps"] / c["passthrough"]["rps"]
                ok = xp >= TARGET_XP
                line = f"{xp:.2f}xP (target >= {TARGET_XP}xP)"
            else:
                continue
        else:
            fixed = [(p, c[f"mw:{p}"]) for p in FIXED_PLANS if f"mw:{p}" in c]
            if not fixed:
                continue
            best_p50 = min(m["p50"] for _, m in fixed)
            best_rps = max(m["rps"] for _, m in fixed)
            best_calls = min(m["backend_calls"] for _, m in fixed)
            ok = auto["backend_calls"] <= best_calls + 0.02
            line = (f"calls {auto['backend_calls']:.2f} vs {best_calls:.2f}, p50 {auto['p50'] / best_p50:.2f}x and "
                    f"throughput {auto['rps'] / best_rps:.2f}x the better fixed plan's")
        met += ok
        total += 1
        print(f"{head}  {line}  {'met' if ok else 'MISSED'}")
    print(f"targets met: {met}/{total}")
    return met


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--ledgers", default="sqlite,postgres")
    ap.add_argument("--big-rows", type=int, default=20000, help="rows of the second tenant (0: no second round)")
    ap.add_argument("--ops", default="get,q1,q10,q50")
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--readable", default="100,10,1")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--pg", default=os.environ.get("MW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--report", type=Path, help="print the targets of a run saved with --json, and run nothing")
    ap.add_argument("--core", action="store_true",
                    help="also measure bench/core_passthrough.py (memwarden's server core without governance)")
    args = ap.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    args.ops = args.ops.split(",")
    args.clients = [int(x) for x in args.clients.split(",")]
    args.readable = [int(x) for x in args.readable.split(",")]
    args.plans = args.plans.split(",")
    if shutil.which("wrk") is None:
        sys.exit("bench/overhead.py needs wrk (apt-get install wrk)")
    print(f"rows={args.rows} dim={args.dim} seconds per cell={args.seconds} big tenant rows={args.big_rows} "
          f"plans={args.plans} cpus={os.cpu_count()}")
    print("+X.XXms: p50 added over direct; xP / xD: throughput over passthrough / direct; calls: backend calls per request; "
          "cpu: ms of CPU per request of the answering process")
    results: list[dict[str, Any]] = []
    for ledger in args.ledgers.split(","):
        with tempfile.TemporaryDirectory(prefix="memwarden-bench-") as tmp:
            phase = Phase(args, ledger, Path(tmp))
            try:
                phase.seed()
                phase.analyzed()
                run_matrix(phase, "one", results)
                if args.big_rows:
                    t0 = time.monotonic()
                    phase.add_big_tenant()
                    print(f"-- second tenant: {args.big_rows} rows written straight to Chroma in {time.monotonic() - t0:.0f} s")
                    run_matrix(phase, "+big", results)
            finally:
                phase.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
