"""A minimal Chroma HTTP v2 client (httpx) for the benchmark: the same calls go to Chroma directly or
through memwarden with an ``X-API-Key``. Every call is timed (`Timings`).

Routes (Chroma 1.x, ``/api/v2``): ``POST /tenants``, ``POST /tenants/{t}/databases``,
``POST /tenants/{t}/databases/{d}/collections``, and on ``…/collections/{id}/``: ``add``, ``query``,
``update``, ``delete``. Errors: `httpx.HTTPStatusError` for any non-2xx answer (the benchmark stops: a
refused write or query is a failure of the run, not a data point).
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

    def query(self, key: str | None, embedding: list[float], n: int) -> list[tuple[str, str]]:
        """Top-`n` (row id, document) for `embedding`, nearest first."""
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
