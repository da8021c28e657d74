"""HTTP targets for the probe: a Chroma v2 server directly (baseline) or through the sidecar.

Both speak Chroma's v2 API. The direct target models an application that keeps governance hints in
plain metadata (``scope``, ``owner``, ``writer``, a fact's ``subject``/``predicate``/``object``) it
cannot enforce; the sidecar target requests ``mw_scope``, states facts as the governed triple
``mw_subject``/``mw_predicate``/``mw_object`` (supersession) and reads the sidecar-stamped ``mw_writer``. Requests share one async client with a
concurrency cap and a rate limit; retries only on transport errors, 429 and 5xx (3 attempts).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sidecar.probe.plan import Agent

RETRY_STATUSES = {429, 500, 502, 503, 504}


@dataclass
class Result:
    status: int
    ms: float
    body: Any = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class ChromaTarget:
    """`name` is "direct" or "sidecar"; `collections` maps tenant → (chroma tenant, database, collection id)."""

    name: str
    base_url: str
    collections: dict[str, tuple[str, str, str]]
    keys: dict[str, str] = field(default_factory=dict)
    concurrency: int = 8
    rate_per_s: float = 500.0
    supports: frozenset[str] = frozenset()
    transport: httpx.AsyncBaseTransport | None = None  # tests: an httpx.MockTransport instead of the network

    def __post_init__(self) -> None:
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=30.0, trust_env=False, transport=self.transport,
                                         limits=httpx.Limits(max_connections=self.concurrency))
        self._sem = asyncio.Semaphore(self.concurrency)
        self._next = 0.0
        self._lock = asyncio.Lock()

    @property
    def governed(self) -> bool:
        return self.name == "sidecar"

    async def close(self) -> None:
        await self._client.aclose()

    async def _pace(self) -> None:
        async with self._lock:
            now = time.monotonic()
            wait = self._next - now
            self._next = max(now, self._next) + 1.0 / self.rate_per_s
        if wait > 0:
            await asyncio.sleep(wait)

    async def call(self, agent: Agent, method: str, op: str, body: Any = None) -> Result:
        chroma_tenant, database, cid = self.collections[agent.tenant]
        path = f"/api/v2/tenants/{chroma_tenant}/databases/{database}/collections/{cid}/{op}"
        headers = {"X-API-Key": self.keys[agent.uid]} if self.governed else {}
        async with self._sem:
            for attempt in range(3):
                await self._pace()
                t0 = time.perf_counter()
                try:
                    r = await self._client.request(method, path, json=body, headers=headers)
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

    # -- operations --------------------------------------------------------------------------
    async def add(self, agent: Agent, row_id: str, text: str, embedding: list[float], scope: str,
                  extra: dict[str, Any] | None = None, claimed_writer: str | None = None) -> Result:
        meta: dict[str, Any] = dict(extra or {})
        if self.governed:
            meta["mw_scope"] = scope
        else:
            meta.update({"scope": scope, "owner": agent.uid, "fleet": agent.fleet, "tenant": agent.tenant,
                         "writer": claimed_writer or agent.uid})
        if claimed_writer and self.governed:
            meta["writer"] = claimed_writer  # a plain claim; the sidecar's mw_writer is what counts
        return await self.call(agent, "POST", "add", {"ids": [row_id], "embeddings": [embedding],
                                                       "documents": [text], "metadatas": [meta]})

    async def get(self, agent: Agent, ids: list[str] | None = None, where: dict[str, Any] | None = None) -> Result:
        body: dict[str, Any] = {"include": ["documents", "metadatas"]}
        if ids is not None:
            body["ids"] = ids
        if where is not None:
            body["where"] = where
        return await self.call(agent, "POST", "get", body)

    async def search(self, agent: Agent, embedding: list[float], k: int) -> Result:
        return await self.call(agent, "POST", "query", {"query_embeddings": [embedding], "n_results": k,
                                                          "include": ["documents", "metadatas", "distances"]})

    async def count(self, agent: Agent) -> Result:
        return await self.call(agent, "GET", "count")

    async def delete(self, agent: Agent, ids: list[str]) -> Result:
        return await self.call(agent, "POST", "delete", {"ids": ids})

    def fact(self, subject: str, predicate: str, obj: str) -> dict[str, str]:
        """Metadata stating the fact (subject, predicate, object): the governed triple through the sidecar
        (a single-valued predicate supersedes the current fact), the same values as plain keys directly."""
        prefix = "mw_" if self.governed else ""
        return {f"{prefix}subject": subject, f"{prefix}predicate": predicate, f"{prefix}object": obj}

    def fact_where(self, subject: str, predicate: str) -> dict[str, Any]:
        """A ``where`` selecting the facts about (subject, predicate) written with `fact`."""
        prefix = "mw_" if self.governed else ""
        return {"$and": [{f"{prefix}subject": subject}, {f"{prefix}predicate": predicate}]}

    def writer_of(self, metadata: dict[str, Any] | None) -> str | None:
        """The writer the target records for a row (stamped by the sidecar; client-claimed directly)."""
        if not metadata:
            return None
        return metadata.get("mw_writer") if self.governed else metadata.get("writer")


def returned(result: Result, row_id: str, text: str | None = None) -> bool:
    """True when `row_id` (or `text`, under any id) is in a get/query answer."""
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
