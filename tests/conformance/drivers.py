"""One driver per backend: the conformance operations (tests/conformance/test_conformance.py) on that backend's own
wire API, through a real sidecar in front of the real backend. A driver knows only the backend's API: what a case
expects comes from the corpus and cedarpy (tests/conformance/corpus.py).

Outcomes of a change are ``ok``, ``forbidden`` or ``not_found``; each driver pins how its backend's API shows them
(`CHANGE_STATUS`): the one rule of `corpus.change_outcome`, in each backend's own shape.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.conformance.corpus import AGENTS, SEEDS, TEXT, UNGOVERNED, Seed
from tests.integration.conftest import Stack, unit_vectors
from tests.integration.mem0.conftest import Mem0Stack

EMB = dict(zip([s.row_id for s in SEEDS] + [UNGOVERNED], unit_vectors(len(SEEDS) + 1, seed=7)))


@dataclass
class World:
    """A tenant of one backend: its name, a key per principal (agents by name, ``admin``), and per seed name the
    backend's id of that row (Chroma: the seed name itself; Mem0: the id Mem0 chose)."""

    tenant: str
    keys: dict[str, str]
    ids: dict[str, str] = field(default_factory=dict)
    place: Any = None  # the backend's container of the rows (Chroma: collection id)

    def names(self, backend_ids: list[str]) -> list[str]:
        back = {v: k for k, v in self.ids.items()}
        return [back.get(i, i) for i in backend_ids]


