"""Load and faults (a script, not a test): concurrent clients × seconds of mixed reads, writes and deletes
across tenants through a real sidecar in front of a real backend, with faults injected during the soak.

    .venv/bin/python bench/soak.py [--profile chroma|mem0|both] [--clients 64] [--seconds 60]
                                   [--runs pg,disk,attacks] [--json out.json]

Up to three runs per profile, each `--seconds` long:

- ``pg``: the ledger on a PRIVATE PostgreSQL cluster this script starts (initdb + pg_ctl, its own port, a
  temp dir; the machine's shared cluster is never touched). Faults: the backend is killed (SIGKILL) and
  restarted on the same data and port; PostgreSQL is restarted (``pg_ctl restart -m fast``).
- ``disk``: the SQLite ledger on a small tmpfs mounted for the run. Fault: the file system is filled
  (a filler file) for a while, then freed.
- ``attacks``: the SQLite ledger on disk; one after another, each for 15 % of the run (hardening round 3):
  the keyless slow-read attack (45 connections each sending 12,000 pipelined ``GET /api/v2/heartbeat`` in
  one send and never reading), a large-row writer (a trust-1 agent adding agent-scoped rows of 900 KiB that
  only it may read, while the others list and search), and a loop of ``memwarden keys create`` / ``keys
  revoke`` processes against the same SQLite ledger (each new key must answer 200, then 401 once revoked).
  Printed per fault: the legitimate clients' requests, 5xx and p99 latency against the quiet part of the
  same run, the sidecar's peak memory (VmRSS, sampled every 0.2 s), and for the key loop the revocations
  that did not take effect.

Workload per client (a random principal of 3 tenants × {red: trust 1, trust 2; blue: trust 1, trust 0}
and each tenant's admin, per request): adds with a random scope, deletes of its own rows, gets by ids
(its own, others', deleted ones), queries/searches, filtered gets/lists, and requests into another
tenant. Every answer is recorded. Afterwards, with the ledger as the oracle and cedarpy (the sidecar's
PolicyEngine) deciding ``read``:

- rows served to a principal that may not read them (must be 0);
- deleted rows served by a request that started after their tombstone committed (must be 0);
- 5xx outside fault windows (+ a grace period) — sidecar-caused (must be 0); 5xx bodies with rows (must be 0);
- partial answers: a 200 get of the caller's own acknowledged, undeleted rows missing one (must be 0);
- acknowledged writes lost (not active in the ledger, or not served to their owner at the end) and
  acknowledged deletes served again (must be 0);
- per fault: when it started and ended, requests and 5xx during it, and seconds until the next success.

The sidecar process is never restarted: it must recover by itself. Root is needed (tmpfs mount,
``runuser -u postgres`` for the private cluster). Traffic goes to 127.0.0.1 only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "evaluation"))  # memwarden_eval of this checkout (the harness)

from sidecar.governance import Principal, row_entities  # noqa: E402
from memwarden_eval.harness import Server, free_port, start_chroma, start_mem0, start_sidecar  # noqa: E402
from sidecar.ledger import SQLiteLedger, open_ledger  # noqa: E402
from sidecar.policy import CedarRequest, PolicyEngine  # noqa: E402

POLICIES = ROOT / "policies"
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), Path("/usr/bin"))
MEM0_KEY = "soak-" + uuid.uuid4().hex[:8]
GRACE_S = 5.0
CAST = (("red", "r1", 1), ("red", "r2", 2), ("blue", "b1", 1), ("blue", "b0", 0))
SCOPES = ("agent", "fleet", "tenant", "restricted")


# -- infrastructure ---------------------------------------------------------------------------------

class PrivatePostgres:
    """A PostgreSQL cluster of our own: initdb in `root`, started on a free port by the postgres user."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        shutil.chown(root, "postgres", "postgres")
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def _pg(self, tool: str, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / tool), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(self.root))

    def _ctl(self, action: str, *extra: str) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w", "-t", "60",
                 "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200",
                 action, *extra)

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        try:
            self._ctl("stop", "-m", "fast")
        except subprocess.CalledProcessError:
            pass

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


class Tmpfs:
    """A size-limited tmpfs for the SQLite ledger; `fill` takes every free byte, `free` gives them back."""

    def __init__(self, path: Path, size_mb: int = 24) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], check=True)
        self.filler = path / "filler"

    def fill(self) -> None:
        with open(self.filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * (1 << 20))
                    fh.flush()
            except OSError:
                pass
        try:  # the last partial blocks too
            with open(self.path / "filler2", "wb") as fh:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError:
            pass

    def free(self) -> None:
        for p in (self.filler, self.path / "filler2"):
            p.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@dataclass
