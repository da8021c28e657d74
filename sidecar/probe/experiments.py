"""The five governance experiments. Each takes a `Plan`, a target and the embedder, and emits events.

Expectations come from the reference predicate (`plan.expected_read`), not from the target, so the
same probes measure a bare backend and the sidecar alike.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable

from sidecar.probe.plan import Agent, Plan, expected_read
from sidecar.probe.targets import ChromaTarget, Result, returned

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
    """Collects events (see `sidecar.probe.metrics`) and reports progress."""

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


async def leakage(plan: Plan, t: ChromaTarget, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Each fleet's owner writes an agent- and a fleet-scoped secret; every agent probes every secret."""
    secrets: list[tuple[str, str, str, Agent]] = []  # (row id, scope, text, owner)
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
            raise RuntimeError(f"{t.name}: owner write failed with {w.status}: {w.body}")

    async def probe(reader: Agent, secret: tuple[str, str, str, Agent], vector: list[float]) -> None:
        rid, scope, text, owner = secret
        expected = expected_read(reader, owner.tenant, owner.fleet, owner.uid, scope)
        got = await t.get(reader, ids=[rid])
        seen = returned(got, rid)
        ev.probe("leakage", t.name, "get", reader.uid, rid, expected, seen, got)
        if scope == "fleet" and reader.fleet != owner.fleet and reader.tenant == owner.tenant and reader.trust in (1, 2):
            ev.probe("leakage", t.name, f"get-xfleet-trust{reader.trust}", reader.uid, rid, expected, seen, got)
        found = await t.search(reader, vector, sizes.search_k)
        ev.probe("leakage", t.name, "search", reader.uid, rid, expected, returned(found, rid, text), found)

    await asyncio.gather(*(probe(r, s, v) for r in plan.agents for s, v in zip(secrets, vectors)))


async def propagation(plan: Plan, t: ChromaTarget, embed: Embed, ev: Events, sizes: Sizes) -> None:
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
        got = await t.get(reader, ids=[rid])
        expected = expected_read(reader, tenant, home, writer.uid, "fleet")
        ev.probe("propagation", t.name, "sibling-get" if reader.fleet == home else "foreign-get", reader.uid, rid,
                 expected, returned(got, rid), got)

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
            got = await t.get(siblings[0], ids=[rid])
            if returned(got, rid):
                ev.latency("propagation", t.name, "write_to_visible", (time.perf_counter() - acked) * 1000)
                break
            if time.perf_counter() > deadline:
                ev.probe("propagation", t.name, "window-timeout", siblings[0].uid, rid, True, False, got)
                break
            await asyncio.sleep(sizes.poll_interval_s)