class ChromaDriver:
    """Chroma HTTP API v2 (``/api/v2/tenants/{t}/databases/{d}/collections/{id}/…``) through the sidecar."""

    name = "chroma"
    counts = True  # the backend has a count route
    has_history = False
    # (update outcome → status, delete outcome → (status, body)); Chroma answers a delete of a missing id 200.
    UPDATE_STATUS = {"ok": 200, "forbidden": 403, "not_found": 404}
    DELETE_STATUS = {"ok": 200, "forbidden": 403, "not_found": 200}

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def world(self, prefix: str) -> World:
        t = self.stack.tenant(prefix)
        keys = {agent: self.stack.key(t.name, fleet, agent, trust) for fleet, agent, trust in AGENTS}
        keys["admin"] = t.admin_key
        w = World(t.name, keys, place=t.collection_id)
        for s in SEEDS:
            r = self._post(w, s.writer, "add", {"ids": [s.row_id], "embeddings": [EMB[s.row_id]],
                                                "documents": [f"{TEXT[s.topic]} ({s.row_id})"],
                                                "metadatas": [{"topic": s.topic, **s.requested()}]})
            assert r.status_code == 200, r.text
            w.ids[s.row_id] = s.row_id
        # Written straight into Chroma with forged governance metadata: never served.
        direct = self.stack.direct(t.name).get_collection(t.collection)
        direct.add(ids=[UNGOVERNED], embeddings=[EMB[UNGOVERNED]], documents=["forged"],
                   metadatas=[{"mw_tenant": t.name, "mw_scope": "tenant", "mw_fleet": "red", "mw_owner": "x", "topic": "alpha"}])
        w.ids[UNGOVERNED] = UNGOVERNED
        return w

    def _base(self, w: World) -> str:
        return f"/api/v2/tenants/{w.tenant}/databases/default_database/collections/{w.place}"

    def _post(self, w: World, who: str, op: str, body: dict[str, Any]) -> httpx.Response:
        with self.stack.http(w.keys[who]) as h:
            return h.post(f"{self._base(w)}/{op}", json=body)

    def _ids(self, r: httpx.Response) -> list[str]:
        assert r.status_code == 200, r.text
        return list(r.json()["ids"])

    def get(self, w: World, who: str, names: list[str]) -> list[str]:
        return w.names(self._ids(self._post(w, who, "get", {"ids": [w.ids[n] for n in names], "include": []})))

    def get_one(self, w: World, who: str, name: str) -> bool:
        return bool(self.get(w, who, [name]))

    def scan(self, w: World, who: str, topic: str | None = None) -> list[str]:
        body: dict[str, Any] = {"include": ["documents", "metadatas"]}
        if topic is not None:
            body["where"] = {"topic": topic}
        return w.names(self._ids(self._post(w, who, "get", body)))

    def rank(self, w: World, who: str, k: int) -> list[str]:
        r = self._post(w, who, "query", {"query_embeddings": [EMB["r1-agent"]], "n_results": k,
                                         "include": ["documents", "metadatas", "distances"]})
        assert r.status_code == 200, r.text
        return w.names(r.json()["ids"][0])

    def count(self, w: World, who: str) -> int:
        with self.stack.http(w.keys[who]) as h:
            r = h.get(f"{self._base(w)}/count")
        assert r.status_code == 200, r.text
        return int(r.json())

    def update(self, w: World, who: str, name: str) -> httpx.Response:
        return self.update_metadata(w, who, name, {"note": "changed"})

    def update_metadata(self, w: World, who: str, name: str, metadata: dict[str, Any]) -> httpx.Response:
        return self._post(w, who, "update", {"ids": [w.ids[name]], "metadatas": [metadata]})

    def metadata(self, w: World, who: str, name: str) -> dict[str, Any]:
        r = self._post(w, who, "get", {"ids": [w.ids[name]], "include": ["metadatas"]})
        assert r.status_code == 200 and r.json()["ids"] == [w.ids[name]], r.text
        return dict(r.json()["metadatas"][0])

    def delete(self, w: World, who: str, name: str) -> httpx.Response:
        return self._post(w, who, "delete", {"ids": [w.ids[name]]})

    def delete_topic(self, w: World, who: str, topic: str) -> httpx.Response:
        return self._post(w, who, "delete", {"where": {"topic": topic}})

    def write(self, w: World, who: str, requested: dict[str, Any]) -> httpx.Response:
        new = f"new-{uuid.uuid4().hex[:8]}"
        return self._post(w, who, "add", {"ids": [new], "embeddings": [EMB["r1-agent"]], "documents": [f"written {new}"],
                                          "metadatas": [{"topic": "gamma", **requested}]})

    def write_text(self, w: World, who: str, text: str) -> httpx.Response:
        new = f"new-{uuid.uuid4().hex[:8]}"
        return self._post(w, who, "add", {"ids": [new], "embeddings": [EMB["r1-agent"]], "documents": [text],
                                          "metadatas": [{"topic": "gamma"}]})

    def update_text(self, w: World, who: str, name: str, text: str) -> httpx.Response:
        return self._post(w, who, "update", {"ids": [w.ids[name]], "documents": [text]})

    def text(self, w: World, who: str, name: str) -> str:
        r = self._post(w, who, "get", {"ids": [w.ids[name]], "include": ["documents"]})
        assert r.status_code == 200 and r.json()["ids"] == [w.ids[name]], r.text
        return str(r.json()["documents"][0])

    def add_text(self, w: World, who: str, name: str, text: str, requested: dict[str, Any]) -> httpx.Response:
        """Add one row with document `text` as `who`; on 200 it is known as `name` (`World.ids`)."""
        r = self._post(w, who, "add", {"ids": [name], "embeddings": [EMB["r1-agent"]], "documents": [text],
                                       "metadatas": [{"topic": "gamma", **requested}]})
        if r.status_code == 200:
            w.ids[name] = name
        return r

    def in_backend(self, w: World, name: str) -> bool:
        direct = self.stack.direct(w.tenant).get_collection("mem")
        return bool(direct.get(ids=[w.ids[name]])["ids"])

    def lineage(self, w: World, who: str, name: str) -> int:
        with self.stack.http(w.keys[who]) as h:
            return h.get(f"/_memwarden/memories/{w.ids[name]}/lineage", params={"collection": w.place}).status_code

    def history(self, w: World, who: str, name: str) -> int:
        raise NotImplementedError("Chroma keeps no history of a row")

    def backend_refusal(self, w: World, who: str) -> tuple[httpx.Response, str]:
        """A request Chroma itself refuses (an embedding of another dimension than the collection's), and a word of
        Chroma's own message for it."""
        return self._post(w, who, "add", {"ids": ["wrong-dim"], "embeddings": [[1.0, 0.0, 0.0]],
                                          "metadatas": [{"topic": "gamma"}]}), "dimension"


