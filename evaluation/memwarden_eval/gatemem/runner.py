"""Replay GateMem through a real backend three ways at once and score every checkpoint.

Per episode, turn by turn, in order:

- (a) **Chroma alone**: the turn is added to a plain collection; a checkpoint queries top-k over everything.
- (b) **memwarden, ingest-time labels**: `labels.Labeller` plans the turn from the `Episode` alone; its
  deletions and re-scopings are executed through the sidecar (tenant admin key: the shared assistant's service
  identity acting on the request), then the turn is written **as its speaker** (the speaker's agent key, whose
  Cedar roles are the speaker's GateMem role) as a ``restricted`` memory: ``mw_readers`` its circle,
  ``mw_labels`` its content categories. The sidecar, running the domain's policy set (``policies/<domain>``),
  decides every read: the circle through ``readers``, the domain's role × category rules through
  ``principal.roles`` and ``resource.labels``. The runner also evaluates each row offline with the same engine
  and entity model (`sidecar.policy`, `sidecar.governance`) to name, in the cause analysis, the rule that
  withheld it, and counts any row the sidecar served that this offline decision denies (``b_offline_disagreements``).
- (c) **memwarden, labels from the hidden annotations** (`oracle`): every turn readable by every principal,
  re-scoped and deleted at each checkpoint as its annotation says. An upper bound, marked as such.

After the turn a checkpoint's ``as_of_turn_id`` names, the checkpoint is asked in each variant **as its
asker** (the asker's key; none for Chroma alone), top-max(k) by the asker's query embedding; smaller k are
prefixes (a filtered top-k is a prefix of a filtered top-K, since the sidecar refills in rank order).

Embeddings: all-MiniLM-L6-v2 (`memwarden_eval.embeddings`), normalised, 384-d. One sidecar per domain (its policy
set), one Chroma for the run, both on 127.0.0.1.

``backend="mem0"``: the same three variants over a Mem0 REST backend (our `memwarden_eval.mem0_server`: the real
`mem0ai` ``Memory``, Qdrant local, the same all-MiniLM-L6-v2, embedded by Mem0 itself) and a sidecar with
``MEMWARDEN_BACKEND=mem0``: (a) writes each turn straight to Mem0 (``agent_id`` the speaker) and searches it
with Mem0's admin key; (b) and (c) write through the Mem0 profile as the speaker, re-scope with ``PUT
/memories/{id}`` metadata (``mw_scope``/``mw_readers``) and delete with ``DELETE /memories/{id}`` (tenant admin
key), and search as the asker. A checkpoint is Mem0's ``POST /search`` of its query text (Mem0's own ranking,
``threshold=0``), ``top_k`` = max(k), confined to the variant's ``run_id``; smaller k are prefixes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from memwarden_eval.gatemem import labels as labelling
from memwarden_eval.gatemem import oracle, rules
from memwarden_eval.gatemem.client import Collection, Mem0Store, Timings, create_collection
from memwarden_eval.gatemem.data import Annotation, Annotations, DomainData, Episode, Probe, load_domain
from memwarden_eval.gatemem.measures import Score, pattern_in, score
from sidecar.governance import Row, agent_entity, agent_id, fleet_entity
from memwarden_eval.harness import Server, start_chroma, start_mem0, start_sidecar
from sidecar.ledger import SQLiteLedger
from sidecar.policy import CedarRequest, PolicyEngine

POLICIES = Path(__file__).resolve().parent / "policies"
FLEET = "ep"
VARIANTS = {
    "a": "Chroma alone (no memwarden)",
    "b": "memwarden, ingest-time labels",
    "c": "memwarden, labels from hidden annotations (upper bound)",
}
BACKENDS = {"chroma": "Chroma", "mem0": "Mem0"}


def variant_names(backend: str = "chroma") -> dict[str, str]:
    """The variants' descriptions for a run on `backend` (chroma: `VARIANTS` as they are)."""
    return {**VARIANTS, "a": f"{BACKENDS.get(backend, backend)} alone (no memwarden)"}


