"""HTTP targets for the probe: a memory backend directly (baseline) or through the sidecar.

Two backends, each reachable two ways:

- `ChromaTarget` speaks Chroma's v2 API (one collection per tenant through the sidecar; one shared
  collection directly).
- `Mem0Target` speaks the self-hosted Mem0 REST API (``POST /memories`` with ``infer=false``,
  ``GET /memories/{id}``, ``GET /memories``, ``POST /search``, ``GET /memories/{id}/history``,
  ``DELETE /memories/{id}``). All of a run's memories live under one Mem0 ``user_id`` per target (the
  application's shared memory space); every add names its agent (directly as ``agent_id``, through the
  sidecar the sidecar sets it).

A direct target models an application that keeps governance hints in plain metadata (``scope``,
``owner``, ``writer``, ``derived_from``, a fact's ``subject``/``predicate``/``object``) it cannot enforce;
a sidecar target requests ``mw_scope``, names parents in ``mw_derived_from``, states facts as the
governed triple ``mw_subject``/``mw_predicate``/``mw_object`` (supersession), reads the sidecar-stamped
``mw_writer`` and asks the sidecar's lineage endpoint (``GET /_memwarden/memories/{id}/lineage``).

Experiments name rows by *plan names*; a target maps them to its native ids (Chroma: the name itself;
Mem0: the id Mem0 assigned, or for a name never written a UUID no Mem0 server issues). Results keep the
raw status and body; `seen`, `names_in`, `metadata`, `lineage_nodes` read them.

`supports` names the optional paths a target serves: ``count`` (Chroma), ``history`` (Mem0),
``lineage`` (the sidecar). Requests share one async client with a concurrency cap and a rate limit;
retries only on transport errors, 429 and 5xx (3 attempts).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import httpx

from memwarden_eval.probe.plan import Agent

RETRY_STATUSES = {429, 500, 502, 503, 504}
LINEAGE = "/_memwarden/memories/{id}/lineage"


@dataclass
class Result:
    status: int
    ms: float
    body: Any = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class LineageNode:
    """One node of a lineage answer: `name` is the plan name (None for a redacted placeholder)."""

    name: str | None
    depth: int
    writer: str | None
    redacted: bool


class Target(ABC):
    """Shared HTTP machinery and the interface the experiments use. `name` is "direct" or "sidecar";
    `backend` is "chroma" or "mem0"."""

    backend = "?"
    title = "?"  # the backend as written in reports

    def __init__(self, name: str, base_url: str, keys: dict[str, str] | None = None, concurrency: int = 8,
                 rate_per_s: float = 500.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if name not in ("direct", "sidecar"):
            raise ValueError("a target is 'direct' or 'sidecar'")
        self.name = name
        self.base_url = base_url
        self.keys = dict(keys or {})
        self.concurrency = concurrency
        self.rate_per_s = rate_per_s
        self._client = httpx.AsyncClient(base_url=base_url, timeout=60.0, trust_env=False, transport=transport,
                                         limits=httpx.Limits(max_connections=concurrency))
        self._sem = asyncio.Semaphore(concurrency)
        self._next = 0.0
        self._lock = asyncio.Lock()
        self._native: dict[str, str] = {}
        self._names: dict[str, str] = {}

    @property
    def governed(self) -> bool:
        return self.name == "sidecar"

    @property
    def supports(self) -> frozenset[str]:
        return frozenset({"lineage"}) if self.governed else frozenset()

    @property
    def label(self) -> str:
        return f"{self.name} {self.title}"

    async def close(self) -> None:
        await self._client.aclose()

    # -- plumbing ----------------------------------------------------------------------------
    async def _pace(self) -> None:
        async with self._lock:
            now = time.monotonic()
            wait = self._next - now
            self._next = max(now, self._next) + 1.0 / self.rate_per_s
        if wait > 0:
            await asyncio.sleep(wait)

    def _headers(self, agent: Agent) -> dict[str, str]:
        return {"X-API-Key": self.keys[agent.uid]} if self.governed else {}

    async def request(self, agent: Agent, method: str, path: str, body: Any = None,
                      params: dict[str, str] | None = None) -> Result:
        headers = self._headers(agent)
        async with self._sem:
            for attempt in range(3):
                await self._pace()
                t0 = time.perf_counter()
                try:
                    r = await self._client.request(method, path, json=body, params=params, headers=headers)
                except httpx.TransportError:
                    if attempt == 2:
                        return Result(599, (time.perf_counter() - t0) * 1000)
                    await asyncio.sleep(0.05 * 2 ** attempt)
                    continue
                ms = (time.perf_counter() - t0) * 1000
                if r.status_code in RETRY_STATUSES and attempt < 2:
                    await asyncio.sleep(0.05 * 2 ** attempt)
                    continue
                try:
                    payload = r.json() if r.content else None
                except ValueError:
                    payload = None
                return Result(r.status_code, ms, payload)
        raise AssertionError("unreachable")

    # -- names ---------------------------------------------------------------------------------
    def native(self, name: str) -> str:
        """The target's id for plan name `name` (an id no row has when `name` was never written)."""
        return self._native.get(name, name)

    def name_of(self, native: str) -> str:
        return self._names.get(native, native)

    def _remember(self, name: str, native: str) -> None:
        self._native[name] = native
        self._names[native] = name

    # -- operations (per backend; count, history and lineage only where `supports` names them) --
    @abstractmethod
    async def add(self, agent: Agent, name: str, text: str, embedding: list[float], scope: str,
                  extra: dict[str, Any] | None = None, claimed_writer: str | None = None,
                  parents: Sequence[str] = ()) -> Result:
        ...

    @abstractmethod
    async def get(self, agent: Agent, name: str) -> Result:
        ...

    @abstractmethod
    async def search(self, agent: Agent, text: str, embedding: list[float], k: int) -> Result:
        ...

    @abstractmethod
    async def listing(self, agent: Agent) -> Result:
        ...

    async def count(self, agent: Agent) -> Result:
        raise NotImplementedError(f"{self.label} has no count")

    async def history(self, agent: Agent, name: str) -> Result:
        raise NotImplementedError(f"{self.label} has no history")

    @abstractmethod
    async def delete(self, agent: Agent, names: list[str]) -> list[Result]:
        ...

    @abstractmethod
    async def facts(self, agent: Agent, subject: str, predicate: str) -> Result:
        """The rows stating facts about (subject, predicate), written with `fact`."""
        ...

    def fact(self, subject: str, predicate: str, obj: str) -> dict[str, str]:
        """Metadata stating the fact (subject, predicate, object): the governed triple through the sidecar
        (a single-valued predicate supersedes the current fact), the same values as plain keys directly."""
        prefix = "mw_" if self.governed else ""
        return {f"{prefix}subject": subject, f"{prefix}predicate": predicate, f"{prefix}object": obj}

    @abstractmethod
    def seen(self, result: Result, name: str, text: str | None = None) -> bool:
        """True when row `name` (or `text`, under any id) is in a get/search/list answer."""
        ...

    @abstractmethod
    def names_in(self, result: Result) -> set[str]:
        """Plan names of the rows in a get/search/list answer."""
        ...

    @abstractmethod
    def metadata(self, result: Result, name: str) -> dict[str, Any] | None:
        """The metadata of row `name` in a get answer, or None."""
        ...

    def history_shows(self, result: Result, name: str, text: str) -> bool:
        """True when a history answer reveals row `name` (an entry for it, or its text)."""
        return False

    # -- provenance ----------------------------------------------------------------------------
    def writer_of(self, metadata: dict[str, Any] | None) -> str | None:
        """The writer the target records for a row (stamped by the sidecar; client-claimed directly)."""
        if not metadata:
            return None
        value = metadata.get("mw_writer") if self.governed else metadata.get("writer")
        return value if isinstance(value, str) else None

    def parent_of(self, metadata: dict[str, Any] | None) -> str | None:
        """The (first) parent named in a row's metadata, as a plan name."""
        if not metadata:
            return None
        value = metadata.get("mw_derived_from" if self.governed else "derived_from")
        if not isinstance(value, str) or not value:
            return None
        return self.name_of(value.split(",")[0].strip())

    def _provenance_meta(self, agent: Agent, scope: str, extra: dict[str, Any] | None, claimed_writer: str | None,
                         parents: Sequence[str]) -> dict[str, Any]:
        meta: dict[str, Any] = dict(extra or {})
        natives = ",".join(self.native(p) for p in parents)
        if self.governed:
            meta["mw_scope"] = scope
            if natives:
                meta["mw_derived_from"] = natives
            if claimed_writer:
                meta["writer"] = claimed_writer  # a plain claim; the sidecar's mw_writer is what counts
        else:
            meta.update({"scope": scope, "owner": agent.uid, "fleet": agent.fleet, "tenant": agent.tenant,
                         "writer": claimed_writer or agent.uid})
            if natives:
                meta["derived_from"] = natives
        return meta

    def _lineage_params(self, agent: Agent) -> dict[str, str]:
        return {}

    async def lineage(self, agent: Agent, name: str) -> Result:
        """The sidecar's ``GET /_memwarden/memories/{id}/lineage`` for row `name`."""
        if "lineage" not in self.supports:
            raise NotImplementedError(f"{self.label} has no lineage route")
        return await self.request(agent, "GET", LINEAGE.format(id=self.native(name)), params=self._lineage_params(agent))

    def lineage_nodes(self, result: Result) -> list[LineageNode]:
        """The nodes of a 200 lineage answer (empty otherwise), ids mapped to plan names."""
        body = result.body
        if not result.ok or not isinstance(body, dict) or not isinstance(body.get("nodes"), list):
            return []
        out = []
        for n in body["nodes"]:
            if not isinstance(n, dict):
                continue
            rid = n.get("id")
            writer = n.get("writer")
            out.append(LineageNode(self.name_of(rid) if isinstance(rid, str) else None, int(n.get("depth", -1)),
                                   writer if isinstance(writer, str) else None, bool(n.get("redacted"))))
        return out