class Backend:
    profile: str
    server: Server
    data: Path
    port: int

    def kill(self) -> None:
        os.killpg(self.server.proc.pid, signal.SIGKILL)
        self.server.proc.wait(timeout=30)

    def restart(self) -> None:
        if self.profile == "chroma":
            self.server = start_chroma(self.data, port=self.port, timeout_s=120)
        else:
            self.server = start_mem0(self.data, MEM0_KEY, port=self.port, timeout_s=240)


def start_backend(profile: str, root: Path) -> Backend:
    data = root / f"{profile}-data"
    server = start_chroma(data) if profile == "chroma" else start_mem0(data, MEM0_KEY, timeout_s=240)
    return Backend(profile, server, data, server.port)


# -- the world --------------------------------------------------------------------------------------

@dataclass
class Who:
    name: str
    tenant: str
    key: str
    principal: Principal


@dataclass
class World:
    profile: str
    sidecar: Server
    ledger_args: dict[str, Any]
    who: list[Who] = field(default_factory=list)
    collections: dict[str, str] = field(default_factory=dict)  # tenant -> collection uuid (Chroma)
    written: dict[str, dict[str, Any]] = field(default_factory=dict)  # acknowledged writes by row id
    deleted: dict[str, float] = field(default_factory=dict)  # acknowledged deletes: row id -> ack time
    # every delete sent, whatever the answer: the tombstone commits before the backend is called, so a
    # delete answered 502 (backend down) may have taken effect; such rows are neither lost nor expected
    attempted: set[str] = field(default_factory=set)
    by_tenant: dict[str, list[str]] = field(default_factory=dict)  # every id written (acked or not)

    def ledger(self) -> Any:
        return SQLiteLedger(self.ledger_args["path"]) if "path" in self.ledger_args else \
            open_ledger(self.ledger_args["url"], max_size=2)


def provision(profile: str, sidecar: Server, ledger_args: dict[str, Any], tenants: int = 3) -> World:
    world = World(profile, sidecar, ledger_args)
    led = world.ledger()
    try:
        for n in range(tenants):
            t = f"soak{n}{uuid.uuid4().hex[:4]}"
            admin = led.create_key("admin", t, None, None, 0)[1]
            world.who.append(Who(f"{t}/admin", t, admin, led.authenticate(admin)))
            for fleet, agent, trust in CAST:
                key = led.create_key("agent", t, fleet, agent, trust)[1]
                world.who.append(Who(f"{t}/{fleet}/{agent}", t, key, led.authenticate(key)))
            world.by_tenant[t] = []
            if profile == "chroma":
                with httpx.Client(base_url=sidecar.url, headers={"X-API-Key": admin}, timeout=30, trust_env=False) as h:
                    h.post("/api/v2/tenants", json={"name": t}).raise_for_status()
                    h.post(f"/api/v2/tenants/{t}/databases", json={"name": "soakdb"}).raise_for_status()
                    r = h.post(f"/api/v2/tenants/{t}/databases/soakdb/collections", json={"name": "soak"})
                    r.raise_for_status()
                    world.collections[t] = r.json()["id"]
    finally:
        led.close()
    return world


# -- the workload -----------------------------------------------------------------------------------

@dataclass
class Event:
    t0: float
    t1: float
    who: str
    op: str
    status: int
    served: list[str]
    texts: dict[str, Any]
    rows_in_error: bool = False
    message: str = ""
    own_expected: list[str] = field(default_factory=list)  # for get-by-own-ids: acked live rows asked for


def vec(rnd: random.Random) -> list[float]:
    v = [rnd.gauss(0, 1) for _ in range(8)]
    n = sum(x * x for x in v) ** 0.5
    return [x / n for x in v]


