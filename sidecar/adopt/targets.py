"""The backends `memwarden adopt` scans and stamps, through their own HTTP APIs (never their files).

- `ChromaTarget`: one collection of a Chroma server, HTTP API v2 (chromadb 1.x): ``GET
  /api/v2/tenants/{t}/databases/{d}/collections/{name}`` to find it, ``GET …/{id}/count``, paged ``POST
  …/{id}/get`` (``include: ["metadatas", "documents"]``, ``limit``/``offset``) to scan (a row's text: its document,
  else its first non-empty `content_keys` metadata value, as the sidecar reads it), ``POST …/{id}/update``
  with ``metadatas`` to stamp. Chroma merges update metadata into the row's and deletes a key sent as
  ``null``, so a stamp sets the governed keys and drops any other ``mw_*`` key the row carried.
- `Mem0Target`: a self-hosted Mem0 REST server (mem0 ``server/main.py``, ``X-API-Key``): ``GET /entities``
  (users, agents, runs) plus the ids the rules name, ``GET /memories?<field>=<id>&top_k=1000&show_expired=true``
  per entity (Mem0 lists at most 1000 memories per call and has no offset), ``PUT /memories/{id}`` with
  ``metadata`` to stamp (Mem0 merges it into the memory's payload; a key cannot be removed, so other ``mw_*``
  keys are set to ``null``).

Both raise `TargetError` for an unreachable backend or an answer of an unexpected shape.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator

import httpx

from sidecar.backends.chroma import stamp as chroma_stamp
from sidecar.backends.mem0 import Mem0Profile
from sidecar.governance import Row
from sidecar.provenance import GOVERNED_PREFIX, row_text

MEM0_LIST_LIMIT = 1000
MEM0_ENTITY_FIELDS = {"user": "user_id", "agent": "agent_id", "run": "run_id"}


class TargetError(RuntimeError):
    """The backend could not be read or written as expected (the message says which call)."""


@dataclass
class Found:
    """One backend row as scanned: its id, its metadata as stored (plain and ``mw_*`` keys), its text, its
    Mem0 entity ids (`native`; empty on Chroma) and its creation time in UTC µs when the backend keeps one."""

    row_id: str
    metadata: dict[str, Any]
    text: str | None
    native: dict[str, str] = field(default_factory=dict)
    created_at: int | None = None

    def plain(self) -> dict[str, Any]:
        return {k: v for k, v in self.metadata.items() if not k.startswith(GOVERNED_PREFIX)}


def _client(url: str, token: str | None, header: str, timeout_s: float,
            verify: ssl.SSLContext | None = None) -> httpx.Client:
    """`verify`: the TLS context of an https:// backend (`sidecar.config.backend_tls_context`); None: httpx's default."""
    headers = {}
    if token:
        headers[header] = f"Bearer {token}" if header.lower() == "authorization" else token
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, trust_env=False,
                        verify=verify if verify is not None else True)


