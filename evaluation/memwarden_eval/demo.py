"""``memwarden-eval demo``: a scripted multi-agent scenario through the sidecar in front of a real Chroma.

2 tenants × 2 fleets × 3 agents (mixed trust) plus one admin per tenant. Writers store memories at
every scope with real all-MiniLM-L6-v2 embeddings through the official `chromadb.HttpClient`; every
principal then gets, queries and counts, probes the other tenant's collection by UUID, and one
memory is deleted. For each principal the table compares what it saw with what the Cedar policies
say it should see (cedarpy on the scenario's rows). Exit 0 only if nothing leaked and nothing
authorised was missing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sidecar.config import default_policies_dir
from sidecar.governance import Principal, Row, agent_entity, row_entities
from memwarden_eval.harness import Server, start_chroma, start_sidecar
from sidecar.ledger import SQLiteLedger
from sidecar.policy import CedarRequest, PolicyEngine

POLICIES = default_policies_dir()  # the packaged default set (a checkout: its policies/)
TENANTS = ("acme", "globex")
# (fleet, agent, trust)
AGENTS = [("red", "scout", 0), ("red", "writer", 1), ("red", "lead", 3),
          ("blue", "writer", 1), ("blue", "analyst", 2), ("blue", "intern", 0)]
# (writer fleet/agent, scope, extra metadata, text)
MEMORIES = [
    ("red/writer", "agent", {}, "My private scratchpad: the staging database password rotates on Fridays."),
    ("red/writer", "fleet", {}, "Red fleet runbook: restart the ingest worker before the nightly batch."),
    ("red/writer", "tenant", {}, "Company-wide: the quarterly planning offsite is in Lisbon."),
    ("red/writer", "restricted", {"mw_readers": "blue/analyst"}, "Incident 42 root cause, shared only with the blue analyst."),
    ("red/lead", "fleet", {"mw_fleet": "blue"}, "Lead's handover note re-homed to the blue fleet."),
    ("blue/writer", "agent", {}, "Blue writer's draft reply to the customer escalation."),
    ("blue/writer", "fleet", {}, "Blue fleet: the vector index rebuild takes about forty minutes."),
    ("blue/writer", "restricted", {"mw_readers": "red/scout,blue/writer"}, "Vendor contract renewal terms, need-to-know."),
]


@dataclass
class Outcome:
    principal: str
    trust: str
    expected: set[str]
    seen_get: set[str]
    seen_query: set[str]
    count: int
    foreign_status: int

    @property
    def leaked(self) -> set[str]:
        return (self.seen_get | self.seen_query) - self.expected

    @property
    def missing(self) -> set[str]:
        return (self.expected - self.seen_get) | (self.expected - self.seen_query)

    @property
    def ok(self) -> bool:
        return not self.leaked and not self.missing and self.count == len(self.expected) and self.foreign_status == 404


def _client(port: int, key: str, tenant: str) -> Any:
    import chromadb

    return chromadb.HttpClient(host="127.0.0.1", port=port, headers={"X-API-Key": key}, tenant=tenant,
                               settings=chromadb.config.Settings(anonymized_telemetry=False))


def run_demo(workdir: Path | None = None, console: Console | None = None, probe: bool = True) -> int:
    console = console or Console(width=None if Console().is_terminal else 150)
    tmp = tempfile.TemporaryDirectory(prefix="memwarden-demo-") if workdir is None else None
    root = Path(tmp.name) if tmp else Path(workdir)  # type: ignore[arg-type]
    chroma: Server | None = None
    sidecar: Server | None = None
    try:
        console.print("[bold]memwarden-eval demo[/bold] — loading all-MiniLM-L6-v2 (local, offline) ...")
        from memwarden_eval.embeddings import embed

        texts = [m[3] for m in MEMORIES]
        vectors = embed(texts)
        chroma = start_chroma(root / "chroma")
        console.print(f"chroma run on {chroma.url}")
        ledger = SQLiteLedger(root / "ledger.db")
        keys: dict[tuple[str, str], str] = {}
        for tenant in TENANTS:
            keys[(tenant, "admin")] = ledger.create_key("admin", tenant, None, None, 0)[1]
            for fleet, agent, trust in AGENTS:
                keys[(tenant, f"{fleet}/{agent}")] = ledger.create_key("agent", tenant, fleet, agent, trust)[1]
        ledger.close()
        sidecar = start_sidecar(chroma.url, root / "ledger.db", POLICIES)
        console.print(f"memwarden sidecar on {sidecar.url}, policies from {POLICIES}")

        import chromadb

        collection_ids: dict[str, str] = {}
        written: dict[str, list[tuple[str, str, dict[str, Any], str]]] = {}
        for tenant in TENANTS:
            admin_key = keys[(tenant, "admin")]
            adm = chromadb.AdminClient(chromadb.config.Settings(
                chroma_api_impl="chromadb.api.fastapi.FastAPI", chroma_server_host="127.0.0.1",
                chroma_server_http_port=sidecar.port, chroma_server_headers={"X-API-Key": admin_key},
                anonymized_telemetry=False))
            adm.create_tenant(tenant)
            adm.create_database("default_database", tenant=tenant)
            coll = _client(sidecar.port, admin_key, tenant).create_collection("memories")
            collection_ids[tenant] = str(coll.id)
            written[tenant] = []
            for i, (writer, scope, extra, text) in enumerate(MEMORIES):
                row_id = f"{tenant}-m{i}"
                c = _client(sidecar.port, keys[(tenant, writer)], tenant).get_collection("memories")
                c.add(ids=[row_id], embeddings=[vectors[i]], documents=[text], metadatas=[{"mw_scope": scope, **extra}])
                written[tenant].append((row_id, writer, extra, scope))
            # The red writer forgets its private scratchpad: deleted for everyone, on every path.
            _client(sidecar.port, keys[(tenant, "red/writer")], tenant).get_collection("memories").delete(ids=[f"{tenant}-m0"])

        engine = PolicyEngine.load(POLICIES)
        outcomes: list[Outcome] = []
        for tenant in TENANTS:
            other = TENANTS[1 - TENANTS.index(tenant)]
            rows = _scenario_rows(tenant, written[tenant], deleted={f"{tenant}-m0"})
            for name in ["admin"] + [f"{f}/{a}" for f, a, _ in AGENTS]:
                principal = _principal(tenant, name)
                expected = _expected(engine, principal, rows)
                client = _client(sidecar.port, keys[(tenant, name)], tenant)
                coll = client.get_collection("memories")
                seen_get = set(coll.get()["ids"])
                seen_query: set[str] = set()
                for i in range(len(MEMORIES)):
                    res = coll.query(query_embeddings=[vectors[i]], n_results=len(MEMORIES))
                    seen_query |= set(res["ids"][0])
                count = coll.count()
                import httpx

                r = httpx.post(f"{sidecar.url}/api/v2/tenants/{tenant}/databases/default_database/collections/"
                               f"{collection_ids[other]}/get", json={}, headers={"X-API-Key": keys[(tenant, name)]},
                               trust_env=False, timeout=30)
                trust = "admin" if name == "admin" else str(principal.trust)
                outcomes.append(Outcome(f"{tenant}/{name}", trust, expected, seen_get, seen_query, count, r.status_code))
        _print(console, outcomes)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            console.print(f"[red]FAIL[/red]: {len(failed)} principals saw something the policies do not allow or missed something they do")
            return 1
        total = sum(len(o.expected) for o in outcomes)
        console.print(f"[green]OK[/green]: {len(outcomes)} principals, {total} authorised row views, 0 leaks, 0 misses; "
                      "cross-tenant collection probes all 404; the deleted memory is gone on get, query and count.")
        if probe:
            return _probe(chroma, sidecar, root, console)
        return 0
    finally:
        if sidecar:
            sidecar.stop()
        if chroma:
            chroma.stop()
        if tmp:
            tmp.cleanup()


def _probe(chroma: Server, sidecar: Server, root: Path, console: Console) -> int:
    """A small `memwarden-eval probe` (all five experiments, small counts) on the same servers; prints the
    side-by-side table. Fails the demo if the sidecar leaks or misses on any path of any experiment:
    leakage, propagation and forgetting against the reference predicate, contradiction (a stale read of
    a superseded fact, or the newest fact missing) and provenance (a lineage answer incomplete, at the
    wrong depth or with the wrong writer)."""
    from memwarden_eval.embeddings import embed
    from memwarden_eval.probe.experiments import EXPERIMENTS, Sizes
    from memwarden_eval.probe.metrics import summarize
    from memwarden_eval.probe.plan import Plan
    from memwarden_eval.probe.report import read_events
    from memwarden_eval.probe.runner import print_table, run_probe

    console.print("\n[bold]memwarden-eval probe[/bold] (small): the same experiments against Chroma directly and through memwarden")
    sizes = Sizes(propagation_facts=10, window_facts=3, contradiction_facts=10, chains=10, forget_rows=12, forget_deleted=4)
    run_dir = run_probe(Plan.build(7), list(EXPERIMENTS), chroma.url, sidecar.url, root / "ledger.db", root / "runs", embed, sizes, console)
    print_table(run_dir, console)
    paths, _, _ = summarize(read_events(run_dir))
    bad = [p for p in paths if p.target == "sidecar" and (p.leak.k or p.miss.k)]
    if bad:
        console.print(f"[red]FAIL[/red]: the sidecar leaked or missed on {[(p.experiment, p.path) for p in bad]}")
        return 1
    stale = sum(p.leak.n for p in paths if p.target == "sidecar" and p.experiment == "contradiction" and p.path == "sequential")
    console.print(f"[green]OK[/green] (probe): through memwarden 0 leaks and 0 misses on every path; contradicting facts "
                  f"are superseded (0 stale reads in {stale} sequential pairs), chains are read from the lineage endpoint, "
                  "and deleted rows are gone from get, search, list, count and lineage.")
    return 0


def _principal(tenant: str, name: str) -> Principal:
    if name == "admin":
        return Principal("admin", "demo", tenant)
    fleet, agent = name.split("/")
    trust = next(t for f, a, t in AGENTS if f == fleet and a == agent)
    return Principal("agent", "demo", tenant, fleet, agent, trust)


def _scenario_rows(tenant: str, written: list[tuple[str, str, dict[str, Any], str]], deleted: set[str]) -> list[Row]:
    rows = []
    for row_id, writer, extra, scope in written:
        fleet, agent = writer.split("/")
        readers = tuple(f"{tenant}/{r}" for r in extra.get("mw_readers", "").split(",") if r)
        rows.append(Row("chroma", "c", row_id, tenant, extra.get("mw_fleet", fleet), f"{tenant}/{fleet}/{agent}", scope,
                        f"{tenant}/{fleet}/{agent}", 0, status="deleted" if row_id in deleted else "active", readers=readers))
    return rows


def _expected(engine: PolicyEngine, principal: Principal, rows: list[Row]) -> set[str]:
    owners = {f"{principal.tenant}/{f}/{a}": agent_entity(principal.tenant, f, a, t) for f, a, t in AGENTS}
    decisions = engine.decide([CedarRequest(principal.uid, "read", r.uid) for r in rows], row_entities(principal, rows, owners))
    return {r.row_id for r, d in zip(rows, decisions) if d.allowed}


def _short(ids: set[str]) -> str:
    return ",".join(sorted(i.split("-", 1)[1] for i in ids)) or "-"


def _print(console: Console, outcomes: list[Outcome]) -> None:
    table = Table(title="What each principal saw through memwarden (m0 was deleted by its owner)")
    for col in ("principal", "trust", "policies allow", "get", "query", "count", "other tenant", "leaked", "missing", ""):
        table.add_column(col)
    for o in outcomes:
        table.add_row(o.principal, o.trust, _short(o.expected), _short(o.seen_get), _short(o.seen_query), str(o.count),
                      str(o.foreign_status), _short(o.leaked), _short(o.missing), "[green]ok[/green]" if o.ok else "[red]FAIL[/red]")
    console.print(table)
