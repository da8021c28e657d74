"""The five governance experiments. Each takes a `Plan`, a target and the embedder, and emits events.

Expectations come from the reference predicate (`plan.expected_read`), not from the target, so the
same probes measure a bare backend and the sidecar alike, on every backend (`memwarden_eval.probe.targets`).
A path the target lacks (history on Chroma, lineage on a bare backend, count on Mem0) is reported as
a ``not_supported`` event, never as a failure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable

from memwarden_eval.probe.plan import Agent, Plan, expected_read
from memwarden_eval.probe.targets import Result, Target

Embed = Callable[[list[str]], list[list[float]]]
EXPERIMENTS = ("leakage", "provenance", "propagation", "contradiction", "forgetting")
WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "krypton",
         "lagoon", "meadow", "nickel", "onyx", "prairie", "quartz", "russet", "sierra", "tundra")


@dataclass(frozen=True)
class Sizes:
    """How many items each experiment uses (the issue's defaults; `tiny` for CI)."""

    propagation_facts: int = 40
    window_facts: int = 8
    contradiction_facts: int = 100
    chains: int = 50
    forget_rows: int = 30
    forget_deleted: int = 10
    search_k: int = 5
    poll_interval_s: float = 0.25
    poll_timeout_s: float = 10.0

    @classmethod
    def tiny(cls) -> "Sizes":
        return cls(propagation_facts=4, window_facts=2, contradiction_facts=4, chains=3, forget_rows=6, forget_deleted=3)


class Events:
    """Collects events (see `memwarden_eval.probe.metrics`) and reports progress."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.items: list[dict[str, Any]] = []
        self.on_event = on_event

    def _add(self, e: dict[str, Any]) -> None:
        e["ts"] = time.time()
        self.items.append(e)
        if self.on_event:
            self.on_event(e)

    def probe(self, experiment: str, target: str, path: str, principal: str, row: str, expected: bool,
              observed: bool, result: Result | None = None) -> None:
        self._add({"kind": "probe", "experiment": experiment, "target": target, "path": path, "principal": principal,
                   "row": row, "expected": "allow" if expected else "deny", "observed": "allow" if observed else "deny",
                   "status": result.status if result else None, "latency_ms": round(result.ms, 3) if result else None})

    def latency(self, experiment: str, target: str, op: str, ms: float) -> None:
        self._add({"kind": "latency", "experiment": experiment, "target": target, "op": op, "ms": round(ms, 3)})

    def unsupported(self, experiment: str, target: str, path: str, reason: str) -> None:
        self._add({"kind": "not_supported", "experiment": experiment, "target": target, "path": path, "reason": reason})


def _text(plan: Plan, salt: str, body: str) -> str:
    rnd = plan.rng(salt)
    return f"[{plan.nonce}] {body} ({' '.join(rnd.choice(WORDS) for _ in range(3))})"


async def leakage(plan: Plan, t: Target, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Each fleet's owner writes an agent- and a fleet-scoped secret; every agent probes every secret."""
    secrets: list[tuple[str, str, str, Agent]] = []  # (row name, scope, text, owner)
    for tenant in plan.tenants:
        for fleet in plan.fleets:
            owner = plan.owner(tenant, fleet)
            for scope in ("agent", "fleet"):
                row_id = f"{plan.nonce}-leak-{tenant}-{fleet}-{scope}"
                secrets.append((row_id, scope, _text(plan, row_id, f"{scope} secret of {fleet}: vault code"), owner))
    vectors = embed([s[2] for s in secrets])
    writes = await asyncio.gather(*(t.add(o, rid, text, v, scope) for (rid, scope, text, o), v in zip(secrets, vectors)))
    for (rid, _, _, o), w in zip(secrets, writes):
        ev.latency("leakage", t.name, "write", w.ms)
        if not w.ok:
            raise RuntimeError(f"{t.label}: owner write failed with {w.status}: {w.body}")

    async def probe(reader: Agent, secret: tuple[str, str, str, Agent], vector: list[float]) -> None:
        rid, scope, text, owner = secret
        expected = expected_read(reader, owner.tenant, owner.fleet, owner.uid, scope)
        got = await t.get(reader, rid)
        seen = t.seen(got, rid)
        ev.probe("leakage", t.name, "get", reader.uid, rid, expected, seen, got)
        if scope == "fleet" and reader.fleet != owner.fleet and reader.tenant == owner.tenant and reader.trust in (1, 2):
            ev.probe("leakage", t.name, f"get-xfleet-trust{reader.trust}", reader.uid, rid, expected, seen, got)
        found = await t.search(reader, text, vector, sizes.search_k)
        ev.probe("leakage", t.name, "search", reader.uid, rid, expected, t.seen(found, rid, text), found)

    await asyncio.gather(*(probe(r, s, v) for r in plan.agents for s, v in zip(secrets, vectors)))


async def propagation(plan: Plan, t: Target, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Fleet-scoped facts: 3 siblings should see them, 2 foreign readers (trust < 2) should not."""
    tenant, home = plan.tenants[0], plan.fleets[0]
    writer = plan.owner(tenant, home)
    siblings = plan.fleet_agents(tenant, home)[1:4]
    foreign = [a for f in plan.fleets[1:] for a in plan.fleet_agents(tenant, f) if a.trust < 2][:2]
    facts = [f"{plan.nonce}-prop-{i}" for i in range(sizes.propagation_facts)]
    texts = [_text(plan, rid, f"fleet fact {i} about the {home} rollout") for i, rid in enumerate(facts)]
    vectors = embed(texts)
    for rid, text, v in zip(facts, texts, vectors):
        w = await t.add(writer, rid, text, v, "fleet")
        ev.latency("propagation", t.name, "write", w.ms)

    async def probe(reader: Agent, rid: str) -> None:
        got = await t.get(reader, rid)
        expected = expected_read(reader, tenant, home, writer.uid, "fleet")
        ev.probe("propagation", t.name, "sibling-get" if reader.fleet == home else "foreign-get", reader.uid, rid,
                 expected, t.seen(got, rid), got)

    await asyncio.gather(*(probe(r, rid) for r in siblings + foreign for rid in facts))
    # write → visible window, one fact at a time, polled by the first sibling
    window_texts = [_text(plan, f"win{i}", f"window fact {i}") for i in range(sizes.window_facts)]
    for i, (text, v) in enumerate(zip(window_texts, embed(window_texts))):
        rid = f"{plan.nonce}-window-{i}"
        w = await t.add(writer, rid, text, v, "fleet")
        if not w.ok:
            ev.unsupported("propagation", t.name, "write_to_visible", f"write refused ({w.status})")
            continue
        acked = time.perf_counter()
        deadline = acked + sizes.poll_timeout_s
        while True:
            got = await t.get(siblings[0], rid)
            if t.seen(got, rid):
                ev.latency("propagation", t.name, "write_to_visible", (time.perf_counter() - acked) * 1000)
                break
            if time.perf_counter() > deadline:
                ev.probe("propagation", t.name, "window-timeout", siblings[0].uid, rid, True, False, got)
                break
            await asyncio.sleep(sizes.poll_interval_s)


async def contradiction(plan: Plan, t: Target, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Pairs of contradicting facts on a single-valued predicate, near-identical wording.

    Both targets get the same facts (subject, ``pipeline_status``, paused → running): through the
    sidecar as the governed triple ``mw_subject``/``mw_predicate``/``mw_object`` (``pipeline_status`` is
    single-valued in the default ``policies/single_valued.txt``, so the newer fact supersedes the older),
    directly as the same values in plain metadata. Per pair the reader asks for the facts about
    (subject, predicate) (`Target.facts`: a Chroma ``where``, a Mem0 search filtered on them): the
    superseded fact must not be served (expected deny; a stale read is a leak) and the newest must be
    (expected allow). Detection rate = 1 − stale-read rate. Sequential pairs are also searched with the
    superseded fact's own text and embedding (``sequential-search``).
    """
    tenant, fleet = plan.tenants[0], plan.fleets[0]
    writer = plan.owner(tenant, fleet)
    reader = plan.fleet_agents(tenant, fleet)[1]
    predicate = "pipeline_status"
    for mode in ("sequential", "concurrent"):
        for i in range(sizes.contradiction_facts):
            subject = f"{plan.nonce}-svc{i}-{mode}"
            old_text = f"[{plan.nonce}] The deploy pipeline of service {subject} is paused for maintenance."
            new_text = f"[{plan.nonce}] The deploy pipeline of service {subject} is running after maintenance."
            v_old, v_new = embed([old_text, new_text])
            old_meta, new_meta = t.fact(subject, predicate, "paused"), t.fact(subject, predicate, "running")
            ids = (f"{subject}-old", f"{subject}-new")
            if mode == "sequential":
                a = await t.add(writer, ids[0], old_text, v_old, "fleet", old_meta)
                b = await t.add(writer, ids[1], new_text, v_new, "fleet", new_meta)
            else:
                a, b = await asyncio.gather(t.add(writer, ids[0], old_text, v_old, "fleet", old_meta),
                                            t.add(writer, ids[1], new_text, v_new, "fleet", new_meta))
            for w in (a, b):
                ev.latency("contradiction", t.name, "write", w.ms)
            got = await t.facts(reader, subject, predicate)
            ids_seen = t.names_in(got)
            both = a.ok and b.ok
            if mode == "sequential":
                stale, newest = ids[0] in ids_seen, ids[1] in ids_seen
            else:  # either order may win; exactly one must be served
                stale, newest = len(ids_seen & set(ids)) > 1, len(ids_seen & set(ids)) >= 1
            for path in (mode, f"{mode}-both-admitted") if both else (mode,):
                ev.probe("contradiction", t.name, path, reader.uid, subject, False, stale, got)
                ev.probe("contradiction", t.name, f"{path}-newest", reader.uid, subject, True, newest, got)
            if mode == "sequential" and both:
                found = await t.search(reader, old_text, v_old, sizes.search_k)
                ev.probe("contradiction", t.name, "sequential-search", reader.uid, subject, False,
                         t.seen(found, ids[0], old_text), found)


async def provenance(plan: Plan, t: Target, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Chains observation → hypothesis → mitigation → verification, each row naming its parent.

    Every fifth chain's third hop claims another writer in its metadata; the recorded writer must
    still be the real one. Every write is a probe (``write``: admitted or not). Where the target has a
    lineage route (the sidecar), parents are named in ``mw_derived_from`` and each chain is read with one
    lineage call from the leaf: completeness (the ids root → leaf), depth fidelity (every node at its
    depth, no extra nodes) and writer accuracy come from that answer; latency ``lineage`` is the call,
    ``hop`` the call divided by the chain's hops. Elsewhere parents are plain ``derived_from`` metadata
    and the chain is walked from the leaf by get-by-id, one ``hop`` latency per get.
    """
    tenant, fleet = plan.tenants[0], plan.fleets[0]
    writers = plan.writers(tenant, fleet)
    reader = plan.fleet_agents(tenant, fleet)[1]
    stages = ("observation", "hypothesis", "mitigation", "verification")
    has_lineage = "lineage" in t.supports
    for c in range(sizes.chains):
        truth: list[tuple[str, str]] = []  # (row name, real writer), root first
        parent = None
        texts = [_text(plan, f"chain{c}-{s}", f"{s} for incident {c}") for s in stages]
        for depth, (stage, text, v) in enumerate(zip(stages, texts, embed(texts))):
            author = writers[depth % len(writers)]
            rid = f"{plan.nonce}-chain{c}-{depth}"
            forged = plan.owner(tenant, plan.fleets[1]).uid if (c % 5 == 4 and depth == 2) else None
            w = await t.add(author, rid, text, v, "fleet", {"stage": stage}, claimed_writer=forged,
                            parents=[parent] if parent else [])
            ev.latency("provenance", t.name, "write", w.ms)
            ev.probe("provenance", t.name, "write", author.uid, rid, True, w.ok, w)
            truth.append((rid, author.uid))
            parent = rid
        if has_lineage:
            lin = await t.lineage(reader, truth[-1][0])
            hops = len(truth) - 1
            ev.latency("provenance", t.name, "lineage", lin.ms)
            ev.latency("provenance", t.name, "hop", lin.ms / hops)
            nodes = t.lineage_nodes(lin)
            walked = [(n.name, n.writer) for n in sorted(nodes, key=lambda n: -n.depth)]  # root first
            by_name = {n.name: n for n in nodes if n.name}
            depth_ok = len(nodes) == len(truth) and all(r in by_name and by_name[r].depth == hops - i
                                                        for i, (r, _) in enumerate(truth))
        else:
            chain: list[tuple[str | None, str | None]] = []
            current: str | None = truth[-1][0]
            while current and len(chain) < 10:
                got = await t.get(reader, current)
                ev.latency("provenance", t.name, "hop", got.ms)
                meta = t.metadata(got, current)
                if meta is None:
                    break
                chain.append((current, t.writer_of(meta)))
                current = t.parent_of(meta)
            walked = list(reversed(chain))
            depth_ok = len(walked) == len(truth)
        chain_id = f"chain{c}"
        ev.probe("provenance", t.name, "completeness", reader.uid, chain_id, True, [r for r, _ in walked] == [r for r, _ in truth])
        ev.probe("provenance", t.name, "depth", reader.uid, chain_id, True, depth_ok)
        recorded = dict(walked)
        for rid, real in truth:
            ev.probe("provenance", t.name, "writer", reader.uid, rid, True, recorded.get(rid) == real)
    if not has_lineage:
        ev.unsupported("provenance", t.name, "lineage-endpoint", f"lineage is a memwarden route; {t.title} alone has "
                       "none, so chains are walked by get-by-id over plain derived_from metadata")


def _same(a: Result, b: Result) -> bool:
    return (a.status, a.body) == (b.status, b.body)


async def forgetting(plan: Plan, t: Target, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Delete a sample, then probe every path the target has: get, search by the exact text, list,
    history (Mem0), lineage (the sidecar), count (Chroma), and confirmation by status/shape against a
    never-existing id on get, history and lineage.

    The owner writes tenant-scoped rows; a reader of another fleet probes them. Where the target has
    lineage, the owner also writes one agent-scoped child per row (``mw_derived_from`` the row) and reads
    its lineage: a live parent must be shown (``lineage-child``, expected allow), a deleted one never
    (expected deny; a child removed by the deletion closure shows nothing and counts as not shown). A
    deleted row's lineage and history must answer exactly (status and body) like a never-existing id's.
    """
    tenant, fleet = plan.tenants[0], plan.fleets[0]
    owner = plan.owner(tenant, fleet)
    reader = plan.fleet_agents(tenant, plan.fleets[1])[0]
    has = t.supports
    rows = [f"{plan.nonce}-forget-{i}" for i in range(sizes.forget_rows)]
    texts = [_text(plan, rid, f"tenant-wide note {i} on the billing migration") for i, rid in enumerate(rows)]
    vectors = embed(texts)
    for rid, text, v in zip(rows, texts, vectors):
        w = await t.add(owner, rid, text, v, "tenant")
        ev.latency("forgetting", t.name, "write", w.ms)
        if not w.ok:
            raise RuntimeError(f"{t.label}: owner write failed with {w.status}: {w.body}")
    children = {rid: f"{rid}-child" for rid in rows} if "lineage" in has else {}
    if children:
        child_texts = [_text(plan, c, f"follow-up {i} to the billing migration note") for i, c in enumerate(children.values())]
        for (rid, child), text, v in zip(children.items(), child_texts, embed(child_texts)):
            w = await t.add(owner, child, text, v, "agent", parents=[rid])
            ev.probe("forgetting", t.name, "child-write", owner.uid, child, True, w.ok, w)
    before = await t.count(reader) if "count" in has else None
    deleted = set(plan.rng("forget").sample(rows, sizes.forget_deleted))
    for d in await t.delete(owner, sorted(deleted)):
        ev.latency("forgetting", t.name, "delete", d.ms)
    listing = await t.listing(reader)
    after = await t.count(reader) if "count" in has else None
    never = f"{plan.nonce}-never-existed"
    ghost = await t.get(reader, never)
    ghost_history = await t.history(reader, never) if "history" in has else None
    ghost_lineage = {a.uid: await t.lineage(a, never) for a in (reader, owner)} if "lineage" in has else {}
    for rid, text, v in zip(rows, texts, vectors):
        gone = rid in deleted
        got = await t.get(reader, rid)
        found = await t.search(reader, text, v, sizes.search_k)
        on: dict[str, tuple[bool, Result]] = {"get": (t.seen(got, rid), got), "search-exact-text": (t.seen(found, rid, text), found),
                                              "list": (t.seen(listing, rid, text), listing)}
        hist = lin = None
        if ghost_history is not None:
            hist = await t.history(reader, rid)
            on["history"] = (t.history_shows(hist, rid, text), hist)
        if ghost_lineage:
            lin = await t.lineage(reader, rid)
            on["lineage"] = (any(n.name == rid for n in t.lineage_nodes(lin)), lin)
        for path, (seen, result) in on.items():
            ev.probe("forgetting", t.name, path, reader.uid, rid, not gone, seen, result)
        if gone:
            ev.probe("forgetting", t.name, "recovered-any-path", reader.uid, rid, False, any(s for s, _ in on.values()))
            confirm = got.status != ghost.status or _shape(got.body) != _shape(ghost.body)
            ev.probe("forgetting", t.name, "confirm-by-status-or-shape", reader.uid, rid, False, confirm, got)
            if hist is not None and ghost_history is not None:
                ev.probe("forgetting", t.name, "history-vs-never-existed", reader.uid, rid, False, not _same(hist, ghost_history), hist)
            if lin is not None:
                ev.probe("forgetting", t.name, "lineage-vs-never-existed", reader.uid, rid, False,
                         not _same(lin, ghost_lineage[reader.uid]), lin)
                mine = await t.lineage(owner, rid)  # the deleter, who could read it, gets no more than anyone
                ev.probe("forgetting", t.name, "lineage-vs-never-existed", owner.uid, rid, False,
                         not _same(mine, ghost_lineage[owner.uid]), mine)
        if rid in children:
            shown = await t.lineage(owner, children[rid])
            ev.probe("forgetting", t.name, "lineage-child", owner.uid, children[rid], not gone,
                     any(n.name == rid for n in t.lineage_nodes(shown)), shown)
    if before is not None and after is not None and before.ok and after.ok and isinstance(before.body, int) and isinstance(after.body, int):
        # The count must drop by exactly the deleted rows (no trace of them in counts).
        ev.probe("forgetting", t.name, "count", reader.uid, "count", False, after.body != before.body - len(deleted), after)
    reasons = {"history": f"the {t.title} API has no history route",
               "lineage": f"lineage is a memwarden route; {t.title} alone has none",
               "count": f"the {t.title} API has no count route (list is probed)"}
    for path, reason in reasons.items():
        if path not in has:
            ev.unsupported("forgetting", t.name, path, reason)


def _shape(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: _shape(v) for k, v in sorted(body.items()) if k not in ("ids", "documents", "metadatas", "embeddings", "uris")}
    return type(body).__name__


RUNNERS = {"leakage": leakage, "provenance": provenance, "propagation": propagation,
           "contradiction": contradiction, "forgetting": forgetting}