class ChromaTarget(Target):
    """`collections` maps tenant → (chroma tenant, database, collection id)."""

    backend = "chroma"
    title = "Chroma"

    def __init__(self, name: str, base_url: str, collections: dict[str, tuple[str, str, str]],
                 keys: dict[str, str] | None = None, concurrency: int = 8, rate_per_s: float = 500.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(name, base_url, keys, concurrency, rate_per_s, transport)
        self.collections = collections

    @property
    def supports(self) -> frozenset[str]:
        return super().supports | {"count"}

    async def call(self, agent: Agent, method: str, op: str, body: Any = None) -> Result:
        chroma_tenant, database, cid = self.collections[agent.tenant]
        return await self.request(agent, method, f"/api/v2/tenants/{chroma_tenant}/databases/{database}/collections/{cid}/{op}", body)

    def _lineage_params(self, agent: Agent) -> dict[str, str]:
        return {"collection": self.collections[agent.tenant][2]}

    async def add(self, agent: Agent, name: str, text: str, embedding: list[float], scope: str,
                  extra: dict[str, Any] | None = None, claimed_writer: str | None = None,
                  parents: Sequence[str] = ()) -> Result:
        meta = self._provenance_meta(agent, scope, extra, claimed_writer, parents)
        return await self.call(agent, "POST", "add", {"ids": [name], "embeddings": [embedding], "documents": [text],
                                                       "metadatas": [meta]})

    async def _get(self, agent: Agent, ids: list[str] | None = None, where: dict[str, Any] | None = None) -> Result:
        body: dict[str, Any] = {"include": ["documents", "metadatas"]}
        if ids is not None:
            body["ids"] = ids
        if where is not None:
            body["where"] = where
        return await self.call(agent, "POST", "get", body)

    async def get(self, agent: Agent, name: str) -> Result:
        return await self._get(agent, ids=[name])

    async def listing(self, agent: Agent) -> Result:
        return await self._get(agent)

    async def search(self, agent: Agent, text: str, embedding: list[float], k: int) -> Result:
        return await self.call(agent, "POST", "query", {"query_embeddings": [embedding], "n_results": k,
                                                          "include": ["documents", "metadatas", "distances"]})

    async def count(self, agent: Agent) -> Result:
        return await self.call(agent, "GET", "count")

    async def delete(self, agent: Agent, names: list[str]) -> list[Result]:
        return [await self.call(agent, "POST", "delete", {"ids": names})]

    async def facts(self, agent: Agent, subject: str, predicate: str) -> Result:
        return await self._get(agent, where=self.fact_where(subject, predicate))

    def fact_where(self, subject: str, predicate: str) -> dict[str, Any]:
        """A ``where`` selecting the facts about (subject, predicate) written with `fact`."""
        prefix = "mw_" if self.governed else ""
        return {"$and": [{f"{prefix}subject": subject}, {f"{prefix}predicate": predicate}]}

    def seen(self, result: Result, name: str, text: str | None = None) -> bool:
        return returned(result, name, text)

    def names_in(self, result: Result) -> set[str]:
        return set(_chroma_ids(result.body)) if result.ok else set()

    def metadata(self, result: Result, name: str) -> dict[str, Any] | None:
        body = result.body
        if not returned(result, name) or not isinstance(body, dict):
            return None
        ids = body.get("ids") or []
        metas = body.get("metadatas") or []
        for rid, meta in zip(ids, metas):
            if rid == name and isinstance(meta, dict):
                return meta
        return None


class Mem0Target(Target):
    """`space` is the Mem0 ``user_id`` every memory of the run is filed under; `backend_key` is Mem0's
    ``X-API-Key`` (the direct target only: through the sidecar agents send their memwarden keys)."""

    backend = "mem0"
    title = "Mem0"

    def __init__(self, name: str, base_url: str, space: str, keys: dict[str, str] | None = None,
                 backend_key: str | None = None, concurrency: int = 8, rate_per_s: float = 500.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(name, base_url, keys, concurrency, rate_per_s, transport)
        self.space = space
        self.backend_key = backend_key

    @property
    def supports(self) -> frozenset[str]:
        return super().supports | {"history"}

    def _headers(self, agent: Agent) -> dict[str, str]:
        if self.governed:
            return super()._headers(agent)
        return {"X-API-Key": self.backend_key} if self.backend_key else {}

    def native(self, name: str) -> str:
        # A name never written maps to a version-5 UUID: Mem0 issues version-4 ids, so no row has it.
        return self._native.get(name) or str(uuid.uuid5(uuid.NAMESPACE_URL, f"memwarden-probe:{name}"))

    async def add(self, agent: Agent, name: str, text: str, embedding: list[float], scope: str,
                  extra: dict[str, Any] | None = None, claimed_writer: str | None = None,
                  parents: Sequence[str] = ()) -> Result:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "infer": False, "user_id": self.space,
                                "metadata": self._provenance_meta(agent, scope, extra, claimed_writer, parents)}
        if not self.governed:
            body["agent_id"] = agent.uid  # through the sidecar, the sidecar sets agent_id itself
        r = await self.request(agent, "POST", "/memories", body)
        results = r.body.get("results") if r.ok and isinstance(r.body, dict) else None
        adds = [e for e in results or [] if isinstance(e, dict) and e.get("event") == "ADD" and isinstance(e.get("id"), str)]
        if r.ok and len(adds) == 1:
            self._remember(name, adds[0]["id"])
        elif r.ok:  # not the one memory asked for: count it as a failed write
            return Result(598, r.ms, r.body)
        return r

    async def get(self, agent: Agent, name: str) -> Result:
        return await self.request(agent, "GET", f"/memories/{self.native(name)}")

    async def listing(self, agent: Agent) -> Result:
        return await self.request(agent, "GET", "/memories", params={"user_id": self.space, "top_k": "1000"})

    async def search(self, agent: Agent, text: str, embedding: list[float], k: int) -> Result:
        return await self.request(agent, "POST", "/search", {"query": text, "filters": {"user_id": self.space},
                                                              "top_k": k, "threshold": 0.0})

    async def history(self, agent: Agent, name: str) -> Result:
        return await self.request(agent, "GET", f"/memories/{self.native(name)}/history")

    async def delete(self, agent: Agent, names: list[str]) -> list[Result]:
        return list(await asyncio.gather(*(self.request(agent, "DELETE", f"/memories/{self.native(n)}") for n in names)))

    def fact(self, subject: str, predicate: str, obj: str) -> dict[str, str]:
        """As `Target.fact`; through the sidecar also ``subject``/``predicate`` as plain keys, because the
        Mem0 profile refuses filters on ``mw_*`` keys and `facts` filters on them."""
        meta = super().fact(subject, predicate, obj)
        if self.governed:
            meta.update({"subject": subject, "predicate": predicate})
        return meta

    async def facts(self, agent: Agent, subject: str, predicate: str) -> Result:
        # Mem0's GET /memories filters only by user/agent/run; its search takes metadata filters.
        return await self.request(agent, "POST", "/search", {
            "query": f"the deploy pipeline of service {subject}", "top_k": 10, "threshold": 0.0,
            "filters": {"user_id": self.space, "subject": subject, "predicate": predicate}})

    def _rows(self, result: Result) -> list[dict[str, Any]]:
        body = result.body
        if not result.ok:
            return []
        if isinstance(body, dict) and isinstance(body.get("results"), list):
            return [r for r in body["results"] if isinstance(r, dict)]
        if isinstance(body, dict) and "id" in body:  # GET /memories/{id}; Mem0 answers 200 null when missing
            return [body]
        return []

    def seen(self, result: Result, name: str, text: str | None = None) -> bool:
        native = self.native(name)
        return any(r.get("id") == native or (text is not None and r.get("memory") == text) for r in self._rows(result))

    def names_in(self, result: Result) -> set[str]:
        return {self.name_of(r["id"]) for r in self._rows(result) if isinstance(r.get("id"), str)}

    def metadata(self, result: Result, name: str) -> dict[str, Any] | None:
        native = self.native(name)
        for r in self._rows(result):
            if r.get("id") == native and isinstance(r.get("metadata"), dict):
                meta: dict[str, Any] = r["metadata"]
                return meta
        return None

    def history_shows(self, result: Result, name: str, text: str) -> bool:
        if not result.ok or not isinstance(result.body, list):
            return False
        native = self.native(name)
        return any(isinstance(e, dict) and (e.get("memory_id") == native or text in (e.get("old_memory"), e.get("new_memory")))
                   for e in result.body)


def _chroma_ids(body: Any) -> list[str]:
    if not isinstance(body, dict):
        return []
    ids = body.get("ids") or []
    if ids and isinstance(ids[0], list):  # query answers are nested per query vector
        ids = [i for sub in ids for i in sub]
    return [i for i in ids if isinstance(i, str)]


def returned(result: Result, row_id: str, text: str | None = None) -> bool:
    """True when `row_id` (or `text`, under any id) is in a Chroma get/query answer."""
    body = result.body
    if not result.ok or not isinstance(body, dict):
        return False
    ids = body.get("ids") or []
    docs = body.get("documents") or []
    if ids and isinstance(ids[0], list):  # query answers are nested per query vector
        ids = [i for sub in ids for i in sub]
        docs = [d for sub in docs for d in (sub or [])]
    if row_id in ids:
        return True
    return text is not None and any(d == text for d in docs if isinstance(d, str))