class Workload:
    def __init__(self, world: World, seed: int) -> None:
        self.w = world
        self.rnd = random.Random(seed)
        self.events: list[Event] = []
        self.n = 0

    def _path(self, tenant: str, op: str) -> str:
        return f"/api/v2/tenants/{tenant}/databases/soakdb/collections/{self.w.collections[tenant]}/{op}"

    def _own_live(self, who: Who) -> list[str]:
        return [i for i, m in self.w.written.items() if m["owner"] == who.name and i not in self.w.attempted]

    async def one(self, client: httpx.AsyncClient) -> None:
        who = self.rnd.choice(self.w.who)
        agent = who.principal.kind == "agent"
        writer = agent and who.principal.trust >= 1
        r = self.rnd.random()
        if writer and r < 0.30:
            await self._write(client, who)
        elif writer and r < 0.40 and self._own_live(who):
            await self._delete(client, who)
        elif r < 0.65:
            await self._get_ids(client, who)
        elif r < 0.85:
            await self._search(client, who)
        elif r < 0.95:
            await self._list(client, who)
        else:
            await self._foreign(client, who)

    async def _call(self, client: httpx.AsyncClient, who: Who, op: str, method: str, path: str, body: Any = None,
                    params: dict[str, str] | None = None) -> tuple[Event, Any]:
        t0 = time.time()
        try:
            resp = await client.request(method, path, json=body, params=params, headers={"X-API-Key": who.key})
            status = resp.status_code
            try:
                payload = resp.json()
            except ValueError:
                payload = None
        except httpx.TimeoutException:
            status, payload = -1, None
        except httpx.HTTPError:
            status, payload = -2, None
        ev = Event(t0, time.time(), who.name, op, status, [], {})
        if status >= 500 or status < 0:
            ev.rows_in_error = isinstance(payload, (dict, list)) and not (
                isinstance(payload, dict) and set(payload) <= {"error", "message"})
            ev.message = str(payload.get("message"))[:80] if isinstance(payload, dict) else ""
        self.events.append(ev)
        return ev, payload

    def _record_rows(self, ev: Event, rows: list[tuple[str, Any]]) -> None:
        for rid, text in rows:
            ev.served.append(rid)
            ev.texts[rid] = text

    async def _write(self, client: httpx.AsyncClient, who: Who) -> None:
        self.n += 1
        scope = self.rnd.choice(SCOPES)
        meta: dict[str, Any] = {"mw_scope": scope}
        if scope == "restricted":
            other = self.rnd.choice([x for x in self.w.who if x.tenant == who.tenant and x.principal.kind == "agent"])
            meta["mw_readers"] = f"{other.principal.fleet}/{other.principal.agent}"
        text = f"soak memory {uuid.uuid4().hex} by {who.name}"
        if self.w.profile == "chroma":
            rid = f"s{self.n}-{uuid.uuid4().hex[:8]}"
            self.w.by_tenant[who.tenant].append(rid)
            ev, payload = await self._call(client, who, "write", "POST", self._path(who.tenant, "add"),
                                           {"ids": [rid], "embeddings": [vec(self.rnd)], "documents": [text], "metadatas": [meta]})
        else:
            ev, payload = await self._call(client, who, "write", "POST", "/memories",
                                           {"messages": [{"role": "user", "content": text}], "infer": False,
                                            "user_id": "soak", "metadata": meta})
            rid = payload["results"][0]["id"] if ev.status == 200 and payload and payload.get("results") else None
            if rid:
                self.w.by_tenant[who.tenant].append(rid)
        if ev.status == 200 and rid:
            self.w.written[rid] = {"owner": who.name, "tenant": who.tenant, "text": text, "acked": ev.t1}

    async def _delete(self, client: httpx.AsyncClient, who: Who) -> None:
        rid = self.rnd.choice(self._own_live(who))
        self.w.attempted.add(rid)
        if self.w.profile == "chroma":
            ev, payload = await self._call(client, who, "delete", "POST", self._path(who.tenant, "delete"), {"ids": [rid]})
            ok = ev.status == 200 and isinstance(payload, dict) and payload.get("deleted") == 1
        else:
            ev, payload = await self._call(client, who, "delete", "DELETE", f"/memories/{rid}")
            ok = ev.status == 200
        if ok:
            self.w.deleted[rid] = ev.t1

    async def _get_ids(self, client: httpx.AsyncClient, who: Who) -> None:
        pool = self.w.by_tenant.get(who.tenant) or []
        ids = self.rnd.sample(pool, min(len(pool), 5)) if pool else [f"never-{uuid.uuid4().hex[:6]}"]
        own = [i for i in self._own_live(who) if self.w.written[i]["acked"] < time.time()]
        if own and self.rnd.random() < 0.5:
            ids = list(dict.fromkeys(ids + self.rnd.sample(own, min(len(own), 3))))
        if self.w.profile == "chroma":
            ev, payload = await self._call(client, who, "get", "POST", self._path(who.tenant, "get"), {"ids": ids})
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, list(zip(payload.get("ids") or [], payload.get("documents") or [])))
        else:
            rid = ids[0]
            ev, payload = await self._call(client, who, "get", "GET", f"/memories/{rid}")
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, [(payload.get("id"), payload.get("memory"))])
            ids = [rid]
        # own acknowledged rows not deleted by the end of the request must all be served (no partial answer)
        ev.own_expected = [i for i in ids if i in own and i not in self.w.attempted]

    async def _search(self, client: httpx.AsyncClient, who: Who) -> None:
        if self.w.profile == "chroma":
            ev, payload = await self._call(client, who, "query", "POST", self._path(who.tenant, "query"),
                                           {"query_embeddings": [vec(self.rnd)], "n_results": 5})
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, list(zip((payload.get("ids") or [[]])[0], (payload.get("documents") or [[]])[0])))
        else:
            ev, payload = await self._call(client, who, "search", "POST", "/search", {"query": "soak memory", "top_k": 5})
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, [(r.get("id"), r.get("memory")) for r in payload.get("results") or []])

    async def _list(self, client: httpx.AsyncClient, who: Who) -> None:
        if self.w.profile == "chroma":
            ev, payload = await self._call(client, who, "list", "POST", self._path(who.tenant, "get"),
                                           {"where": {"mw_scope": self.rnd.choice(SCOPES)}, "limit": 20})
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, list(zip(payload.get("ids") or [], payload.get("documents") or [])))
        else:
            ev, payload = await self._call(client, who, "list", "GET", "/memories", params={"user_id": "soak", "top_k": "50"})
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, [(r.get("id"), r.get("memory")) for r in payload.get("results") or []])

    async def _foreign(self, client: httpx.AsyncClient, who: Who) -> None:
        other = self.rnd.choice([t for t in self.w.by_tenant if t != who.tenant])
        pool = self.w.by_tenant[other]
        ids = self.rnd.sample(pool, min(len(pool), 3)) if pool else ["x"]
        if self.w.profile == "chroma":
            ev, payload = await self._call(client, who, "foreign", "POST", self._path(other, "get"), {"ids": ids})
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, list(zip(payload.get("ids") or [], payload.get("documents") or [])))
        else:
            ev, payload = await self._call(client, who, "foreign", "GET", f"/memories/{ids[0]}")
            if ev.status == 200 and isinstance(payload, dict):
                self._record_rows(ev, [(payload.get("id"), payload.get("memory"))])


