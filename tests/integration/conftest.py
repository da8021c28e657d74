"""Fixtures starting real servers on 127.0.0.1: `chroma run` and `memwarden serve` subprocesses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import chromadb
import httpx
import pytest

from memwarden_eval.harness import Server, start_chroma, start_sidecar
from sidecar.ledger import SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def chroma_client(port: int, tenant: str, headers: dict[str, str] | None = None,
                  database: str = "default_database") -> chromadb.api.ClientAPI:
    return chromadb.HttpClient(
        host="127.0.0.1", port=port, headers=headers or {}, tenant=tenant, database=database,
        settings=chromadb.config.Settings(anonymized_telemetry=False),
    )


def admin_client(port: int, headers: dict[str, str] | None = None) -> chromadb.api.AdminAPI:
    return chromadb.AdminClient(chromadb.config.Settings(
        chroma_api_impl="chromadb.api.fastapi.FastAPI", chroma_server_host="127.0.0.1",
        chroma_server_http_port=port, chroma_server_headers=headers or {}, anonymized_telemetry=False,
    ))


@dataclass
class Tenant:
    """A tenant provisioned through the sidecar: admin key, Chroma tenant + database, one collection."""

    name: str
    admin_key: str
    collection: str
    collection_id: str
    keys: dict[str, str] = field(default_factory=dict)


@dataclass
class Stack:
    chroma: Server
    sidecar: Server
    ledger_path: Path

    def ledger(self) -> SQLiteLedger:
        return SQLiteLedger(self.ledger_path)

    def key(self, tenant: str, fleet: str | None = None, agent: str | None = None, trust: int = 0) -> str:
        ledger = self.ledger()
        try:
            _, plaintext = ledger.create_key("agent" if agent else "admin", tenant, fleet, agent, trust)
        finally:
            ledger.close()
        return plaintext

    def client(self, key: str, tenant: str) -> chromadb.api.ClientAPI:
        return chroma_client(self.sidecar.port, tenant, {"X-API-Key": key})

    def direct(self, tenant: str) -> chromadb.api.ClientAPI:
        return chroma_client(self.chroma.port, tenant)

    def http(self, key: str | None = None, **headers: str) -> httpx.Client:
        h = {"X-API-Key": key} if key else {}
        return httpx.Client(base_url=self.sidecar.url, headers={**h, **headers}, timeout=30.0, trust_env=False)

    def tenant(self, prefix: str = "t") -> Tenant:
        """A fresh tenant with an admin key, its Chroma tenant/database and a collection ``mem``."""
        name = f"{prefix}{uuid.uuid4().hex[:10]}"
        admin = self.key(name)
        adm = admin_client(self.sidecar.port, {"X-API-Key": admin})
        adm.create_tenant(name)
        adm.create_database("default_database", tenant=name)
        coll = self.client(admin, name).create_collection("mem", metadata={"hnsw:space": "l2"})
        return Tenant(name, admin, "mem", str(coll.id))


def _start_stack(tmp: Path, chroma: Server | None = None) -> tuple[Stack, bool]:
    own = chroma is None
    if chroma is None:
        chroma = start_chroma(tmp / "chroma")
    sidecar = start_sidecar(chroma.url, tmp / "ledger.db", POLICIES)
    return Stack(chroma, sidecar, tmp / "ledger.db"), own


@pytest.fixture
def private_stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack with its own Chroma (for tests that stop the backend)."""
    s, _ = _start_stack(tmp_path)
    yield s
    s.sidecar.stop()
    s.chroma.stop()


def unit_vectors(n: int, dim: int = 8, seed: int = 0) -> list[list[float]]:
    import random

    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        v = [rnd.gauss(0, 1) for _ in range(dim)]
        norm = sum(x * x for x in v) ** 0.5
        out.append([x / norm for x in v])
    return out


def rows_of(result: Any) -> list[str]:
    return sorted(result["ids"])


@pytest.fixture(scope="session")
def tenant_pushdown_stack(stack: Stack) -> Iterator[Stack]:
    """A second sidecar on the same Chroma and ledger whose pushdown is the tenant filter only,
    so that over-fetch and refill (not the scope pushdown) must find the readable rows."""
    sidecar = start_sidecar(stack.chroma.url, stack.ledger_path, POLICIES, extra_env={"MEMWARDEN_PUSHDOWN": "tenant"})
    yield Stack(stack.chroma, sidecar, stack.ledger_path)
    sidecar.stop()


@pytest.fixture(scope="session")
def pushdown_stack(stack: Stack) -> Iterator[Stack]:
    """A sidecar whose query plan always ANDs the visibility filter into the backend query (the default
    ``auto`` plan chooses per request, `sidecar.planner`)."""
    sidecar = start_sidecar(stack.chroma.url, stack.ledger_path, POLICIES, extra_env={"MEMWARDEN_QUERY_PLAN": "pushdown"})
    yield Stack(stack.chroma, sidecar, stack.ledger_path)
    sidecar.stop()


@pytest.fixture(scope="session")
def where_pushdown_stack(stack: Stack) -> Iterator[Stack]:
    """A sidecar whose query plan always pushes the visibility filter down as Chroma's metadata ``where``
    (``ID_PUSHDOWN_MAX=0``: never as the ledger's id list of the admitted rows)."""
    sidecar = start_sidecar(stack.chroma.url, stack.ledger_path, POLICIES,
                            extra_env={"MEMWARDEN_QUERY_PLAN": "pushdown", "MEMWARDEN_ID_PUSHDOWN_MAX": "0"})
    yield Stack(stack.chroma, sidecar, stack.ledger_path)
    sidecar.stop()


@pytest.fixture(scope="session")
def postfilter_stack(stack: Stack) -> Iterator[Stack]:
    """A sidecar whose query plan tries one unfiltered over-fetch before refilling under the pushdown."""
    sidecar = start_sidecar(stack.chroma.url, stack.ledger_path, POLICIES, extra_env={"MEMWARDEN_QUERY_PLAN": "postfilter-first"})
    yield Stack(stack.chroma, sidecar, stack.ledger_path)
    sidecar.stop()
