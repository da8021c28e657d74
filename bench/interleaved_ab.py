"""Interleaved A/B of two source trees on the PostgreSQL ledger (a script that prints figures, not a test).

    PYTHONPATH=. .venv/bin/python bench/interleaved_ab.py --a <tree A> --b <tree B> [--n 500] [--pg URL]

Two sidecars — one running tree A's code, one tree B's (each spawned with PYTHONPATH=<tree>) — in front of
one Chroma, each on its own fresh schema of one PostgreSQL, 300 rows × dim 64 written by one agent. The same
get-by-id and query k=10 bodies go to both, one sequential client, in a random order per round, so both see
the same machine load (on a shared, loaded machine two runs minutes apart are not comparable; interleaved
requests are). Prints, per tree, the ledger calls and ledger time per request (from the sidecar's
Prometheus histograms; setup requests included) and the client-side p50/p90/mean per operation.
"""
import argparse
import os
import random
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))  # this checkout's memwarden_eval
from memwarden_eval.harness import start_chroma, start_sidecar  # noqa: E402
from sidecar.ledger.postgres import PostgresLedger  # noqa: E402
from tests.integration.conftest import admin_client, chroma_client, unit_vectors  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--a", required=True, help="source tree A (a checkout or worktree)")
ap.add_argument("--b", required=True, help="source tree B")
ap.add_argument("--n", type=int, default=500, help="rounds (each: one get and one query per tree)")
ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
args = ap.parse_args()
URL = args.pg
TREES = {"A": args.a, "B": args.b}
POL = Path(__file__).resolve().parents[1] / "policies"
N = args.n
tmp = Path(tempfile.mkdtemp(prefix="interleaved-ab-"))
os.chdir(tmp)  # `python -m sidecar.cli` puts the working directory before PYTHONPATH: not a source tree
servers, schemas = [], []
try:
    chroma = start_chroma(tmp / "chroma"); servers.append(chroma)
    sides = {}
    vecs = unit_vectors(300, dim=64, seed=1)
    for name, tree in TREES.items():
        schema = f"s_ab_{uuid.uuid4().hex[:8]}"; schemas.append(schema)
        led = PostgresLedger(URL, schema=schema, min_size=0, max_size=1)
        tenant = f"ab{name.lower()}"
        _, admin = led.create_key("admin", tenant, None, None, 0)
        _, agent = led.create_key("agent", tenant, "f", "a", 1)
        led.close()
        s = start_sidecar(chroma.url, tmp / f"{name}.db", POL, extra_env={
            "PYTHONPATH": tree, "MEMWARDEN_LEDGER_URL": URL, "MEMWARDEN_LEDGER_SCHEMA": schema,
            "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0", "MEMWARDEN_RECONCILE_INTERVAL_S": "0"})
        servers.append(s)
        admin_client(s.port, {"X-API-Key": admin}).create_tenant(tenant)
        admin_client(s.port, {"X-API-Key": admin}).create_database("default_database", tenant=tenant)
        cid = str(chroma_client(s.port, tenant, {"X-API-Key": admin}).create_collection("mem").id)
        coll = chroma_client(s.port, tenant, {"X-API-Key": agent}).get_collection("mem")
        coll.add(ids=[f"r{i}" for i in range(300)], embeddings=vecs, documents=[f"d{i}" for i in range(300)],
                 metadatas=[{"mw_scope": "tenant"}] * 300)
        base = f"{s.url}/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}"
        sides[name] = (httpx.Client(headers={"X-API-Key": agent}, timeout=30, trust_env=False), base)
    rnd = random.Random(0)
    times = {(n, op): [] for n in sides for op in ("get", "q10")}
    for i in range(N):
        for op in ("get", "q10"):
            order = list(sides); rnd.shuffle(order)
            body = {"ids": [f"r{rnd.randrange(300)}"]} if op == "get" else {"query_embeddings": [vecs[rnd.randrange(300)]], "n_results": 10}
            for n in order:
                client, base = sides[n]
                t = time.perf_counter()
                r = client.post(f"{base}/{'get' if op == 'get' else 'query'}", json=body)
                dt = time.perf_counter() - t
                assert r.status_code == 200, r.text
                if i >= 20:
                    times[(n, op)].append(dt * 1000)
    for n, s in zip(sides, servers[1:]):
        text = httpx.get(s.metrics_url, timeout=10, trust_env=False).text
        sums = {m: float(v) for m, v in re.findall(r'^memwarden_ledger_call_duration_seconds_sum\{method="([^"]+)"\} (\S+)$', text, re.M)}
        counts = {m: float(v) for m, v in re.findall(r'^memwarden_ledger_call_duration_seconds_count\{method="([^"]+)"\} (\S+)$', text, re.M)}
        reqs = 2 * N  # the setup's few requests are counted too
        print(f"{n:6} ledger calls/request {sum(counts.values())/reqs:.2f} ({ {m: round(c/reqs, 2) for m, c in counts.items() if c/reqs >= 0.01} }), "
              f"ledger time/request {sum(sums.values())/reqs*1000:.3f} ms", flush=True)
    for op in ("get", "q10"):
        for n in sides:
            xs = sorted(times[(n, op)])
            print(f"{op:4} {n:6} n={len(xs)} p50 {statistics.median(xs):.2f} ms  p90 {xs[int(len(xs)*0.9)]:.2f} ms  mean {statistics.mean(xs):.2f} ms", flush=True)
finally:
    for s in servers:
        s.stop()
    with psycopg.connect(URL, autocommit=True) as c:
        for sc in schemas:
            c.execute(f'DROP SCHEMA IF EXISTS "{sc}" CASCADE')