async def soak(world: World, clients: int, seconds: float, faults: list[tuple[float, str, Any, Any]],
               seed: int) -> tuple[Workload, list[dict[str, Any]]]:
    work = Workload(world, seed)
    stop_at = time.monotonic() + seconds
    windows: list[dict[str, Any]] = []

    async def client_loop(i: int) -> None:
        async with httpx.AsyncClient(base_url=world.sidecar.url, timeout=30.0, trust_env=False,
                                     limits=httpx.Limits(max_connections=2)) as client:
            while time.monotonic() < stop_at:
                await work.one(client)

    async def fault_loop() -> None:
        started = time.monotonic()
        for at, name, begin, end in faults:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            w = {"fault": name, "start": time.time()}
            await asyncio.to_thread(begin)
            w["injected"] = time.time()
            await asyncio.to_thread(end)
            w["end"] = time.time()
            windows.append(w)

    await asyncio.gather(fault_loop(), *(client_loop(i) for i in range(clients)))
    return work, windows


# -- the oracle -------------------------------------------------------------------------------------

def tombstone_times(led: Any) -> dict[str, float]:
    sql = "SELECT row_id, deleted_at FROM tombstones"
    if isinstance(led, SQLiteLedger):
        rows = led._db.execute(sql).fetchall()
        return {r[0]: r[1] / 1e6 for r in rows}
    with led._conn() as db:
        return {r["row_id"]: r["deleted_at"] / 1e6 for r in db.execute(sql).fetchall()}


