"""Helpers for the Mem0 profile's tests. The servers — our Mem0-REST test server (real `mem0ai` `Memory`) and a
sidecar in front of it (``MEMWARDEN_BACKEND=mem0``), both subprocesses on 127.0.0.1 — are the session's
(`tests.servers`: ``mem0_server``, ``mem0_stack``)."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from memwarden_eval.harness import Server
from sidecar.ledger import SQLiteLedger

MEM0_KEY = "mem0-admin-" + secrets.token_hex(8)


@dataclass
class World:
    """A tenant with agent keys (by agent name) and its admin key."""

    name: str
    admin: str
    keys: dict[str, str] = field(default_factory=dict)
    fleets: dict[str, str] = field(default_factory=dict)

    def uid(self, agent: str) -> str:
        return f"{self.name}/{self.fleets[agent]}/{agent}"


@dataclass
class Mem0Stack:
    mem0: Server
    sidecar: Server
    ledger_path: Path

    def key(self, tenant: str, fleet: str | None = None, agent: str | None = None, trust: int = 0) -> str:
        ledger = SQLiteLedger(self.ledger_path)
        try:
            _, plaintext = ledger.create_key("agent" if agent else "admin", tenant, fleet, agent, trust)
        finally:
            ledger.close()
        return plaintext

    def world(self, agents: list[tuple[str, str, int]], prefix: str = "m") -> World:
        name = f"{prefix}{uuid.uuid4().hex[:8]}"
        w = World(name, self.key(name))
        for fleet, agent, trust in agents:
            w.keys[agent] = self.key(name, fleet, agent, trust)
            w.fleets[agent] = fleet
        return w

    def http(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.sidecar.url, headers={"X-API-Key": key} if key else {}, timeout=60.0, trust_env=False)

    def direct(self) -> httpx.Client:
        return httpx.Client(base_url=self.mem0.url, headers={"X-API-Key": MEM0_KEY}, timeout=60.0, trust_env=False)

    def add(self, key: str, text: str, **kw: Any) -> str:
        """Add one memory through the sidecar (infer=false); returns its id."""
        with self.http(key) as h:
            r = h.post("/memories", json={"messages": [{"role": "user", "content": text}], "infer": False, **kw})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == 1 and results[0]["event"] == "ADD"
        return str(results[0]["id"])


def sidecar_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"MEMWARDEN_BACKEND": "mem0", "MEMWARDEN_BACKEND_AUTH_HEADER": "X-API-Key",
            "MEMWARDEN_BACKEND_TOKEN": MEM0_KEY, **(extra or {})}

