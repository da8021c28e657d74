"""Minimal backend clients (httpx) for the benchmark: the same calls go to the backend directly or through
memwarden with an ``X-API-Key``. Every call is timed (`Timings`). Both stores have one interface (`add`,
`update_metadata`, `delete`, `query`) keyed by the benchmark's own row ids.

- `Collection`, Chroma HTTP v2 (Chroma 1.x, ``/api/v2``): ``POST /tenants``, ``POST /tenants/{t}/databases``,
  ``POST /tenants/{t}/databases/{d}/collections``, and on ``…/collections/{id}/``: ``add``, ``query``,
  ``update``, ``delete``; the caller's embeddings are stored and queried.
- `Mem0Store`, the self-hosted Mem0 REST API (mem0 ``server/main.py``): ``POST /memories`` (one message,
  ``infer=false``: Mem0 stores the text as one memory and embeds it itself), ``PUT /memories/{id}``
  (metadata; Mem0 merges it into the memory's payload), ``DELETE /memories/{id}``, ``POST /search`` (Mem0's
  own ranking of the query text, ``threshold=0`` so nothing is cut by score). Mem0 assigns memory ids; the
  store maps them to and from the benchmark's row ids. Every memory of a store carries one ``run_id`` (the
  variant's tenant and a run tag), and every search is confined to it.

Errors: `httpx.HTTPStatusError` for any non-2xx answer (the benchmark stops: a refused write or query is a
failure of the run, not a data point), except the 409 memwarden answers to a write of forgotten content.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

DATABASE = "gatemem"


@dataclass
class Timings:
    """Latencies in seconds, by operation name (``add``, ``query``, …); thread-safe."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, op: str, seconds: float) -> None:
        with self._lock:
            self.samples.setdefault(op, []).append(seconds)


@dataclass
class Collection:
    """One Chroma collection reached at `base` (Chroma or the sidecar)."""

    http: httpx.Client
    tenant: str
    collection_id: str
    timings: Timings
    label: str  # "direct" or "sidecar"
    backend = "chroma"

    @property
    def _path(self) -> str:
        return f"/api/v2/tenants/{self.tenant}/databases/{DATABASE}/collections/{self.collection_id}"

    def _post(self, op: str, body: dict[str, Any], key: str | None, ok: tuple[int, ...] = ()) -> Any:
        headers = {"X-API-Key": key} if key else {}
        t0 = time.perf_counter()
        r = self.http.post(f"{self._path}/{op}", json=body, headers=headers)
        self.timings.add(f"{self.label}:{op}", time.perf_counter() - t0)
        if r.status_code in ok:
            return r.status_code
        r.raise_for_status()
        return r.json() if r.content else None

    def add(self, key: str | None, row_id: str, embedding: list[float], document: str, metadata: dict[str, Any]) -> bool:
        """Add one row; False when memwarden refuses it with 409 (content deleted before: forgotten content)."""
        return self._post("add", {"ids": [row_id], "embeddings": [embedding], "documents": [document],
                                  "metadatas": [metadata]}, key, ok=(409,) if self.label != "direct" else ()) != 409

    def update_metadata(self, key: str | None, row_ids: list[str], metadatas: list[dict[str, Any]]) -> None:
        if row_ids:
            self._post("update", {"ids": row_ids, "metadatas": metadatas}, key)

    def delete(self, key: str | None, row_ids: list[str]) -> None:
        if row_ids:
            self._post("delete", {"ids": row_ids}, key)

    def query(self, key: str | None, embedding: list[float], n: int, text: str | None = None) -> list[tuple[str, str]]:
        """Top-`n` (row id, document) for `embedding`, nearest first (`text` is not used by Chroma)."""
        out = self._post("query", {"query_embeddings": [embedding], "n_results": n, "include": ["documents"]}, key)
        ids = (out.get("ids") or [[]])[0]
        docs = (out.get("documents") or [[]])[0]
        return [(i, d or "") for i, d in zip(ids, docs)]


def create_collection(http: httpx.Client, tenant: str, key: str | None, timings: Timings, label: str) -> Collection:
    """Create `tenant`, its database and a ``memories`` collection (as `key`: a tenant admin key through the
    sidecar, None directly); returns the collection."""
    headers = {"X-API-Key": key} if key else {}
    http.post("/api/v2/tenants", json={"name": tenant}, headers=headers).raise_for_status()
    http.post(f"/api/v2/tenants/{tenant}/databases", json={"name": DATABASE}, headers=headers).raise_for_status()
    r = http.post(f"/api/v2/tenants/{tenant}/databases/{DATABASE}/collections", json={"name": "memories"},
                  headers=headers)
    r.raise_for_status()
    return Collection(http, tenant, r.json()["id"], timings, label)