def check(world: World, work: Workload, windows: list[dict[str, Any]]) -> dict[str, Any]:
    engine = PolicyEngine.load(POLICIES)
    led = world.ledger()
    coll = {t: world.collections.get(t, "default") for t in world.by_tenant}
    principals = {w.name: w for w in world.who}
    try:
        tomb = tombstone_times(led)
        all_ids: dict[str, set[str]] = {}
        for ev in work.events:
            all_ids.setdefault(principals[ev.who].tenant, set()).update(i for i in ev.served if isinstance(i, str))
        rows: dict[str, Any] = {}
        for tenant, ids in all_ids.items():
            c = coll[tenant] if world.profile == "chroma" else "default"
            rows.update(led.get_rows(world.profile, c, sorted(ids)))
        if world.profile == "chroma":  # another tenant's rows, for the foreign requests
            for tenant in world.by_tenant:
                rows.update({k: v for k, v in led.get_rows("chroma", coll[tenant], sorted(set().union(*all_ids.values()))).items()
                             if k not in rows})
        own_ids = {i for ev in work.events for i in ev.own_expected}
        for tenant in world.by_tenant:
            c = coll[tenant] if world.profile == "chroma" else "default"
            rows.update({k: v for k, v in led.get_rows(world.profile, c, sorted(own_ids)).items() if k not in rows})
        owners = led.agent_entities({r.owner for r in rows.values()})
        decided: dict[tuple[str, str], bool] = {}

        def readable(who_name: str, rid: str) -> bool:
            """The oracle: Cedar `read` (the sidecar's policy set) on the ledger's row, judged as it was, live."""
            key = (who_name, rid)
            if key not in decided:
                row = rows.get(rid)
                if row is None:
                    return False
                active = dataclasses.replace(row, status="active")
                ents = row_entities(principals[who_name].principal, [active], owners)
                decided[key] = engine.decide([CedarRequest(principals[who_name].principal.uid, "read", active.uid)], ents)[0].allowed
            return decided[key]
        unreadable = deleted_served = unknown = mismatched = 0
        examples: list[str] = []
        for ev in work.events:
            for rid in ev.served:
                row = rows.get(rid)
                if row is None:
                    unknown += 1
                    examples.append(f"{ev.who} served {rid}, which the ledger does not know")
                    continue
                if not readable(ev.who, rid):
                    unreadable += 1
                    examples.append(f"{ev.who} was served {rid} ({row.scope}, owner {row.owner}) it may not read")
                if rid in tomb and tomb[rid] < ev.t0:
                    deleted_served += 1
                    examples.append(f"{ev.who} was served {rid} at {ev.t0:.3f}, tombstoned at {tomb[rid]:.3f}")
                want = world.written.get(rid, {}).get("text")
                if want is not None and ev.texts.get(rid) not in (want, None):
                    mismatched += 1
        # acknowledged writes and deletes, at the end
        lost = []
        live = {i: m for i, m in world.written.items() if i not in world.attempted}
        for tenant in world.by_tenant:
            c = coll[tenant] if world.profile == "chroma" else "default"
            ids = [i for i, m in live.items() if m["tenant"] == tenant]
            got = led.get_rows(world.profile, c, ids)
            lost += [i for i in ids if i not in got or got[i].status != "active"]
        undeleted = [i for i in world.deleted if i not in tomb]
    finally:
        led.close()
    served_back = final_reads(world, live)

    def in_fault(t: float) -> dict[str, Any] | None:
        return next((w for w in windows if w["start"] - 0.5 <= t <= w["end"] + GRACE_S), None)

    status = Counter(ev.status for ev in work.events)
    outside = [ev for ev in work.events if (ev.status >= 500 or ev.status < 0) and in_fault(ev.t0) is None
               and in_fault(ev.t1) is None]
    # 500 (and 503) are the sidecar's own failures; 502/504 report the backend's (down, 5xx, timeout)
    sidecar_5xx = [ev for ev in outside if ev.status in (500, 503) or ev.status < 0]
    backend_5xx = [ev for ev in outside if ev.status in (502, 504)]
    partial = [ev for ev in work.events if ev.status == 200 and ev.own_expected
               and [i for i in ev.own_expected if i not in ev.served and not (i in tomb and tomb[i] <= ev.t1)
                    and readable(ev.who, i)]]
    per_fault = []
    for w in windows:
        during = [ev for ev in work.events if w["start"] <= ev.t0 <= w["end"]]
        after_ok = [ev.t1 for ev in work.events if ev.t0 >= w["end"] and 200 <= ev.status < 300]
        per_fault.append({
            "fault": w["fault"], "injected_at_s": round(w["injected"] - work.events[0].t0, 1),
            "lasted_s": round(w["end"] - w["start"], 1), "requests": len(during),
            "ok": sum(200 <= ev.status < 300 for ev in during),
            "5xx": sum(ev.status >= 500 for ev in during), "timeouts": sum(ev.status < 0 for ev in during),
            "4xx": sum(400 <= ev.status < 500 for ev in during),
            "statuses": dict(Counter(ev.status for ev in during)),
            "recovered_after_s": round(min(after_ok) - w["end"], 2) if after_ok else None,
        })
    return {
        "requests": len(work.events), "statuses": dict(sorted(status.items())),
        "rows_served": sum(len(ev.served) for ev in work.events),
        "acknowledged_writes": len(world.written), "acknowledged_deletes": len(world.deleted),
        "unreadable_rows_served": unreadable, "deleted_rows_served": deleted_served,
        "unknown_rows_served": unknown, "text_mismatches": mismatched,
        "sidecar_5xx_outside_faults": len(sidecar_5xx), "backend_5xx_outside_faults": len(backend_5xx),
        "error_bodies_with_rows": sum(ev.rows_in_error for ev in work.events),
        "partial_answers": len(partial), "acknowledged_writes_lost": len(lost) + len(served_back["missing"]),
        "acknowledged_deletes_not_tombstoned": len(undeleted),
        "acknowledged_deletes_served_at_end": served_back["deleted_served"],
        "faults": per_fault,
        "examples": examples[:10] + [f"lost: {i} {world.written[i]}" for i in (lost + served_back["missing"])[:5]]
        + [f"partial: {ev.who} {ev.op} at {ev.t0 - work.events[0].t0:.1f} s asked {ev.own_expected}, served {ev.served}"
           for ev in partial[:5]],
        "sidecar_5xx_examples": [(ev.op, ev.status, round(ev.t0 - work.events[0].t0, 1), ev.message)
                                 for ev in (sidecar_5xx + backend_5xx)[:10]],
        "lost_detail": lost_detail(world, lost + served_back["missing"], windows),
    }