@dataclass
class Config:
    """One run. `ks` ascending; `cause_k` is the k of the cause analysis; `episodes` limits episodes per domain."""

    data_dir: Path
    out_dir: Path
    domains: tuple[str, ...]
    ks: tuple[int, ...] = (5, 10, 20)
    jobs: int = 2
    cause_k: int = 10
    episodes: int | None = None
    backend: str = "chroma"
    # backend="mem0": a running Mem0 REST backend and its X-API-Key; None: the run starts memwarden_eval.mem0_server
    mem0_url: str | None = None
    mem0_key: str | None = None
    # backend="mem0": every memory of the run carries run_id "<variant tenant>-<run_tag>" (None: a random tag)
    run_tag: str | None = None


@dataclass
class Record:
    """One checkpoint in one variant: what came back (row ids, nearest first) and its scores per k."""

    domain: str
    episode_id: str
    checkpoint_id: str
    variant: str
    query_type: str
    attack_type: str | None
    asker_role: str
    rows: list[str]
    scores: dict[int, Score]
    causes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EpisodeResult:
    records: list[Record]
    stats: dict[str, int]
    turns: int
    wall_s: float


_EMBED_LOCK = threading.Lock()


def _no_embed(texts: list[str]) -> list[Any]:
    """Mem0 embeds what it stores and what it is asked: the runner computes no embedding."""
    return [None] * len(texts)


def _embed(texts: list[str]) -> list[list[float]]:
    from memwarden_eval.embeddings import embed

    with _EMBED_LOCK:
        return embed(texts)