class Mem0Driver:
    """Mem0's REST API (``/memories``, ``/search``, …) through the sidecar."""

    name = "mem0"
    counts = False  # Mem0's REST API has no count route
    has_history = True
    UPDATE_STATUS = {"ok": 200, "forbidden": 403, "not_found": 404}
    DELETE_STATUS = {"ok": 200, "forbidden": 403, "not_found": 404}

    def __init__(self, stack: Mem0Stack) -> None:
        self.stack = stack

    def world(self, prefix: str) -> World:
        mw = self.stack.world(AGENTS, prefix=prefix)
        w = World(mw.name, {**mw.keys, "admin": mw.admin})
        for s in SEEDS:
            w.ids[s.row_id] = self._add(w, s.writer, f"{TEXT[s.topic]} ({s.row_id})", s, {})
        with self.stack.direct() as d:
            r = d.post("/memories", json={"messages": [{"role": "user", "content": TEXT["alpha"] + " forged"}],
                                          "agent_id": f"{mw.name}/red/r1", "user_id": "alpha", "infer": False,
                                          "metadata": {"mw_tenant": mw.name, "mw_scope": "tenant", "topic": "alpha"}})
            assert r.status_code == 200, r.text
            w.ids[UNGOVERNED] = r.json()["results"][0]["id"]
        return w

    def _add(self, w: World, who: str, text: str, s: Seed | None, requested: dict[str, Any]) -> str:
        r = self._write(w, who, text, s.topic if s else "gamma", {**(s.requested() if s else {}), **requested})
        assert r.status_code == 200, r.text
        return str(r.json()["results"][0]["id"])

    def _write(self, w: World, who: str, text: str, topic: str, meta: dict[str, Any]) -> httpx.Response:
        with self.stack.http(w.keys[who]) as h:
            return h.post("/memories", json={"messages": [{"role": "user", "content": text}], "infer": False,
                                             "user_id": topic, "metadata": {"topic": topic, **meta}})

    def _results(self, w: World, r: httpx.Response) -> list[str]:
        assert r.status_code == 200, r.text
        return w.names([m["id"] for m in r.json()["results"]])

    def get(self, w: World, who: str, names: list[str]) -> list[str]:
        return [n for n in names if self.get_one(w, who, n)]

    def get_one(self, w: World, who: str, name: str) -> bool:
        with self.stack.http(w.keys[who]) as h:
            r = h.get(f"/memories/{w.ids[name]}")
        assert r.status_code in (200, 404), r.text
        return r.status_code == 200

    def scan(self, w: World, who: str, topic: str | None = None) -> list[str]:
        with self.stack.http(w.keys[who]) as h:
            return self._results(w, h.get("/memories", params={"user_id": topic} if topic else None))

    def rank(self, w: World, who: str, k: int) -> list[str]:
        with self.stack.http(w.keys[who]) as h:
            return self._results(w, h.post("/search", json={"query": TEXT["alpha"], "top_k": k, "threshold": 0.0}))

    def count(self, w: World, who: str) -> int:
        raise NotImplementedError("Mem0's REST API has no count route")

    def update(self, w: World, who: str, name: str) -> httpx.Response:
        return self.update_metadata(w, who, name, {"note": "changed"})

    def update_metadata(self, w: World, who: str, name: str, metadata: dict[str, Any]) -> httpx.Response:
        with self.stack.http(w.keys[who]) as h:
            return h.put(f"/memories/{w.ids[name]}", json={"metadata": metadata})

    def metadata(self, w: World, who: str, name: str) -> dict[str, Any]:
        with self.stack.http(w.keys[who]) as h:
            r = h.get(f"/memories/{w.ids[name]}")
        assert r.status_code == 200, r.text
        return dict(r.json()["metadata"])

    def delete(self, w: World, who: str, name: str) -> httpx.Response:
        with self.stack.http(w.keys[who]) as h:
            return h.delete(f"/memories/{w.ids[name]}")

    def delete_topic(self, w: World, who: str, topic: str) -> httpx.Response:
        with self.stack.http(w.keys[who]) as h:
            return h.delete("/memories", params={"user_id": topic})

    def write(self, w: World, who: str, requested: dict[str, Any]) -> httpx.Response:
        return self._write(w, who, f"written {uuid.uuid4().hex[:8]}", "gamma", requested)

    def write_text(self, w: World, who: str, text: str) -> httpx.Response:
        return self._write(w, who, text, "gamma", {})

    def update_text(self, w: World, who: str, name: str, text: str) -> httpx.Response:
        with self.stack.http(w.keys[who]) as h:
            return h.put(f"/memories/{w.ids[name]}", json={"text": text})

    def text(self, w: World, who: str, name: str) -> str:
        with self.stack.http(w.keys[who]) as h:
            r = h.get(f"/memories/{w.ids[name]}")
        assert r.status_code == 200, r.text
        return str(r.json()["memory"])

    def add_text(self, w: World, who: str, name: str, text: str, requested: dict[str, Any]) -> httpx.Response:
        """Add one memory with content `text` as `who` (infer=false); on 200 it is known as `name` (`World.ids`)."""
        r = self._write(w, who, text, "gamma", requested)
        if r.status_code == 200:
            w.ids[name] = str(r.json()["results"][0]["id"])
        return r

    def in_backend(self, w: World, name: str) -> bool:
        with self.stack.direct() as d:
            return d.get(f"/memories/{w.ids[name]}").json() is not None

    def lineage(self, w: World, who: str, name: str) -> int:
        with self.stack.http(w.keys[who]) as h:
            return h.get(f"/_memwarden/memories/{w.ids[name]}/lineage").status_code

    def history(self, w: World, who: str, name: str) -> int:
        with self.stack.http(w.keys[who]) as h:
            return h.get(f"/memories/{w.ids[name]}/history").status_code

    def backend_refusal(self, w: World, who: str) -> tuple[httpx.Response, str]:
        """A request Mem0 itself refuses here (``infer`` defaults to true and this Mem0 has no LLM), and a word of
        Mem0's own message for it."""
        with self.stack.http(w.keys["b2"]) as h:  # an agent with no memories: infer=true is confined to nothing
            return h.post("/memories", json={"messages": [{"role": "user", "content": "x"}]}), "LLM"
