"""Instructions of one get-by-id inside the sidecar, whole and per function (a script, not a test).

    .venv/bin/python bench/request_profile.py setup DIR [--rows 2000] [--dim 384]
    valgrind --tool=callgrind --callgrind-out-file=DIR/cg.%p .venv/bin/python bench/request_profile.py run DIR --n 600
    valgrind --tool=callgrind --dump-before=getppid --callgrind-out-file=DIR/parts/cg \\
        .venv/bin/python bench/request_profile.py run DIR --n 50 --breakdown DIR/events.json
    .venv/bin/python bench/request_profile.py table DIR

``--pg URL`` (at ``setup``; ``run`` reads it from DIR/state.json): the ledger is a new PostgreSQL database on the
server of URL (e.g. ``postgresql://postgres@127.0.0.1:5432/postgres``) instead of DIR/ledger.db, with its planner
statistics refreshed after seeding; ``run --drop`` drops that database after the run.
``--op q10`` (at ``run``) measures queries k=10 (``include`` documents, metadatas, distances) instead of gets.

``setup`` starts a Chroma server on DIR/chroma and a sidecar (subprocess) on DIR/ledger.db, and seeds one
collection of `--rows` rows (dim `--dim`), every row tenant-scoped and written by the caller (agent
``f/a``, trust 1), as `bench/overhead.py` does at 100 % readable; then stops both. ``run`` starts the same
Chroma again (a subprocess: callgrind does not follow it) and drives the app in this process over ASGI
(`MemwardenApp.__call__`, uvloop, SQLite ledger, the file decision-log sink), `--warm` gets first, then
`--n` gets of one id each (``include`` documents and metadatas, bodies cycling over the readable ids), one
at a time. The whole request is the difference of two runs' totals (e.g. ``--n 100`` and ``--n 600``).

With ``--breakdown EVENTS``, the functions of `WRAPPED` are wrapped so that each entry and exit of one of
them (during the measured gets only) calls ``os.getppid()``; callgrind run with ``--dump-before=getppid``
then writes one profile part per interval between two such calls, and ``table`` adds up the parts between
each function's entry and exit: its inclusive instructions per get (the wrappers' own cost, a few hundred
instructions per wrapped call, lands in the caller's figure). Asynchronous functions count every
instruction run in the process between their entry and exit, the event loop's too (awaiting Chroma's
answer: the loop's poll and the transport's callbacks). In both modes the ledger caches' TTL and the
backend connection's keep-alive expiry are an hour (callgrind's dumps take seconds: with the defaults, 5 s
and 2 s, every breakdown get would miss the caches and open a connection).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POLICIES = HERE.parent / "policies"


def setup(root: Path, rows: int, dim: int, pg: str | None = None) -> None:
    import uuid

    import httpx

    from memwarden_eval.harness import start_chroma, start_sidecar
    from sidecar.ledger import open_ledger

    root.mkdir(parents=True, exist_ok=True)
    url: str | None = None
    if pg:
        import psycopg

        db = f"mw_profile_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db}"')  # type: ignore[arg-type]
        url = pg.rpartition("/")[0] + "/" + db
    chroma = start_chroma(root / "chroma")
    try:
        led = open_ledger(url or str(root / "ledger.db"))
        admin = led.create_key("admin", "bench", None, None, 0)[1]
        agent = led.create_key("agent", "bench", "f", "a", 1)[1]
        led.close()
        side = start_sidecar(chroma.url, root / "ledger.db", POLICIES, extra_env={
            "MEMWARDEN_RECONCILE_INTERVAL_S": "0", "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
            **({"MEMWARDEN_LEDGER_URL": url} if url else {})})
        try:
            with httpx.Client(base_url=side.url, headers={"X-API-Key": admin}, timeout=120, trust_env=False) as http:
                http.post("/api/v2/tenants", json={"name": "bench"}).raise_for_status()
                http.post("/api/v2/tenants/bench/databases", json={"name": "benchdb"}).raise_for_status()
                r = http.post("/api/v2/tenants/bench/databases/benchdb/collections", json={"name": "readable-100"})
                r.raise_for_status()
                cid = r.json()["id"]
            rnd = random.Random(1)
            ids = [f"r{i}" for i in range(rows)]
            with httpx.Client(base_url=side.url, headers={"X-API-Key": agent}, timeout=300, trust_env=False) as http:
                for s in range(0, rows, 250):
                    chunk = ids[s:s + 250]
                    http.post(f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}/add", json={
                        "ids": chunk, "embeddings": [[rnd.uniform(-1, 1) for _ in range(dim)] for _ in chunk],
                        "documents": [f"doc {x}" for x in chunk],
                        "metadatas": [{"mw_scope": "tenant"} for _ in chunk]}).raise_for_status()
        finally:
            side.stop()
    finally:
        chroma.stop()
    if url:
        led = open_ledger(url)
        try:
            import time

            deadline = time.monotonic() + 30  # the statistics of the seeding writes reach pg_stat within a second or so
            while "rows" not in getattr(led, "inner", led).refresh_statistics() and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            led.close()
    (root / "state.json").write_text(json.dumps({"agent": agent, "collection": cid, "ids": ids, "pg": pg,
                                                 "ledger_url": url, "dim": dim}))


# (module path, attribute path) of the functions whose inclusive cost `table` reports, outermost first.
WRAPPED = [
    ("sidecar.app", "MemwardenApp.__call__"),
    ("sidecar.app", "PipelineMiddleware.__call__"),
    ("sidecar.pipeline", "Pipeline.run"),
    ("sidecar.pipeline", "Pipeline._run_stages"),
    ("sidecar.stages.canonicalize", "check_target"),
    ("sidecar.stages.canonicalize", "canonical_path"),
    ("sidecar.stages.canonicalize", "canonical_query"),
    ("sidecar.stages.canonicalize", "canonical_headers"),
    ("sidecar.stages.canonicalize", "check_length"),
    ("sidecar.stages.canonicalize", "credential"),
    ("sidecar.stages.authorize", "Authorizer.authenticate"),
    ("sidecar.pipeline", "Pipeline._read_body"),
    ("sidecar.stages.canonicalize", "parse_json_body"),
    ("sidecar.backends.chroma", "ChromaProfile.match"),
    ("sidecar.backends.chroma", "ChromaProfile.handle"),
    ("sidecar.stages.authorize", "Authorizer.warm_collection"),
    ("sidecar.backends.chroma", "ChromaProfile.op_get"),
    ("sidecar.backends.chroma", "ChromaProfile._require_collection"),
    ("sidecar.backends.chroma", "ChromaProfile._collection"),
    ("sidecar.stages.authorize", "Authorizer.require"),
    ("sidecar.backends.chroma", "ChromaProfile._check_filters"),
    ("sidecar.backends.chroma", "ChromaProfile._scan"),
    ("sidecar.stages.authorize", "Authorizer.start_prefetch"),
    ("sidecar.stages.authorize", "Authorizer.prefetch"),
    ("upstream", "call"),
    ("sidecar.stages.forward", "Upstream.call"),
    ("sidecar.stages.http1", "Http1Transport.send"),
    ("sidecar.backends.chroma", "ChromaProfile._rows"),
    ("sidecar.stages.authorize", "Authorizer.readable_rows"),
    ("sidecar.stages.authorize", "Authorizer.decide_rows"),
    ("sidecar.backends.chroma", "ChromaProfile._decorate"),
    ("sidecar.backends.chroma", "ChromaProfile._rows_to_columns"),
    ("sidecar.stages.authorize", "Authorizer.settle"),
    ("sidecar.app", "json.dumps"),
    ("sidecar.app", "PipelineMiddleware._send"),
    ("sidecar.pipeline", "Pipeline.record"),
    ("sidecar.metrics", "Metrics.observe_exchange"),
    ("ledger", "get_collection"),
    ("ledger", "get_rows"),
    ("ledger", "agent_entities"),
    ("ledger", "authenticate"),
    ("ledger", "read_rows"),
]

EVENTS: list[tuple[str, int]] = []  # (function, +1 entry / -1 exit), one per getppid call
ACTIVE = [False]


def _wrap(name: str, fn: Any) -> Any:
    mark = os.getppid
    if asyncio.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not ACTIVE[0]:
                return await fn(*args, **kwargs)
            EVENTS.append((name, 1))
            mark()
            try:
                return await fn(*args, **kwargs)
            finally:
                EVENTS.append((name, -1))
                mark()
    else:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not ACTIVE[0]:
                return fn(*args, **kwargs)
            EVENTS.append((name, 1))
            mark()
            try:
                return fn(*args, **kwargs)
            finally:
                EVENTS.append((name, -1))
                mark()
    return wrapper


def _install(services: Any) -> None:
    import importlib

    for module, attr in WRAPPED:
        if module in ("upstream", "ledger"):
            continue
        owner: Any = importlib.import_module(module)
        *path, last = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if last == "_send":  # the two ASGI sends: wrapped at the driver's send
            continue
        label = f"{module.rsplit('.', 1)[-1]}.{attr}"
        raw = owner.__dict__[last] if isinstance(owner, type) else getattr(owner, last)
        if isinstance(raw, staticmethod):
            setattr(owner, last, staticmethod(_wrap(label, raw.__func__)))
        else:
            setattr(owner, last, _wrap(label, raw))
    services.upstream.call = _wrap("instrumented upstream.call", services.upstream.call)
    for name in ("get_collection", "get_rows", "agent_entities", "authenticate", "read_rows"):
        fn = getattr(services.ledger, name, None)
        if fn is not None:
            setattr(services.ledger, name, _wrap(f"ledger.{name}", fn))


async def drive(root: Path, n: int, warm: int, breakdown: Path | None, op: str = "get", drop: bool = False) -> None:
    from sidecar.app import create_app
    from sidecar.ledger import offloop
    from sidecar.config import Settings
    from memwarden_eval.harness import start_chroma

    state = json.loads((root / "state.json").read_text())
    chroma = start_chroma(root / "chroma")
    try:
        settings = Settings(backend_url=chroma.url, ledger_path=root / "ledger.db", ledger_url=state.get("ledger_url"),
                            policies_dir=POLICIES,
                            reconcile_interval_s=0, policy_watch_interval_s=0, decision_log_sink="file",
                            decision_log_path=root / "decisions.jsonl", ledger_cache_ttl_s=3600)
        app = create_app(settings)
        services = app.state.services
        # The steady state of a busy sidecar, also when callgrind's dumps make a get take seconds: the ledger's
        # caches (keys, collections, agents) and the pooled backend connection do not expire between gets.
        services.upstream._transport._expiry = 3600.0
        if breakdown is not None:
            _install(services)
        rnd = random.Random(7)
        if op == "get":
            path = f"/api/v2/tenants/bench/databases/benchdb/collections/{state['collection']}/get"
            bodies = [json.dumps({"ids": [state["ids"][rnd.randrange(len(state["ids"]))]],
                                  "include": ["documents", "metadatas"]}, separators=(",", ":")).encode()
                      for _ in range(500)]
        else:
            path = f"/api/v2/tenants/bench/databases/benchdb/collections/{state['collection']}/query"
            bodies = [json.dumps({"query_embeddings": [[round(rnd.uniform(-1, 1), 6) for _ in range(state.get("dim", 384))]],
                                  "n_results": 10, "include": ["documents", "metadatas", "distances"]},
                                 separators=(",", ":")).encode() for _ in range(200)]
        sent: list[Any] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
        if breakdown is not None:
            send = _wrap("app.PipelineMiddleware._send", send)

        async def one(body: bytes) -> None:
            scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                     "server": ("127.0.0.1", 8081), "client": ("127.0.0.1", 50000), "scheme": "http",
                     "method": "POST", "root_path": "", "path": path, "raw_path": path.encode(), "query_string": b"",
                     "headers": [(b"host", b"127.0.0.1:8081"), (b"user-agent", b"wrk"), (b"accept", b"*/*"),
                                 (b"content-type", b"application/json"), (b"x-api-key", state["agent"].encode()),
                                 (b"content-length", str(len(body)).encode())],
                     "state": {}}

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}
            sent.clear()
            await app(scope, receive, send)
            if sent[0]["status"] != 200:
                raise RuntimeError(f"{sent[0]['status']}: {sent[1]['body'][:300]!r}")

        for i in range(warm):
            await one(bodies[i % len(bodies)])
        ACTIVE[0] = breakdown is not None
        for i in range(n):
            await one(bodies[(warm + i) % len(bodies)])
        ACTIVE[0] = False
        if breakdown is not None:
            breakdown.write_text(json.dumps({"n": n, "events": EVENTS}))
        await services.upstream.close()
        await offloop.aclose(services.ledger)
        services.ledger.close()
    finally:
        chroma.stop()
        if drop and state.get("ledger_url"):
            import psycopg

            with psycopg.connect(state["pg"], autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{state["ledger_url"].rpartition("/")[2]}" WITH (FORCE)')  # type: ignore[arg-type]


def part_totals(parts_dir: Path) -> dict[int, int]:
    """Instructions of each profile part callgrind wrote (``cg.<pid>.<part>``: ``summary:`` or ``totals:``)."""
    out: dict[int, int] = {}
    for f in parts_dir.iterdir():
        stem, _, part = f.name.rpartition(".")
        if not part.isdigit() or not stem.startswith("cg"):
            continue
        for line in f.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                out[int(part)] = int(line.split()[1])
                break
    return out


def table(root: Path) -> None:
    """Per wrapped function: calls per get and the median over the measured gets of its inclusive instructions
    in one get (medians: a garbage collection lands in whichever function allocates when it is due)."""
    import statistics

    data = json.loads((root / "events.json").read_text())
    events, n = data["events"], data["n"]
    totals = part_totals(root / "parts")
    # getppid call k (0-based) ends part k+1 (callgrind numbers its parts from 1): the instructions between
    # event k and event k+1 are in part k+2.
    per_get: list[dict[str, int]] = []
    calls: dict[str, int] = {}
    stack: dict[str, list[int]] = {}
    for k, (name, step) in enumerate(events):
        if name == "app.MemwardenApp.__call__" and step == 1:
            per_get.append({})
        if step == 1:
            stack.setdefault(name, []).append(k)
            continue
        start = stack[name].pop()
        if stack[name]:  # a recursive call: counted by the outermost one
            continue
        cost = sum(totals.get(j + 2, 0) for j in range(start, k))
        per_get[-1][name] = per_get[-1].get(name, 0) + cost
        calls[name] = calls.get(name, 0) + 1
    order = {f"{m.rsplit('.', 1)[-1]}.{a}": i for i, (m, a) in enumerate(WRAPPED)}
    order["instrumented upstream.call"] = order["upstream.call"]
    print(f"{'function':55} {'calls/get':>9} {'median instr/get':>17}")
    for name in sorted(calls, key=lambda x: order.get(x, 999)):
        median = statistics.median(g.get(name, 0) for g in per_get)
        print(f"{name:55} {calls[name] / n:9.2f} {median:17.0f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["setup", "run", "table"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--breakdown", type=Path, default=None)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--pg", default=None, help="setup: a PostgreSQL ledger on this server instead of SQLite")
    ap.add_argument("--op", choices=["get", "q10"], default="get")
    ap.add_argument("--drop", action="store_true", help="run: drop the PostgreSQL ledger database afterwards")
    args = ap.parse_args()
    if args.mode == "setup":
        setup(args.dir, args.rows, args.dim, args.pg)
    elif args.mode == "table":
        table(args.dir)
    else:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(drive(args.dir, args.n, args.warm, args.breakdown, args.op, args.drop))
        else:
            asyncio.run(drive(args.dir, args.n, args.warm, args.breakdown, args.op, args.drop))


if __name__ == "__main__":
    sys.exit(main())
