"""Overhead of the sidecar: direct Chroma vs through memwarden, in one run (a script, not a test).

Measures get-by-id (1 id) and query (k=10) at 1 and 16 concurrent clients; prints p50/p99 latency
(ms), throughput (req/s), the added p50 latency and the throughput ratio sidecar/direct.

    .venv/bin/python bench/overhead.py [--rows 2000] [--dim 384] [--seconds 8] [--query-plan pushdown|postfilter-first]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from sidecar.harness import start_chroma, start_sidecar
from sidecar.ledger import SQLiteLedger

POLICIES = Path(__file__).resolve().parent.parent / "policies"


def vec(rnd: random.Random, dim: int) -> list[float]:
    v = [rnd.gauss(0, 1) for _ in range(dim)]
    n = sum(x * x for x in v) ** 0.5
    return [x / n for x in v]


async def drive(base: str, headers: dict[str, str], path: str, bodies: list[dict], clients: int, seconds: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30, trust_env=False,
                                 limits=httpx.Limits(max_connections=clients)) as http:
        async def worker(seed: int) -> None:
            rnd = random.Random(seed)
            while time.perf_counter() < deadline:
                body = bodies[rnd.randrange(len(bodies))]
                t0 = time.perf_counter()
                r = await http.post(path, json=body)
                latencies.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        # warm-up
        for b in bodies[:20]:
            await http.post(path, json=b)
        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    return latencies, int(len(latencies) / elapsed)


def pct(xs: list[float], p: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--query-plan", choices=["pushdown", "postfilter-first"], default="pushdown")
    args = ap.parse_args()
    rnd = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="memwarden-bench-") as tmp:
        root = Path(tmp)
        chroma = start_chroma(root / "chroma")
        ledger = SQLiteLedger(root / "ledger.db")
        admin = ledger.create_key("admin", "bench", None, None, 0)[1]
        agent = ledger.create_key("agent", "bench", "f", "a", 1)[1]
        ledger.close()
        side = start_sidecar(chroma.url, root / "ledger.db", POLICIES, extra_env={"MEMWARDEN_QUERY_PLAN": args.query_plan})
        try:
            h = {"X-API-Key": admin}
            with httpx.Client(base_url=side.url, headers=h, timeout=60, trust_env=False) as http:
                http.post("/api/v2/tenants", json={"name": "bench"}).raise_for_status()
                http.post("/api/v2/tenants/bench/databases", json={"name": "benchdb"}).raise_for_status()
                cid = http.post("/api/v2/tenants/bench/databases/benchdb/collections", json={"name": "benchmark"}).json()["id"]
            base = f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}"
            ids = [f"r{i}" for i in range(args.rows)]
            with httpx.Client(base_url=side.url, headers={"X-API-Key": agent}, timeout=120, trust_env=False) as http:
                for i in range(0, args.rows, 250):
                    chunk = ids[i:i + 250]
                    http.post(f"{base}/add", json={"ids": chunk, "embeddings": [vec(rnd, args.dim) for _ in chunk],
                                                   "documents": [f"doc {x}" for x in chunk],
                                                   "metadatas": [{"mw_scope": "tenant"} for _ in chunk]}).raise_for_status()
            gets = [{"ids": [ids[rnd.randrange(len(ids))]], "include": ["documents", "metadatas"]} for _ in range(500)]
            queries = [{"query_embeddings": [vec(rnd, args.dim)], "n_results": 10, "include": ["documents", "metadatas", "distances"]}
                       for _ in range(200)]
            print(f"rows={args.rows} dim={args.dim} seconds per cell={args.seconds} query plan={args.query_plan}")
            print(f"{'op':<6} {'clients':>7} {'path':<8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7}")
            summary = []
            for name, path, bodies in (("get", f"{base}/get", gets), ("query", f"{base}/query", queries)):
                for clients in (1, 16):
                    res = {}
                    for label, url, hdr in (("direct", chroma.url, {}), ("sidecar", side.url, {"X-API-Key": agent})):
                        lat, rps = asyncio.run(drive(url, hdr, path, bodies, clients, args.seconds))
                        res[label] = (pct(lat, 50), pct(lat, 99), rps)
                        print(f"{name:<6} {clients:>7} {label:<8} {res[label][0]:>8.2f} {res[label][1]:>8.2f} {rps:>7}")
                    summary.append((name, clients, res["sidecar"][0] - res["direct"][0], res["sidecar"][2] / max(res["direct"][2], 1)))
            print()
            print(f"{'op':<6} {'clients':>7} {'added p50 ms':>13} {'throughput ratio':>17}")
            for name, clients, added, ratio in summary:
                print(f"{name:<6} {clients:>7} {added:>13.2f} {ratio:>17.2f}")
        finally:
            side.stop()
            chroma.stop()


if __name__ == "__main__":
    main()
