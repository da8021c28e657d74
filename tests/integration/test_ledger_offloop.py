"""A real `memwarden serve` on a real PostgreSQL ledger with a pool of ONE connection: ledger calls run off
the event loop, concurrent requests share the pool correctly, a pool that stays busy denies with 503
``ledger_unavailable`` (never serves), and a lost connection is replaced on the next requests."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import psycopg
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger.postgres import PostgresLedger
from tests.integration.conftest import POLICIES, admin_client, chroma_client, unit_vectors
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


class Side:
    def __init__(self, server: Server, url: str, schema: str) -> None:
        self.server, self.url, self.schema = server, url, schema
        ledger = PostgresLedger(url, schema=schema, max_size=1)
        try:
            self.tenant = f"off{uuid.uuid4().hex[:8]}"
            _, self.admin = ledger.create_key("admin", self.tenant, None, None, 0)
            _, self.agent = ledger.create_key("agent", self.tenant, "red", "a", 2)
        finally:
            ledger.close()
        admin_client(server.port, {"X-API-Key": self.admin}).create_tenant(self.tenant)
        admin_client(server.port, {"X-API-Key": self.admin}).create_database("default_database", tenant=self.tenant)
        self.cid = str(chroma_client(server.port, self.tenant, {"X-API-Key": self.admin}).create_collection("mem").id)
        coll = chroma_client(server.port, self.tenant, {"X-API-Key": self.agent}).get_collection("mem")
        coll.add(ids=[f"r{i}" for i in range(20)], embeddings=unit_vectors(20), documents=[f"d{i}" for i in range(20)],
                 metadatas=[{"mw_scope": "fleet"}] * 20)

    def get(self, ids: list[str], timeout: float = 30) -> httpx.Response:
        return httpx.post(f"{self.server.url}/api/v2/tenants/{self.tenant}/databases/default_database/collections/{self.cid}/get",
                          json={"ids": ids}, headers={"X-API-Key": self.agent}, timeout=timeout, trust_env=False)

    def query(self, k: int) -> httpx.Response:
        return httpx.post(f"{self.server.url}/api/v2/tenants/{self.tenant}/databases/default_database/collections/{self.cid}/query",
                          json={"query_embeddings": unit_vectors(1, seed=7), "n_results": k},
                          headers={"X-API-Key": self.agent}, timeout=30, trust_env=False)


@pytest.fixture(scope="module")
def side(pg_url: str, chroma_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Side]:
    schema = fresh_schema()
    env = {"MEMWARDEN_LEDGER_URL": pg_url, "MEMWARDEN_LEDGER_SCHEMA": schema, "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
           "MEMWARDEN_LEDGER_POOL_MIN": "1", "MEMWARDEN_LEDGER_POOL_MAX": "1", "MEMWARDEN_LEDGER_TIMEOUT_S": "1"}
    server = start_sidecar(chroma_server.url, tmp_path_factory.mktemp("offloop") / "unused.db", POLICIES, extra_env=env)
    try:
        yield Side(server, pg_url, schema)
    finally:
        server.stop()


def test_concurrent_reads_on_one_pooled_connection_all_answer_correctly(side: Side) -> None:
    want_get = sorted(side.get([f"r{i}" for i in range(20)]).json()["ids"])
    want_query = side.query(10).json()["ids"]
    assert len(want_get) == 20 and len(want_query[0]) == 10

    def one(i: int) -> tuple[str, object]:
        if i % 2:
            r = side.get([f"r{i}" for i in range(20)])
            return "get", (r.status_code, sorted(r.json()["ids"]))
        r = side.query(10)
        return "query", (r.status_code, r.json()["ids"])

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(64)))
    for kind, got in results:
        assert got == (200, want_get if kind == "get" else want_query)


def test_a_busy_pool_denies_with_503_and_the_loop_stays_free(side: Side) -> None:
    """An outside transaction locks api_keys: the sidecar's only connection blocks on it (in a worker
    thread), the next request cannot get a connection within 1 s and is denied with 503; meanwhile the
    event loop answers /healthz; once the lock goes, requests are served again."""
    with psycopg.connect(side.url, autocommit=False) as locker:
        locker.execute(f'SET search_path = "{side.schema}"')  # type: ignore[arg-type]
        locker.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
        first: list[httpx.Response] = []
        t = threading.Thread(target=lambda: first.append(side.get(["r1"], timeout=60)))
        t.start()
        time.sleep(0.5)  # the first request now holds the pool's connection, waiting on the lock
        started = time.monotonic()
        health = httpx.get(side.server.url + "/_memwarden/healthz", timeout=5, trust_env=False)
        assert health.status_code == 200 and time.monotonic() - started < 0.9  # the loop is not blocked
        second = side.get(["r1"])
        assert second.status_code == 503 and second.json()["error"] == "ledger_unavailable"
        assert "ids" not in second.json()
        locker.rollback()
    t.join(30)
    assert first and first[0].status_code == 200 and first[0].json()["ids"] == ["r1"]
    assert side.get(["r1"]).status_code == 200


def test_lost_connections_fail_closed_then_recover(side: Side) -> None:
    """Every server backend of the sidecar is terminated: no request is served from stale state (each is
    answered 200 with the right rows or denied 503), and the pool reconnects within a few requests."""
    with psycopg.connect(side.url, autocommit=True) as admin:
        killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchall()
    assert killed
    statuses = []
    for _ in range(10):
        r = side.get(["r1", "r2"])
        statuses.append(r.status_code)
        assert r.status_code in (200, 503), r.text
        if r.status_code == 200:
            assert sorted(r.json()["ids"]) == ["r1", "r2"]
            break
        time.sleep(0.5)
    assert statuses[-1] == 200, statuses


@pytest.mark.parametrize("off_loop", [True, False])
def test_ledger_off_loop_setting(pg_url: str, off_loop: bool) -> None:  # noqa: F811
    """`ledger_off_loop=false` keeps PostgreSQL calls inline; the default sends them to a thread."""
    from sidecar import Settings, create_app
    from sidecar.ledger import offloop

    schema = fresh_schema()
    ledger = PostgresLedger(pg_url, schema=schema, max_size=1)
    try:
        app = create_app(Settings(policies_dir=POLICIES, backend_url="http://127.0.0.1:9", ledger_url=pg_url,
                                  ledger_schema=schema, ledger_off_loop=off_loop), ledger=ledger)
        assert offloop.blocking(app.state.services.ledger) is off_loop
    finally:
        ledger.close()