class Mem0Store:
    """The memories of one variant in a Mem0 REST backend reached at `http` (Mem0 directly, whose client
    carries Mem0's ``X-API-Key``, or the sidecar with a memwarden key per call). Thread-confined: one
    episode's replay uses it."""

    backend = "mem0"

    def __init__(self, http: httpx.Client, run_id: str, timings: Timings, label: str, deployment: str = "default") -> None:
        self.http, self.run_id, self.timings, self.label = http, run_id, timings, label
        self.collection_id = deployment  # the ledger collection of a Mem0 deployment (MEMWARDEN_MEM0_DEPLOYMENT)
        self.mem0_id: dict[str, str] = {}  # row id -> Mem0 memory id
        self.row_id: dict[str, str] = {}   # Mem0 memory id -> row id

    def _call(self, op: str, method: str, path: str, body: dict[str, Any] | None, key: str | None,
              ok: tuple[int, ...] = ()) -> Any:
        headers = {"X-API-Key": key} if key else {}
        t0 = time.perf_counter()
        r = self.http.request(method, path, json=body, headers=headers)
        self.timings.add(f"{self.label}:{op}", time.perf_counter() - t0)
        if r.status_code in ok:
            return r.status_code
        r.raise_for_status()
        return r.json() if r.content else None

    def add(self, key: str | None, row_id: str, embedding: Any, document: str, metadata: dict[str, Any]) -> bool:
        """Add `document` as one memory (Mem0 embeds it; `embedding` is not used). Directly, ``agent_id`` is the
        metadata's ``speaker``; through memwarden the sidecar sets it to the caller. False when memwarden
        refuses it with 409 (forgotten content). A row id already written is left as it is (as Chroma's add)."""
        if row_id in self.mem0_id:
            return True
        body: dict[str, Any] = {"messages": [{"role": "user", "content": document}], "infer": False,
                                "run_id": self.run_id, "metadata": {**metadata, "gm_row": row_id}}
        if key is None:
            body["agent_id"] = str(metadata.get("speaker") or "gatemem")
        out = self._call("add", "POST", "/memories", body, key, ok=(409,) if self.label != "direct" else ())
        if out == 409:
            return False
        results = [r for r in (out or {}).get("results") or [] if r.get("event") == "ADD"]
        if len(results) != 1:
            raise RuntimeError(f"Mem0 add of {row_id}: expected one ADD event, got {out!r}")
        mid = str(results[0]["id"])
        self.mem0_id[row_id], self.row_id[mid] = mid, row_id
        return True

    def update_metadata(self, key: str | None, row_ids: list[str], metadatas: list[dict[str, Any]]) -> None:
        for rid, meta in zip(row_ids, metadatas):
            mid = self.mem0_id[rid]
            # 404: memwarden already deleted it (a copy of deleted content, in an earlier deletion closure)
            if self._call("update", "PUT", f"/memories/{mid}", {"metadata": meta}, key, ok=(404,)) == 404:
                self.mem0_id.pop(rid, None)
                self.row_id.pop(mid, None)

    def delete(self, key: str | None, row_ids: list[str]) -> None:
        for rid in row_ids:
            mid = self.mem0_id.pop(rid, None)
            if mid is None:
                continue
            # 404: already gone (memwarden deleted it as a copy of deleted content in an earlier closure)
            self._call("delete", "DELETE", f"/memories/{mid}", None, key, ok=(404,))
            self.row_id.pop(mid, None)

    def query(self, key: str | None, embedding: Any, n: int, text: str | None = None) -> list[tuple[str, str]]:
        """Top-`n` (row id, memory text) of Mem0's search for `text` within this store's ``run_id``, best first."""
        if text is None:
            raise ValueError("Mem0 search needs the query text")
        out = self._call("query", "POST", "/search", {"query": text, "run_id": self.run_id, "top_k": n, "threshold": 0.0}, key)
        rows = (out or {}).get("results") or []
        return [(self.row_id.get(str(r.get("id")), str((r.get("metadata") or {}).get("gm_row") or r.get("id"))),
                 r.get("memory") or "") for r in rows]
