"""Scale-out benchmark (a script, not a test): 1 vs 2 sidecar replicas sharing one PostgreSQL
ledger, 32 concurrent clients, one Chroma backend. Prints throughput (req/s) and p50/p99 latency (ms)
per configuration, and the ratio 2 replicas / 1 replica.

    .venv/bin/python bench/replicas.py [--clients 32] [--seconds 10] [--rows 2000] [--dim 128]
                                       [--mix 0.7] [--pg postgresql://postgres@127.0.0.1:5432/postgres]
                                       [--sqlite-baseline] [--json out.json]

Workload: each client loops over a random request — a query (k=10) with probability `--mix`, else
a get of one id — as one agent (trust 1) over tenant-scoped rows, so every request authenticates
against the ledger, reads row governance from it and asks Cedar. With 2 replicas, clients alternate
between them (16 + 16). A fresh PostgreSQL database is created for the run and dropped after.
All processes (Chroma, PostgreSQL, the replicas and this load generator) share the machine's cores:
read the ratio with `nproc` in mind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from memwarden_eval.harness import Server, start_chroma, start_sidecar
from sidecar.ledger import SQLiteLedger
from sidecar.ledger.postgres import PostgresLedger

POLICIES = Path(__file__).resolve().parent.parent / "policies"


def vec(rnd: random.Random, dim: int) -> list[float]:
    v = [rnd.gauss(0, 1) for _ in range(dim)]
    n = sum(x * x for x in v) ** 0.5
    return [x / n for x in v]


def pct(xs: list[float], p: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1] if len(xs) > 1 else xs[0]


async def drive(urls: list[str], key: str, base: str, gets: list[dict[str, Any]], queries: list[dict[str, Any]],
                clients: int, seconds: float, mix: float) -> dict[str, Any]:
    """`clients` workers, worker i on urls[i % len(urls)], each with its own connection."""
    latencies: list[float] = []
    errors = 0
    https = [httpx.AsyncClient(base_url=u, headers={"X-API-Key": key}, timeout=60, trust_env=False,
                               limits=httpx.Limits(max_connections=clients)) for u in urls]
    try:
        for http in https:  # warm-up
            for b in queries[:10]:
                (await http.post(f"{base}/query", json=b)).raise_for_status()
        deadline = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            nonlocal errors
            rnd, http = random.Random(i), https[i % len(https)]
            while time.perf_counter() < deadline:
                is_query = rnd.random() < mix
                body = queries[rnd.randrange(len(queries))] if is_query else gets[rnd.randrange(len(gets))]
                t0 = time.perf_counter()
                r = await http.post(f"{base}/{'query' if is_query else 'get'}", json=body)
                latencies.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    finally:
        for http in https:
            await http.aclose()
    return {"requests": len(latencies), "errors": errors, "rps": len(latencies) / elapsed,
            "p50_ms": pct(latencies, 50), "p99_ms": pct(latencies, 99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--mix", type=float, default=0.7, help="share of queries (the rest are get-by-id)")
    ap.add_argument("--pg", default=os.environ.get("MW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                    help="URL of a database from which a fresh benchmark database is created")
    ap.add_argument("--sqlite-baseline", action="store_true", help="also run 1 replica on an SQLite ledger")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    rnd = random.Random(1)
    dbname = f"mw_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = f"{args.pg.rpartition('/')[0]}/{dbname}"
    servers: list[Server] = []
    results: dict[str, Any] = {"clients": args.clients, "seconds": args.seconds, "rows": args.rows, "dim": args.dim,
                               "mix": args.mix, "cpus": os.cpu_count()}
    try:
        with tempfile.TemporaryDirectory(prefix="memwarden-bench-") as tmp:
            root = Path(tmp)
            chroma = start_chroma(root / "chroma")
            servers.append(chroma)
            ledger = PostgresLedger(url, max_size=2)
            admin = ledger.create_key("admin", "bench", None, None, 0)[1]
            agent = ledger.create_key("agent", "bench", "f", "a", 1)[1]
            env = {"MEMWARDEN_LEDGER_URL": url, "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
                   "MEMWARDEN_LEDGER_POOL_MAX": "16", "MEMWARDEN_LOG_LEVEL": "WARNING"}
            a = start_sidecar(chroma.url, root / "a" / "unused.db", POLICIES, extra_env=env)
            servers.append(a)
            b = start_sidecar(chroma.url, root / "b" / "unused.db", POLICIES, extra_env=env)
            servers.append(b)
            with httpx.Client(base_url=a.url, headers={"X-API-Key": admin}, timeout=60, trust_env=False) as http:
                http.post("/api/v2/tenants", json={"name": "bench"}).raise_for_status()
                http.post("/api/v2/tenants/bench/databases", json={"name": "benchdb"}).raise_for_status()
                cid = http.post("/api/v2/tenants/bench/databases/benchdb/collections", json={"name": "benchmark"}).json()["id"]
            base = f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}"
            ids = [f"r{i}" for i in range(args.rows)]
            with httpx.Client(base_url=a.url, headers={"X-API-Key": agent}, timeout=120, trust_env=False) as http:
                for i in range(0, args.rows, 250):
                    chunk = ids[i:i + 250]
                    http.post(f"{base}/add", json={"ids": chunk, "embeddings": [vec(rnd, args.dim) for _ in chunk],
                                                   "documents": [f"doc {x}" for x in chunk],
                                                   "metadatas": [{"mw_scope": "tenant"} for _ in chunk]}).raise_for_status()
            gets = [{"ids": [ids[rnd.randrange(len(ids))]], "include": ["documents", "metadatas"]} for _ in range(500)]
            queries = [{"query_embeddings": [vec(rnd, args.dim)], "n_results": 10,
                        "include": ["documents", "metadatas", "distances"]} for _ in range(200)]
            configs: list[tuple[str, list[str]]] = [("1 replica (PostgreSQL)", [a.url]), ("2 replicas (PostgreSQL)", [a.url, b.url])]
            if args.sqlite_baseline:
                lite = SQLiteLedger(root / "lite.db")
                lite_agent = lite.create_key("agent", "bench", "f", "a", 1)[1]
                lite.register_collection(ledger.get_collection("chroma", cid))  # type: ignore[arg-type]
                rows = ledger.get_rows("chroma", cid, ids)
                lite.reserve_rows(list(rows.values()))
                lite.activate_rows("chroma", cid, ids)
                lite.close()
                s = start_sidecar(chroma.url, root / "lite.db", POLICIES, extra_env={"MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
                                                                                     "MEMWARDEN_LOG_LEVEL": "WARNING"})
                servers.append(s)
                configs.insert(0, ("1 replica (SQLite)", [s.url]))
            ledger.close()
            print(f"{args.clients} clients, {args.seconds}s per configuration, {args.rows} rows × dim {args.dim}, "
                  f"{args.mix:.0%} queries (k=10), {os.cpu_count()} CPUs")
            print(f"{'configuration':<26} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
            for label, urls in configs:
                key = lite_agent if "SQLite" in label else agent
                res = asyncio.run(drive(urls, key, base, gets, queries, args.clients, args.seconds, args.mix))
                results[label] = res
                print(f"{label:<26} {res['rps']:>8.0f} {res['p50_ms']:>8.2f} {res['p99_ms']:>8.2f} {res['errors']:>7}")
            one, two = results["1 replica (PostgreSQL)"], results["2 replicas (PostgreSQL)"]
            results["throughput_ratio_2_over_1"] = two["rps"] / one["rps"]
            results["p99_ratio_2_over_1"] = two["p99_ms"] / one["p99_ms"]
            print(f"2 replicas / 1 replica: throughput ×{results['throughput_ratio_2_over_1']:.2f}, "
                  f"p99 ×{results['p99_ratio_2_over_1']:.2f}")
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
    finally:
        for s in reversed(servers):
            s.stop()
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    main()