def lost_detail(world: World, ids: list[str], windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the lost acknowledged writes are: in the ledger (status) and in the backend itself (read
    directly, around the sidecar), and how long before the first fault's injection they were acknowledged."""
    if not ids:
        return {}
    led = world.ledger()
    try:
        status = Counter()
        for tenant in world.by_tenant:
            c = world.collections.get(tenant, "default") if world.profile == "chroma" else "default"
            mine = [i for i in ids if world.written[i]["tenant"] == tenant]
            got = led.get_rows(world.profile, c, mine)
            status.update(got[i].status if i in got else "absent" for i in mine)
    finally:
        led.close()
    injected = windows[0]["injected"] if windows else None
    before = sorted(round(injected - world.written[i]["acked"], 3) for i in ids) if injected else []
    return {"ledger": dict(status), "acked_before_first_fault_s": before[:20]}


def final_reads(world: World, live: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """After the soak, as each tenant's admin (tenant-wide reader): every acknowledged live row is served,
    no acknowledged delete is."""
    missing: list[str] = []
    deleted_served = 0
    by = {w.name: w for w in world.who}
    with httpx.Client(base_url=world.sidecar.url, timeout=60, trust_env=False) as h:
        for tenant in world.by_tenant:
            admin = by[f"{tenant}/admin"]
            for ids, gone in (([i for i, m in live.items() if m["tenant"] == tenant], False),
                              ([i for i, m in world.written.items() if m["tenant"] == tenant and i in world.deleted], True)):
                if not ids:
                    continue
                if world.profile == "chroma":
                    path = f"/api/v2/tenants/{tenant}/databases/soakdb/collections/{world.collections[tenant]}/get"
                    got = set(h.post(path, json={"ids": ids}, headers={"X-API-Key": admin.key}).json()["ids"])
                else:
                    got = {i for i in ids if h.get(f"/memories/{i}", headers={"X-API-Key": admin.key}).status_code == 200}
                if gone:
                    deleted_served += len(got)
                else:
                    missing += [i for i in ids if i not in got]
    return {"missing": missing, "deleted_served": deleted_served}


# -- the attacks of hardening round 3 (run "attacks") ----------------------------------------------

class RssSampler:
    """The sidecar's resident memory (VmRSS of /proc/<pid>/status, MiB) every `every` seconds, timestamped."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.samples.append((time.time(), int(line.split()[1]) / 1024))
            except OSError:
                return
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        inside = [m for t, m in self.samples if start <= t <= end]
        return round(max(inside), 1) if inside else None


class SlowReadAttack:
    """Finding 1: `conns` keyless connections, each sending `pipelined` ``GET /api/v2/heartbeat`` in one send and
    never reading an answer, held open until `stop`."""

    def __init__(self, url: str, conns: int = 45, pipelined: int = 12_000) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.addr, self.conns, self.pipelined = (host, int(port)), conns, pipelined
        self.socks: list[socket.socket] = []
        self.refused = 0

    def start(self) -> None:
        burst = (f"GET /api/v2/heartbeat HTTP/1.1\r\nHost: {self.addr[0]}\r\n\r\n".encode()) * self.pipelined
        for _ in range(self.conns):
            try:
                s = socket.create_connection(self.addr, timeout=5)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.setblocking(False)
                try:
                    s.send(burst)  # as much as the kernel takes; the rest is never sent: the attacker does not read
                except BlockingIOError:
                    pass
                self.socks.append(s)
            except OSError:
                self.refused += 1

    def stop(self) -> None:
        for s in self.socks:
            s.close()


class LargeRowWriter:
    """Finding 3: a trust-1 agent adding agent-scoped rows of `size` bytes (only it may read them) in a loop."""

    def __init__(self, world: World, who: Who, size: int = 900 * 1024) -> None:
        self.world, self.who, self.size = world, who, size
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        w, who = self.world, self.who
        with httpx.Client(base_url=w.sidecar.url, headers={"X-API-Key": who.key}, timeout=60, trust_env=False) as h:
            while not self._stop.is_set():
                text = f"large {uuid.uuid4().hex} " + "x" * self.size
                try:
                    if w.profile == "chroma":
                        path = f"/api/v2/tenants/{who.tenant}/databases/soakdb/collections/{w.collections[who.tenant]}/add"
                        r = h.post(path, json={"ids": [f"big-{uuid.uuid4().hex[:12]}"], "embeddings": [[0.1] * 8],
                                               "documents": [text], "metadatas": [{"mw_scope": "agent"}]})
                    else:
                        r = h.post("/memories", json={"messages": [{"role": "user", "content": text}], "infer": False,
                                                      "user_id": "soak", "metadata": {"mw_scope": "agent"}})
                    self.statuses[r.status_code] += 1
                except httpx.HTTPError:
                    self.statuses[-1] += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class KeyChurn:
    """Finding 2: ``memwarden keys create`` then ``keys revoke`` as separate processes on the sidecar's own SQLite
    ledger, in a loop; each new key must be served (200) and, once revoked, refused (401)."""

    def __init__(self, world: World, ledger_path: Path, tenant: str) -> None:
        self.world, self.ledger, self.tenant = world, ledger_path, tenant
        self.cycles = self.not_served = self.not_revoked = self.cli_failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sidecar.cli", "keys", *args, "--ledger", str(self.ledger)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    def _run(self) -> None:
        path = "/api/v2/heartbeat" if self.world.profile == "chroma" else "/memories?user_id=soak"
        with httpx.Client(base_url=self.world.sidecar.url, timeout=30, trust_env=False) as h:
            while not self._stop.is_set():
                made = self._cli("create", "--tenant", self.tenant, "--fleet", "red", "--agent",
                                 f"churn{uuid.uuid4().hex[:6]}", "--trust", "1")
                key = made.stdout.strip()
                if made.returncode != 0 or not key or "key id " not in made.stderr:
                    self.cli_failures += 1
                    continue
                key_id = made.stderr.split("key id ", 1)[1].split()[0]
                self.not_served += h.get(path, headers={"X-API-Key": key}).status_code != 200
                if self._cli("revoke", key_id).returncode != 0:
                    self.cli_failures += 1
                    continue
                self.not_revoked += h.get(path, headers={"X-API-Key": key}).status_code != 401
                self.cycles += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def p99_ms(events: list[Event]) -> float | None:
    took = sorted((ev.t1 - ev.t0) * 1000 for ev in events if ev.status >= 0)
    return round(took[min(len(took) - 1, int(len(took) * 0.99))], 1) if took else None


# -- runs -------------------------------------------------------------------------------------------

def wait_ok(sidecar: Server, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(sidecar.url + "/_memwarden/readyz", timeout=5, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def run(profile: str, kind: str, clients: int, seconds: float, root: Path) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    backend = start_backend(profile, root)
    env = {"MEMWARDEN_METRICS_PORT": "0", "MEMWARDEN_RECONCILE_INTERVAL_S": "5", "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
           "MEMWARDEN_LOG_LEVEL": "WARNING", "MEMWARDEN_BACKEND_TIMEOUT_S": "10", "MEMWARDEN_LEDGER_TIMEOUT_S": "3"}
    if profile == "mem0":
        env.update({"MEMWARDEN_BACKEND": "mem0", "MEMWARDEN_BACKEND_AUTH_HEADER": "X-API-Key", "MEMWARDEN_BACKEND_TOKEN": MEM0_KEY})
    pg = fs = None
    sidecar = None
    try:
        if kind == "pg":
            pg = PrivatePostgres(root / "pg")
            env["MEMWARDEN_LEDGER_URL"] = pg.url
            ledger_args: dict[str, Any] = {"url": pg.url}
        elif kind == "attacks":
            env["MEMWARDEN_LEDGER_PATH"] = str(root / "ledger.db")
            ledger_args = {"path": root / "ledger.db"}
            SQLiteLedger(root / "ledger.db").close()
        else:
            fs = Tmpfs(root / "tmpfs")
            # only the ledger is on the small file system; the sidecar's log stays in `root`
            env["MEMWARDEN_LEDGER_PATH"] = str(fs.path / "ledger.db")
            ledger_args = {"path": fs.path / "ledger.db"}
            SQLiteLedger(fs.path / "ledger.db").close()
        sidecar = start_sidecar(backend.server.url, root / "unused.db", POLICIES, extra_env=env, timeout_s=120)
        pid = sidecar.proc.pid
        world = provision(profile, sidecar, ledger_args)
        rss = RssSampler(pid)
        extra: dict[str, Any] = {}
        restart_wait = 4.0 if profile == "chroma" else 2.0
        if kind == "attacks":
            tenant = next(iter(world.by_tenant))
            led = world.ledger()
            try:
                big_key = led.create_key("agent", tenant, "red", "bigwriter", 1)[1]
                big = Who(f"{tenant}/red/bigwriter", tenant, big_key, led.authenticate(big_key))
            finally:
                led.close()
            slow = SlowReadAttack(sidecar.url)
            writer = LargeRowWriter(world, big)
            churn = KeyChurn(world, root / "ledger.db", tenant)
            extra = {"slow": slow, "writer": writer, "churn": churn}
            span = seconds * 0.15
            faults = [(seconds * 0.10, "slow-read attack (keyless)", slow.start, lambda: (time.sleep(span), slow.stop())),
                      (seconds * 0.40, "large-row writer", writer.start, lambda: (time.sleep(span), writer.stop())),
                      (seconds * 0.70, "keys create/revoke loop", churn.start, lambda: (time.sleep(span), churn.stop()))]
        elif kind == "pg":
            faults = [(seconds * 0.15, f"{profile} killed and restarted", backend.kill,
                       lambda: (time.sleep(restart_wait), backend.restart())),
                      (seconds * 0.75, "PostgreSQL restarted", pg.restart if pg else (lambda: None), lambda: time.sleep(1.0))]
        else:
            faults = [(seconds * 0.3, "ledger disk full", fs.fill if fs else (lambda: None),
                       lambda: (time.sleep(seconds * 0.2), fs.free() if fs else None))]
        work, windows = asyncio.run(soak(world, clients, seconds, faults, seed=zlib.crc32(f"{profile}/{kind}".encode())))
        wait_ok(sidecar)
        rss.stop()
        result = check(world, work, windows)
        quiet = [ev for ev in work.events
                 if not any(w["start"] - 0.5 <= ev.t0 <= w["end"] + GRACE_S for w in windows)]
        result["quiet_p99_ms"] = p99_ms(quiet)
        result["peak_rss_mib"] = rss.peak()
        result["quiet_peak_rss_mib"] = max((round(m, 1) for t, m in rss.samples
                                            if not any(w["start"] <= t <= w["end"] for w in windows)), default=None)
        for f, w in zip(result["faults"], windows):
            during = [ev for ev in work.events if w["start"] <= ev.t0 <= w["end"]]
            f["p99_ms"] = p99_ms(during)
            f["peak_rss_mib"] = rss.peak(w["start"], w["end"])
        if extra:
            slow, writer, churn = extra["slow"], extra["writer"], extra["churn"]
            result["attack_detail"] = {
                "slow-read connections opened": len(slow.socks), "slow-read connections refused": slow.refused,
                "large-row writes": dict(writer.statuses),
                "key cycles": churn.cycles, "new keys not served": churn.not_served,
                "revocations not effective": churn.not_revoked, "key CLI failures": churn.cli_failures}
        result.update({"profile": profile, "run": kind, "clients": clients, "seconds": seconds,
                       "sidecar_restarted": sidecar.proc.poll() is not None or sidecar.proc.pid != pid})
        return result
    finally:
        if sidecar is not None:
            sidecar.stop()
        try:
            backend.server.stop()
        except Exception:
            pass
        if pg is not None:
            pg.stop()
        if fs is not None:
            fs.unmount()


def report(r: dict[str, Any]) -> None:
    print(f"\n== {r['profile']} / {r['run']}: {r['clients']} clients x {r['seconds']:g} s ==")
    print(f"requests {r['requests']}  statuses {r['statuses']}  rows served {r['rows_served']}")
    print(f"acknowledged: {r['acknowledged_writes']} writes, {r['acknowledged_deletes']} deletes")
    for k in ("unreadable_rows_served", "deleted_rows_served", "unknown_rows_served", "text_mismatches",
              "sidecar_5xx_outside_faults", "backend_5xx_outside_faults", "error_bodies_with_rows", "partial_answers", "acknowledged_writes_lost",
              "acknowledged_deletes_not_tombstoned", "acknowledged_deletes_served_at_end", "sidecar_restarted"):
        print(f"  {k:40s} {r[k]}")
    print(f"  quiet: p99 {r['quiet_p99_ms']} ms, peak RSS {r['quiet_peak_rss_mib']} MiB; whole run peak RSS "
          f"{r['peak_rss_mib']} MiB")
    for f in r["faults"]:
        print(f"  fault: {f['fault']}: at {f['injected_at_s']} s for {f['lasted_s']} s; {f['requests']} requests "
              f"({f['ok']} ok, {f['4xx']} 4xx, {f['5xx']} 5xx, {f['timeouts']} client timeouts) {f['statuses']}; "
              f"first success {f['recovered_after_s']} s after it ended; p99 {f['p99_ms']} ms, "
              f"peak RSS {f['peak_rss_mib']} MiB")
    for k, v in r.get("attack_detail", {}).items():
        print(f"  {k:40s} {v}")
    for e in r["examples"] + [str(x) for x in r["sidecar_5xx_examples"]]:
        print(f"    e.g. {e}")
    if r["lost_detail"]:
        print(f"  lost writes: {r['lost_detail']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="both", choices=("chroma", "mem0", "both"))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--runs", default="pg,disk,attacks")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/soak.py needs root (tmpfs mount, a private PostgreSQL cluster run as postgres)")
        return 2
    profiles = ("chroma", "mem0") if args.profile == "both" else (args.profile,)
    results = []
    root = Path(tempfile.mkdtemp(prefix="memwarden-soak-"))
    os.chmod(root, 0o755)
    try:
        for profile in profiles:
            for kind in [k.strip() for k in args.runs.split(",") if k.strip()]:
                r = run(profile, kind, args.clients, args.seconds, root / f"{profile}-{kind}")
                report(r)
                results.append(r)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    bad = [r for r in results if any(r[k] for k in (
        "unreadable_rows_served", "deleted_rows_served", "unknown_rows_served", "sidecar_5xx_outside_faults",
        "error_bodies_with_rows", "partial_answers", "acknowledged_writes_lost", "acknowledged_deletes_not_tombstoned",
        "acknowledged_deletes_served_at_end", "sidecar_restarted"))
        or any(r.get("attack_detail", {}).get(k) for k in ("new keys not served", "revocations not effective"))
        # an attack is not a backend fault: the legitimate clients must see no 5xx and no timeout during it
        or (r["run"] == "attacks" and any(f["5xx"] or f["timeouts"] for f in r["faults"]))]
    print(f"\n{len(results) - len(bad)} of {len(results)} runs clean")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