class EpisodeReplay:
    """One episode through the three variants. Ingest (variant b) sees only `episode`; the hidden annotations
    are used by the oracle (variant c) and by scoring."""

    def __init__(self, index: int, episode: Episode, probes: list[Probe], annotations: Annotations,
                 engine: PolicyEngine, ledger: SQLiteLedger, chroma: httpx.Client, sidecar: httpx.Client,
                 timings: Timings, cfg: Config, embed: Callable[[list[str]], list[list[float]]] = _embed,
                 run_tag: str = "") -> None:
        self.i, self.episode, self.probes, self.annotations = index, episode, probes, annotations
        self.engine, self.ledger, self.cfg, self.embed = engine, ledger, cfg, embed
        short = f"{episode.domain[:3]}{index:03d}"
        self.tenant = {v: f"gm{v}-{short}" for v in VARIANTS}
        self.roles = {p.principal_id: rules.principal_roles(p) for p in episode.principals}
        self.everyone = frozenset(self.roles)
        self.admin: dict[str, str] = {}
        self.keys: dict[str, dict[str, str]] = {}
        for v in ("b", "c"):
            self.admin[v] = ledger.create_key("admin", self.tenant[v], None, None, 0)[1]
            self.keys[v] = {pid: ledger.create_key("agent", self.tenant[v], FLEET, pid, 1,
                                                   roles=self.roles[pid] if v == "b" else ())[1] for pid in self.roles}
        self.coll: dict[str, Collection | Mem0Store]
        if cfg.backend == "mem0":  # `chroma` is then the client of Mem0 itself
            self.coll = {v: Mem0Store(http, f"{self.tenant[v]}-{run_tag}" if run_tag else self.tenant[v], timings, label)
                         for v, http, label in (("a", chroma, "direct"), ("b", sidecar, "sidecar"), ("c", sidecar, "sidecar-c"))}
        else:
            self.coll = {
                "a": create_collection(chroma, self.tenant["a"], None, timings, "direct"),
                "b": create_collection(sidecar, self.tenant["b"], self.admin["b"], timings, "sidecar"),
                "c": create_collection(sidecar, self.tenant["c"], self.admin["c"], timings, "sidecar-c"),
            }
        # Local views of what each variant holds (the writer knows what it wrote).
        self.texts_a: dict[str, str] = {}
        self.b_rows: dict[str, labelling.RowPlan] = {}
        self.b_readers: dict[str, frozenset[str]] = {}
        self.b_denied: dict[str, dict[str, tuple[str, ...]]] = {}
        self.b_deleted: dict[str, tuple[str, ...]] = {}
        self.c_texts: dict[str, str] = {}
        self.c_readers: dict[str, set[str]] = {}
        self.c_owner: dict[str, str] = {}
        self.stats: dict[str, int] = defaultdict(int)
        self.labeller = labelling.Labeller(episode)

    # ---- (b): readers decided by the domain's Cedar policy set ----------------------------------------

    def _uid(self, pid: str) -> str:
        return agent_id(self.tenant["b"], FLEET, pid)

    def decide_readers(self, row: labelling.RowPlan, circle: frozenset[str]) -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
        """The principals of `circle` Cedar permits to read `row` (labels, owner) as a restricted memory whose
        readers are `circle`; and, for each denied one, the determining forbid ids."""
        members = sorted(circle)
        mrow = Row(backend=self.coll["b"].backend, collection=self.coll["b"].collection_id, row_id=row.row_id, tenant=self.tenant["b"],
                   fleet=FLEET, owner=self._uid(row.owner), scope="restricted", writer=self._uid(row.owner), created_at=0,
                   readers=tuple(self._uid(p) for p in members), labels=tuple(sorted(row.labels)))
        entities = [mrow.entity(), fleet_entity(self.tenant["b"], FLEET),
                    {"uid": {"type": "Tenant", "id": self.tenant["b"]}, "attrs": {}, "parents": []}]
        entities += [agent_entity(self.tenant["b"], FLEET, p, 1, self.roles.get(p, ())) for p in sorted(set(members) | {row.owner})]
        decisions = self.engine.decide([CedarRequest(("Agent", self._uid(p)), "read", mrow.uid) for p in members], entities)
        allowed = frozenset(p for p, d in zip(members, decisions) if d.allowed)
        return allowed, {p: d.policies for p, d in zip(members, decisions) if not d.allowed}

    @staticmethod
    def _restricted(readers: frozenset[str] | set[str]) -> dict[str, Any]:
        return {"mw_scope": "restricted", "mw_readers": ",".join(f"{FLEET}/{p}" for p in sorted(readers))}

    def _b_meta(self, row: labelling.RowPlan) -> dict[str, Any]:
        return {**self._restricted(row.circle), "mw_labels": ",".join(sorted(row.labels))}

    def _write_b(self, row: labelling.RowPlan, emb: list[float]) -> None:
        readers, denied = self.decide_readers(row, row.circle)
        ok = self.coll["b"].add(self.keys["b"][row.owner], row.row_id, emb, row.text,
                                {**self._b_meta(row), "turn_id": row.turn_id})
        if not ok:
            self.stats["b_refused_forgotten_content"] += 1
            return
        self.b_rows[row.row_id], self.b_readers[row.row_id], self.b_denied[row.row_id] = row, readers, denied

    def _ingest_b(self, plan: labelling.TurnPlan, emb: list[float]) -> None:
        for d in plan.deletions:
            live = [r for r in d.row_ids if r in self.b_rows]
            self.coll["b"].delete(self.admin["b"], live)
            for r in live:
                del self.b_rows[r]
                self.b_deleted[r] = d.targets
            if d.rewrites:
                embs = self.embed([w.text for w in d.rewrites])
                for w, e in zip(d.rewrites, embs):
                    self._write_b(w, e)
        for ch in plan.access_changes:
            ids, metas = [], []
            for rid, circle in ch.rows:
                if rid not in self.b_rows or not circle:
                    continue
                row = self.b_rows[rid]
                if circle == row.circle:
                    continue
                self.b_rows[rid] = row = labelling.RowPlan(row.row_id, row.turn_id, row.owner, row.text, row.labels, row.subjects, circle)
                self.b_readers[rid], self.b_denied[rid] = self.decide_readers(row, circle)
                ids.append(rid)
                metas.append(self._restricted(circle))
            self.coll["b"].update_metadata(self.admin["b"], ids, metas)
        row = plan.row
        if row is None:
            return
        if row.text != plan.turn.text:
            emb = self.embed([row.text])[0]
        self._write_b(row, emb)

    # ---- (c): the annotation oracle --------------------------------------------------------------------

    def _write_c(self, row_id: str, owner: str, text: str, emb: list[float], readers: set[str]) -> None:
        if self.coll["c"].add(self.keys["c"][owner], row_id, emb, text, {**self._restricted(readers), "turn_id": row_id.split("~")[0]}):
            self.c_texts[row_id], self.c_readers[row_id], self.c_owner[row_id] = text, set(readers), owner
        else:
            self.stats["c_refused_forgotten_content"] += 1

    def _oracle_c(self, probe: Probe, ann: Annotation) -> None:
        ch = oracle.changes_for(probe, ann, self.c_texts, self.c_readers)
        coll, key = self.coll["c"], self.admin["c"]
        if ch.delete:
            coll.delete(key, list(ch.delete))
            rewrites = []
            for r in ch.delete:
                text, readers, owner = self.c_texts.pop(r), self.c_readers.pop(r), self.c_owner.pop(r)
                rewrites.append((f"{r.split('~')[0]}~{probe.checkpoint_id[-7:]}", owner, oracle.without(text, ann.leak_targets), readers))
            for (rid, owner, text, readers), e in zip(rewrites, self.embed([w[2] for w in rewrites])):
                self._write_c(rid, owner, text, e, readers)
        ids, metas = [], []
        for r in ch.grant:
            self.c_readers[r].add(ch.principal)
            ids.append(r)
            metas.append(self._restricted(self.c_readers[r]))
        for r in ch.revoke:
            self.c_readers[r].discard(ch.principal)
            if not self.c_readers[r]:  # nobody may read it: delete rather than leave an empty reader list
                coll.delete(key, [r])
                del self.c_texts[r], self.c_readers[r], self.c_owner[r]
                continue
            ids.append(r)
            metas.append(self._restricted(self.c_readers[r]))
        coll.update_metadata(key, ids, metas)

    # ---- cause analysis (b) ------------------------------------------------------------------------------

    def _b_state(self, turn_id: str, asker: str, pattern: str) -> str:
        """Why turn `turn_id`, whose text holds `pattern`, did not give it to `asker` in variant b."""
        live = [r for r in self.b_rows.values() if r.turn_id == turn_id]
        if not live:
            return "deleted by a deletion target" if turn_id in self.b_deleted else "refused or not written"
        states = []
        for row in live:
            if not pattern_in(pattern, row.text):
                states.append("redacted (deletion target)")
            elif asker not in row.circle:
                states.append("asker outside the row's circle")
            elif asker not in self.b_readers[row.row_id]:
                states.append("forbidden by " + ",".join(self.b_denied.get(row.row_id, {}).get(asker, ()) or ("no permit",)))
            else:
                states.append("readable (ranked below k)")
        return min(states, key=lambda x: (not x.startswith("readable"), x))

    def _why_readable(self, rid: str, asker: str, role: str) -> str:
        row = self.b_rows.get(rid)
        if row is None:
            return "row deleted after it was retrieved"
        if row.owner == asker:
            return "asker said it"
        if row.labels == {rules.GENERAL}:
            return "no category detected"
        if asker in self.b_readers[rid] and not self.b_denied.get(rid):
            return "categories allowed to every circle member"
        return "categories detected, allowed for the role"

    def causes(self, probe: Probe, ann: Annotation, got: list[tuple[str, str]], c_got: list[tuple[str, str]]) -> list[dict[str, Any]]:
        k = self.cfg.cause_k
        asker, role = probe.asker.principal_id, probe.asker.role
        rows_b = got[:k]
        out: list[dict[str, Any]] = []
        if ann.query_type == "privacy":
            for p in dict.fromkeys(ann.not_include + ann.leak_targets):
                for rid, doc in rows_b:
                    if pattern_in(p, doc):
                        out.append({"kind": "leak", "pattern": p, "row": rid, "cause": self._why_readable(rid, asker, role),
                                    "labels": sorted(self.b_rows[rid].labels) if rid in self.b_rows else []})
        elif ann.query_type == "safety":
            forgotten = [t.lower() for t in self.labeller.forgotten]
            for p in ann.leak_targets:
                for rid, doc in rows_b:
                    if pattern_in(p, doc):
                        if any(t in p.lower() or p.lower() in t for t in forgotten):
                            cause = "target extracted, a variant survived"
                        elif self.labeller.stats.get("deletion_requests_without_target"):
                            cause = "deletion request without an extractable target"
                        else:
                            cause = "no deletion request recognised"
                        out.append({"kind": "forget", "pattern": p, "row": rid, "cause": cause})
        else:
            c_docs = [d for _, d in c_got[:k]]
            b_docs = [d for _, d in rows_b]
            for p in ann.include:
                if any(pattern_in(p, d) for d in b_docs) or not any(pattern_in(p, d) for d in c_docs):
                    continue
                states = sorted({self._b_state(r, asker, p) for r, t in self.texts_a.items() if pattern_in(p, t)})
                out.append({"kind": "missing", "pattern": p, "states": states})
        return out

    # ---- the replay -------------------------------------------------------------------------------------

    def run(self) -> EpisodeResult:
        t0 = time.perf_counter()
        ep = self.episode
        at: dict[str, list[Probe]] = defaultdict(list)
        for p in self.probes:
            at[p.as_of_turn_id].append(p)
        embs = self.embed([t.text for t in ep.turns] + [p.query_text for p in self.probes])
        turn_emb = dict(zip((t.turn_id for t in ep.turns), embs))
        query_emb = dict(zip((p.checkpoint_id for p in self.probes), embs[len(ep.turns):]))
        kmax = max(self.cfg.ks)
        records: list[Record] = []
        for turn in ep.turns:
            emb = turn_emb[turn.turn_id]
            speaker = turn.speaker.principal_id
            self.coll["a"].add(None, turn.turn_id, emb, turn.text, {"turn_id": turn.turn_id, "speaker": speaker})
            self.texts_a[turn.turn_id] = turn.text
            self._ingest_b(self.labeller.plan(turn), emb)
            self._write_c(turn.turn_id, speaker, turn.text, emb, set(self.everyone))
            for probe in at.get(turn.turn_id, ()):
                ann = self.annotations[probe.checkpoint_id]
                self._oracle_c(probe, ann)
                asker = probe.asker.principal_id
                qe, qt = query_emb[probe.checkpoint_id], probe.query_text
                got = {
                    "a": self.coll["a"].query(None, qe, kmax, qt),
                    "b": self.coll["b"].query(self.keys["b"][asker], qe, kmax, qt),
                    "c": self.coll["c"].query(self.keys["c"][asker], qe, kmax, qt),
                }
                self.stats["b_offline_disagreements"] += sum(
                    1 for rid, _ in got["b"] if asker not in self.b_readers.get(rid, frozenset()))
                for v, rows in got.items():
                    rec = Record(ep.domain, ep.episode_id, probe.checkpoint_id, v, ann.query_type, ann.attack_type,
                                 probe.asker.role, [r for r, _ in rows],
                                 {k: score(ann, [d for _, d in rows[:k]], k) for k in self.cfg.ks})
                    if v == "b":
                        rec.causes = self.causes(probe, ann, rows, got["c"])
                    records.append(rec)
        return EpisodeResult(records, {**self.labeller.stats, **self.stats}, len(ep.turns), time.perf_counter() - t0)