async def contradiction(plan: Plan, t: ChromaTarget, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Pairs of contradicting facts on a single-valued predicate, near-identical wording.

    Both targets get the same facts (subject, ``pipeline_status``, paused → running): through the
    sidecar as the governed triple ``mw_subject``/``mw_predicate``/``mw_object`` (``pipeline_status`` is
    single-valued in the default ``policies/single_valued.txt``, so the newer fact supersedes the older),
    directly as the same values in plain metadata. Per pair the reader asks for the facts about
    (subject, predicate): the superseded fact must not be served (expected deny; a stale read is a
    leak) and the newest must be (expected allow). Detection rate = 1 − stale-read rate. Sequential
    pairs are also searched with the superseded fact's own embedding (``sequential-search``).
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
            got = await t.get(reader, where=t.fact_where(subject, predicate))
            ids_seen = set(got.body.get("ids") or []) if got.ok and isinstance(got.body, dict) else set()
            both = a.ok and b.ok
            if mode == "sequential":
                stale, newest = ids[0] in ids_seen, ids[1] in ids_seen
            else:  # either order may win; exactly one must be served
                stale, newest = len(ids_seen & set(ids)) > 1, len(ids_seen & set(ids)) >= 1
            for path in (mode, f"{mode}-both-admitted") if both else (mode,):
                ev.probe("contradiction", t.name, path, reader.uid, subject, False, stale, got)
                ev.probe("contradiction", t.name, f"{path}-newest", reader.uid, subject, True, newest, got)
            if mode == "sequential" and both:
                found = await t.search(reader, v_old, sizes.search_k)
                ev.probe("contradiction", t.name, "sequential-search", reader.uid, subject, False,
                         returned(found, ids[0], old_text), found)


async def provenance(plan: Plan, t: ChromaTarget, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Chains observation → hypothesis → mitigation → verification linked by ``derived_from``.

    Every fifth chain's third hop claims another writer in its metadata; the recorded writer must
    still be the real one. Walks each chain from the leaf by get-by-id, timing each hop.
    """
    tenant, fleet = plan.tenants[0], plan.fleets[0]
    writers = plan.writers(tenant, fleet)
    reader = plan.fleet_agents(tenant, fleet)[1]
    stages = ("observation", "hypothesis", "mitigation", "verification")
    for c in range(sizes.chains):
        truth: list[tuple[str, str]] = []  # (row id, real writer)
        parent = None
        texts = [_text(plan, f"chain{c}-{s}", f"{s} for incident {c}") for s in stages]
        for depth, (stage, text, v) in enumerate(zip(stages, texts, embed(texts))):
            author = writers[depth % len(writers)]
            rid = f"{plan.nonce}-chain{c}-{depth}"
            extra: dict[str, Any] = {"stage": stage}
            if parent:
                extra["derived_from"] = parent
            forged = plan.owner(tenant, plan.fleets[1]).uid if (c % 5 == 4 and depth == 2) else None
            w = await t.add(author, rid, text, v, "fleet", extra, claimed_writer=forged)
            ev.latency("provenance", t.name, "write", w.ms)
            truth.append((rid, author.uid))
            parent = rid
        # walk from the leaf
        walked: list[tuple[str, str | None]] = []
        current: str | None = truth[-1][0]
        while current and len(walked) < 10:
            got = await t.get(reader, ids=[current])
            ev.latency("provenance", t.name, "hop", got.ms)
            if not returned(got, current):
                break
            meta = (got.body.get("metadatas") or [None])[0] or {}
            walked.append((current, t.writer_of(meta)))
            current = meta.get("derived_from")
        walked.reverse()
        chain_id = f"chain{c}"
        ev.probe("provenance", t.name, "completeness", reader.uid, chain_id, True, [r for r, _ in walked] == [r for r, _ in truth])
        ev.probe("provenance", t.name, "depth", reader.uid, chain_id, True, len(walked) == len(truth))
        recorded = dict(walked)
        for rid, real in truth:
            ev.probe("provenance", t.name, "writer", reader.uid, rid, True, recorded.get(rid) == real)
    ev.unsupported("provenance", t.name, "lineage-endpoint", "no lineage route on this target yet; chains walked by get-by-id")


async def forgetting(plan: Plan, t: ChromaTarget, embed: Embed, ev: Events, sizes: Sizes) -> None:
    """Delete a sample, then probe get, search by exact text, list, count and status-code confirmation."""
    tenant, fleet = plan.tenants[0], plan.fleets[0]
    owner = plan.owner(tenant, fleet)
    reader = plan.fleet_agents(tenant, plan.fleets[1])[0]
    rows = [f"{plan.nonce}-forget-{i}" for i in range(sizes.forget_rows)]
    texts = [_text(plan, rid, f"tenant-wide note {i} on the billing migration") for i, rid in enumerate(rows)]
    vectors = embed(texts)
    for rid, text, v in zip(rows, texts, vectors):
        await t.add(owner, rid, text, v, "tenant")
    before = await t.count(reader)
    deleted = set(plan.rng("forget").sample(rows, sizes.forget_deleted))
    d = await t.delete(owner, sorted(deleted))
    ev.latency("forgetting", t.name, "delete", d.ms)
    listing = await t.get(reader)
    after = await t.count(reader)
    never = f"{plan.nonce}-never-existed"
    ghost = await t.get(reader, ids=[never])
    for rid, text, v in zip(rows, texts, vectors):
        gone = rid in deleted
        got = await t.get(reader, ids=[rid])
        found = await t.search(reader, v, sizes.search_k)
        on = {"get": returned(got, rid), "search-exact-text": returned(found, rid, text), "list": returned(listing, rid, text)}
        for path, seen in on.items():
            ev.probe("forgetting", t.name, path, reader.uid, rid, not gone, seen, got if path == "get" else found)
        if gone:
            ev.probe("forgetting", t.name, "recovered-any-path", reader.uid, rid, False, any(on.values()))
            confirm = got.status != ghost.status or _shape(got.body) != _shape(ghost.body)
            ev.probe("forgetting", t.name, "confirm-by-status-or-shape", reader.uid, rid, False, confirm, got)
    if before.ok and after.ok and isinstance(before.body, int) and isinstance(after.body, int):
        # The count must drop by exactly the deleted rows (no trace of them in counts).
        ev.probe("forgetting", t.name, "count", reader.uid, "count", False, after.body != before.body - len(deleted), after)
    for path in ("history", "lineage"):
        ev.unsupported("forgetting", t.name, path, "the Chroma API has no such route")


def _shape(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: _shape(v) for k, v in sorted(body.items()) if k not in ("ids", "documents", "metadatas", "embeddings", "uris")}
    return type(body).__name__


RUNNERS = {"leakage": leakage, "provenance": provenance, "propagation": propagation,
           "contradiction": contradiction, "forgetting": forgetting}