def _json(client: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    try:
        r = client.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise TargetError(f"{method} {path}: backend unreachable ({type(exc).__name__})") from exc
    if r.status_code >= 400:
        raise TargetError(f"{method} {path}: backend answered {r.status_code}: {r.text[:200]}")
    try:
        return r.json() if r.content else None
    except ValueError as exc:
        raise TargetError(f"{method} {path}: backend answered a non-JSON body") from exc


class ChromaTarget:
    """One Chroma collection (`tenant`/`database`/`name`). `page` rows per get and per update."""

    backend = "chroma"

    def __init__(self, url: str, tenant: str, database: str, name: str, *, token: str | None = None,
                 auth_header: str = "Authorization", timeout_s: float = 60.0, page: int = 1000,
                 content_keys: tuple[str, ...] = ("data",), verify: ssl.SSLContext | None = None) -> None:
        self.tenant, self.database, self.name, self.page = tenant, database, name, page
        self.content_keys = content_keys
        self._http = _client(url, token, auth_header, timeout_s, verify)
        self._base = f"/api/v2/tenants/{tenant}/databases/{database}/collections"
        coll = _json(self._http, "GET", f"{self._base}/{name}")
        if not isinstance(coll, dict) or not isinstance(coll.get("id"), str):
            raise TargetError(f"collection {name!r}: unexpected answer")
        self.collection: str = coll["id"]

    def close(self) -> None:
        self._http.close()

    def total(self) -> int | None:
        n = _json(self._http, "GET", f"{self._base}/{self.collection}/count")
        return n if isinstance(n, int) else None

    def pages(self) -> Iterator[list[Found]]:
        offset = 0
        while True:
            resp = _json(self._http, "POST", f"{self._base}/{self.collection}/get",
                         json={"limit": self.page, "offset": offset, "include": ["metadatas", "documents"]})
            if not isinstance(resp, dict) or not isinstance(resp.get("ids"), list):
                raise TargetError("get: unexpected answer")
            ids = resp["ids"]
            metas = resp.get("metadatas") or [None] * len(ids)
            docs = resp.get("documents") or [None] * len(ids)
            if len(metas) != len(ids) or len(docs) != len(ids):
                raise TargetError("get: columns of unequal length")
            if ids:
                page = [Found(str(i), dict(m or {}), None) for i, m in zip(ids, metas)]
                for found, d in zip(page, docs):  # the document, else the metadata key mem0's Memory keeps its text in
                    found.text = row_text(d, found.plain(), self.content_keys)
                yield page
            if len(ids) < self.page:
                return
            offset += len(ids)

    @staticmethod
    def governed(found: Found, row: Row) -> dict[str, Any]:
        """The row's metadata as stamped from `row`: its plain keys, the governed ones from the ledger."""
        return chroma_stamp(found.plain(), row)

    def is_stamped(self, found: Found, row: Row) -> bool:
        want = {k: v for k, v in self.governed(found, row).items() if k.startswith(GOVERNED_PREFIX)}
        return {k: v for k, v in found.metadata.items() if k.startswith(GOVERNED_PREFIX)} == want

    def stamp(self, items: list[tuple[Found, Row]]) -> None:
        if not items:
            return
        metadatas = []
        for found, row in items:
            governed = self.governed(found, row)
            patch: dict[str, Any] = {k: v for k, v in governed.items() if k.startswith(GOVERNED_PREFIX)}
            patch.update({k: None for k in found.metadata if k.startswith(GOVERNED_PREFIX) and k not in governed})
            metadatas.append(patch)
        for i in range(0, len(items), self.page):
            _json(self._http, "POST", f"{self._base}/{self.collection}/update",
                  json={"ids": [f.row_id for f, _ in items[i:i + self.page]], "metadatas": metadatas[i:i + self.page]})

    @staticmethod
    def listing(found: Found) -> list[tuple[str, str]]:
        return []  # Chroma lists a collection by its id: nothing to record

    @staticmethod
    def cedar_attrs(found: Found) -> dict[str, str]:
        return {}


def _iso_us(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None
    return int(dt.timestamp() * 1_000_000)


class Mem0Target:
    """The memories of one Mem0 deployment (ledger collection `deployment`). `extra_ids`: (field, id) entity
    ids to list besides those ``GET /entities`` reports (the ids the rules name). After `pages`, `truncated`
    names the entities that answered the 1000-row limit (some of their memories may not have been seen)."""

    backend = "mem0"

    def __init__(self, url: str, deployment: str, *, token: str | None = None, auth_header: str = "X-API-Key",
                 timeout_s: float = 60.0, extra_ids: list[tuple[str, str]] | None = None,
                 verify: ssl.SSLContext | None = None) -> None:
        self.collection = deployment
        self._http = _client(url, token, auth_header, timeout_s, verify)
        self._extra = list(extra_ids or [])
        self.truncated: list[str] = []
        self._entities: list[tuple[str, str, int | None]] | None = None

    def close(self) -> None:
        self._http.close()

    def _list_entities(self) -> list[tuple[str, str, int | None]]:
        if self._entities is None:
            found: dict[tuple[str, str], int | None] = {}
            try:
                listed = _json(self._http, "GET", "/entities")
            except TargetError:
                listed = None  # a server without /entities: the ids the rules name
            for e in listed if isinstance(listed, list) else []:
                if isinstance(e, dict) and e.get("type") in MEM0_ENTITY_FIELDS and isinstance(e.get("id"), str):
                    n = e.get("total_memories")
                    found[(MEM0_ENTITY_FIELDS[e["type"]], e["id"])] = n if isinstance(n, int) else None
            for key in self._extra:
                found.setdefault(key, None)
            self._entities = [(f, i, n) for (f, i), n in sorted(found.items())]
        return self._entities

    def total(self) -> int | None:
        counts = [n for _, _, n in self._list_entities()]
        return None if any(n is None for n in counts) else sum(c for c in counts if c is not None)

    def pages(self) -> Iterator[list[Found]]:
        seen: set[str] = set()
        for field_name, ident, _ in self._list_entities():
            resp = _json(self._http, "GET", "/memories", params={field_name: ident, "top_k": str(MEM0_LIST_LIMIT),
                                                                "show_expired": "true"})
            if not isinstance(resp, dict) or not isinstance(resp.get("results"), list):
                raise TargetError("GET /memories: unexpected answer")
            rows = resp["results"]
            if len(rows) >= MEM0_LIST_LIMIT:
                self.truncated.append(f"{field_name}={ident}")
            page: list[Found] = []
            for m in rows:
                if not isinstance(m, dict) or not isinstance(m.get("id"), str) or m["id"] in seen:
                    continue
                seen.add(m["id"])
                native = {k: m[k] for k in ("agent_id", "user_id", "run_id") if isinstance(m.get(k), str) and m[k]}
                meta = m.get("metadata") if isinstance(m.get("metadata"), dict) else {}
                page.append(Found(m["id"], dict(meta), m.get("memory") if isinstance(m.get("memory"), str) else None,
                                  native, _iso_us(m.get("created_at"))))
            if page:
                yield page

    @staticmethod
    def governed(found: Found, row: Row) -> dict[str, Any]:
        return Mem0Profile._stamp(found.plain(), row)

    def is_stamped(self, found: Found, row: Row) -> bool:
        want = {k: v for k, v in self.governed(found, row).items() if k.startswith(GOVERNED_PREFIX)}
        have = {k: v for k, v in found.metadata.items() if k.startswith(GOVERNED_PREFIX) and v is not None}
        return have == want

    def stamp(self, items: list[tuple[Found, Row]]) -> None:
        for found, row in items:
            governed = self.governed(found, row)
            patch: dict[str, Any] = {k: v for k, v in governed.items() if k.startswith(GOVERNED_PREFIX)}
            patch.update({k: None for k in found.metadata if k.startswith(GOVERNED_PREFIX) and k not in governed})
            _json(self._http, "PUT", f"/memories/{found.row_id}", json={"metadata": patch})

    @staticmethod
    def listing(found: Found) -> list[tuple[str, str]]:
        """The entity id under which the sidecar lists this memory (agent_id, else user_id, else run_id)."""
        for key in ("agent_id", "user_id", "run_id"):
            if key in found.native:
                return [(key, found.native[key])]
        return []

    @staticmethod
    def cedar_attrs(found: Found) -> dict[str, str]:
        """The optional Cedar attributes the Mem0 profile records (Memory.user_id / run_id)."""
        return {k: found.native[k] for k in ("user_id", "run_id") if k in found.native}