@dataclass
class DomainResult:
    domain: str
    records: list[Record]
    stats: dict[str, int]
    turns: int
    episodes: int
    checkpoints: int
    wall_s: float


def run_domain(cfg: Config, data: DomainData, chroma: Server | str, work: Path, timings: Timings,
               progress: Callable[[str], None] = lambda s: None, run_tag: str = "") -> DomainResult:
    """Start a sidecar with the domain's policy set in front of the run's backend (`chroma`: the Chroma server,
    or with ``cfg.backend == "mem0"`` the Mem0 server or its URL, `cfg.mem0_key` its key) and replay every
    episode."""
    t0 = time.perf_counter()
    policies = POLICIES / data.domain
    if not (policies / f"{data.domain}.cedar").is_file():
        raise FileNotFoundError(f"{policies}: the benchmark's policy sets are read from a checkout (editable install)")
    engine = PolicyEngine.load(policies)
    ledger_path = work / f"ledger-{data.domain}.db"
    url = chroma if isinstance(chroma, str) else chroma.url
    env = {"MEMWARDEN_LOG_LEVEL": "warning"}
    direct_headers: dict[str, str] = {}
    embed: Callable[[list[str]], list[Any]] = _embed
    if cfg.backend == "mem0":
        if not cfg.mem0_key:
            raise ValueError("backend mem0: cfg.mem0_key (Mem0's X-API-Key) is required")
        env.update({"MEMWARDEN_BACKEND": "mem0", "MEMWARDEN_BACKEND_AUTH_HEADER": "X-API-Key",
                    "MEMWARDEN_BACKEND_TOKEN": cfg.mem0_key})
        direct_headers = {"X-API-Key": cfg.mem0_key}
        embed = _no_embed
    sidecar = start_sidecar(url, ledger_path, policies, extra_env=env)
    ledger = SQLiteLedger(ledger_path)
    episodes = list(data.episodes[: cfg.episodes] if cfg.episodes else data.episodes)
    by_ep: dict[str, list[Probe]] = defaultdict(list)
    for p in data.probes:
        by_ep[p.episode_id].append(p)
    results: list[EpisodeResult] = []
    limits = httpx.Limits(max_connections=4 * cfg.jobs)
    try:
        with httpx.Client(base_url=url, timeout=120, trust_env=False, limits=limits, headers=direct_headers) as direct, \
                httpx.Client(base_url=sidecar.url, timeout=120, trust_env=False, limits=limits) as through:
            def one(item: tuple[int, Episode]) -> EpisodeResult:
                i, ep = item
                r = EpisodeReplay(i, ep, by_ep[ep.episode_id], data.annotations, engine, ledger, direct, through,
                                  timings, cfg, embed, run_tag).run()
                progress(f"{data.domain} {ep.episode_id}: {r.turns} turns, {len(r.records) // 3} checkpoints, {r.wall_s:.0f} s")
                return r
            with ThreadPoolExecutor(max_workers=max(1, cfg.jobs)) as pool:
                results = list(pool.map(one, enumerate(episodes)))
    finally:
        ledger.close()
        sidecar.stop()
    stats: dict[str, int] = defaultdict(int)
    for r in results:
        for k, v in r.stats.items():
            stats[k] += v
    records = [rec for r in results for rec in r.records]
    return DomainResult(data.domain, records, dict(stats), sum(r.turns for r in results), len(episodes),
                        len(records) // 3, time.perf_counter() - t0)


def run(cfg: Config, progress: Callable[[str], None] = lambda s: None,
        on_domain: Callable[[list[DomainResult], Timings, float], None] | None = None) -> tuple[list[DomainResult], Timings, float]:
    """The whole benchmark: one backend for the run (a Chroma it starts; for ``backend="mem0"`` the Mem0 REST
    backend at `cfg.mem0_url`, or else one it starts, memwarden_eval.mem0_server), the domains one after another
    (`on_domain` is called with the results so far after each). Returns the domain results, the request
    timings and the wall time in s. Raises ValueError for an unknown backend."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"backend {cfg.backend!r}: choose from {', '.join(BACKENDS)}")
    t0 = time.perf_counter()
    work = cfg.out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    server: Server | None = None
    run_tag = ""
    if cfg.backend == "mem0":
        import secrets

        run_tag = cfg.run_tag or secrets.token_hex(3)  # a Mem0 backend may hold earlier runs' memories: confine to this run's
        if cfg.mem0_url is None:
            cfg = dataclasses.replace(cfg, mem0_key=cfg.mem0_key or "gatemem-" + secrets.token_hex(8))
            server = start_mem0(work / "mem0", str(cfg.mem0_key))
        backend: Server | str = server or str(cfg.mem0_url)
    else:
        backend = server = start_chroma(work / "chroma")
    timings = Timings()
    out: list[DomainResult] = []
    try:
        for domain in cfg.domains:
            out.append(run_domain(cfg, load_domain(cfg.data_dir, domain), backend, work, timings, progress, run_tag))
            if on_domain is not None:
                on_domain(out, timings, time.perf_counter() - t0)
    finally:
        if server is not None:
            server.stop()
    return out, timings, time.perf_counter() - t0
