"""Sidecar CPU per request, side by side: one sidecar per source tree on one Chroma and one ledger
(SQLite, or PostgreSQL with ``--ledger postgres``) (a script that prints figures, not a test).

    .venv/bin/python bench/paired.py OLD_TREE NEW_TREE[,MEMWARDEN_X=VALUE,...] [...] [--ops get,q10] [--clients 1,16]
        [--seconds 3] [--rounds 3] [--rows 2000] [--dim 384] [--ledger sqlite|postgres]
        [--pg postgresql://postgres@127.0.0.1:5432/postgres]

Each tree is a checkout of memwarden (e.g. ``git worktree add --detach /tmp/old <commit>``); its
sidecar runs that tree's code (started from the tree, ``PYTHONPATH`` set to it) with the same settings
as `bench/overhead.py` (query plan ``auto``, file decision log), plus the ``MEMWARDEN_*`` settings given after
the tree's path (the same tree may be given twice with different settings). Seeding is `bench/overhead.py`'s, 100 %
readable. Per op and client count, wrk (one thread, `bench/post_bodies.lua`) runs `--seconds` against
direct Chroma, the passthrough and every sidecar in turn, `--rounds` times, so every target sees the same
periods of machine load; per target it prints the medians of p50 (ms), requests/s and — for sidecars —
CPU time per request (user+system from ``/proc/PID/stat``, ms). On a shared machine compare the pairs
of one run, not runs with each other.

With ``--ledger postgres`` the ledger is a fresh database made on the server of `--pg` (dropped at the end),
as `bench/overhead.py` makes it, shared by every sidecar; its planner statistics are refreshed before the
first measurement (`overhead.Phase.analyzed`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402  (bench/overhead.py: Phase, seeding, bodies)

from memwarden_eval.harness import start_sidecar  # noqa: E402


def wrk(url: str, bodies: Path, key: str, clients: int, seconds: int) -> tuple[int, float, float]:
    out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--latency", "--timeout", "30s", "-s",
                          str(overhead.LUA), url, "--", str(bodies), key],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    m = re.search(r"^WRK (\{.*\})$", out, re.M)
    if not m:
        raise RuntimeError(f"wrk failed: {out[-500:]}")
    r = json.loads(m.group(1))
    return r["requests"], r["p50_us"] / 1000, r["requests"] / (r["duration_us"] / 1e6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+", help="TREE or TREE,NAME=VALUE,...: a source tree and settings of its sidecar")
    ap.add_argument("--ops", default="get,q10")
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--ledger", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--pg", default=os.environ.get("MW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = ap.parse_args()
    ns = argparse.Namespace(rows=args.rows, dim=args.dim, seconds=args.seconds, ledgers=args.ledger, big_rows=0,
                            ops=args.ops.split(","), clients=[int(c) for c in args.clients.split(",")],
                            readable=[100], plans=["auto"], pg=args.pg, json=None)
    with tempfile.TemporaryDirectory(prefix="memwarden-paired-") as tmp:
        root = Path(tmp)
        phase = overhead.Phase(ns, args.ledger, root)
        here = os.getcwd()
        try:
            phase.seed()
            phase.analyzed()
            ledger_env = {"MEMWARDEN_LEDGER_URL": args.pg.rpartition("/")[0] + "/" + phase.pg_db} if phase.pg_db else {}
            sides = []
            for i, spec in enumerate(args.trees):
                tree_arg, *settings = spec.split(",")
                tree = Path(tree_arg).resolve()
                side_env = dict(s.split("=", 1) for s in settings)
                os.chdir(tree)  # `python -m sidecar.cli` imports from its working directory first
                side = start_sidecar(phase.chroma.url, root / "ledger.db", tree / "policies", extra_env={
                    **ledger_env, "PYTHONPATH": str(tree), "MEMWARDEN_QUERY_PLAN": "auto", "MEMWARDEN_RECONCILE_INTERVAL_S": "0",
                    "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0", "MEMWARDEN_DECISION_LOG_SINK": "file",
                    "MEMWARDEN_DECISION_LOG_PATH": str(root / f"decisions-{i}.jsonl"), **side_env})
                os.chdir(here)
                phase.servers.append(side)
                rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip() or "?"
                sides.append((f"{tree.name}@{rev}" + "".join(f",{k.removeprefix('MEMWARDEN_').lower()}={v}"
                                                             for k, v in side_env.items()), side))
            width = max(24, *(len(n) for n, _ in sides))
            cid, _ = phase.collections[100]
            print(f"ledger={args.ledger} rows={args.rows} dim={args.dim} seconds={args.seconds} rounds={args.rounds} cpus={os.cpu_count()} "
                  f"load={os.getloadavg()[0]:.1f}")
            for op in ns.ops:
                kind, _ = overhead.OPS[op]
                path = f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}/{kind}"
                bodies = phase.bodies(op, 100)
                phase.same_answers(op, 100)  # warm-up
                for clients in ns.clients:
                    targets = [("direct", phase.chroma, "", None), ("passthrough", phase.passthrough, "", None)]
                    targets += [(name, s, phase.agent, s.proc.pid) for name, s in sides]
                    runs: dict[str, list[tuple[float, float, float]]] = {}
                    for _ in range(args.rounds):
                        for name, server, key, pid in targets:
                            c0 = overhead.cpu_ms(pid) if pid else 0.0
                            n, p50, rps = wrk(server.url + path, bodies, key, clients, args.seconds)
                            cpu = (overhead.cpu_ms(pid) - c0) / max(n, 1) if pid else float("nan")
                            runs.setdefault(name, []).append((p50, rps, cpu))
                    for name, v in runs.items():
                        cpu = statistics.median(x[2] for x in v)
                        print(f"{op:<4} {clients:>2}c {name:<{width}} p50 {statistics.median(x[0] for x in v):7.2f} ms  "
                              f"{statistics.median(x[1] for x in v):6.0f} req/s" + (f"  CPU {cpu:.3f} ms/req" if cpu == cpu else ""),
                              flush=True)
        finally:
            os.chdir(here)
            phase.stop()


if __name__ == "__main__":
    main()
