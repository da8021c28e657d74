"""Two real `memwarden serve` processes in front of one Chroma, sharing one PostgreSQL ledger (a
fresh database per test session, a fresh schema here): what is changed through replica A — a key
revoked, a row deleted, a row re-scoped — is honoured by replica B on its very next request."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger.postgres import PostgresLedger
from tests.integration.conftest import POLICIES, admin_client, chroma_client, unit_vectors
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


class Replicas:
    def __init__(self, a: Server, b: Server, url: str, schema: str) -> None:
        self.a, self.b, self.url, self.schema = a, b, url, schema
        self.env = {"MEMWARDEN_LEDGER_URL": url, "MEMWARDEN_LEDGER_SCHEMA": schema}

    def ledger(self) -> PostgresLedger:
        return PostgresLedger(self.url, schema=self.schema, max_size=2)

    def key(self, tenant: str, fleet: str | None = None, agent: str | None = None, trust: int = 0) -> tuple[str, str]:
        ledger = self.ledger()
        try:
            rec, key = ledger.create_key("agent" if agent else "admin", tenant, fleet, agent, trust)
        finally:
            ledger.close()
        return rec.key_id, key


@pytest.fixture(scope="module")
def replicas(pg_url: str, chroma_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    schema = fresh_schema()
    tmp = tmp_path_factory.mktemp("replicas")
    env = {"MEMWARDEN_LEDGER_URL": pg_url, "MEMWARDEN_LEDGER_SCHEMA": schema, "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0"}
    a = start_sidecar(chroma_server.url, tmp / "a" / "unused.db", POLICIES, extra_env=env)
    try:
        b = start_sidecar(chroma_server.url, tmp / "b" / "unused.db", POLICIES, extra_env=env)
    except BaseException:
        a.stop()
        raise
    yield Replicas(a, b, pg_url, schema)
    a.stop()
    b.stop()
    assert not (tmp / "a" / "unused.db").exists()  # the SQLite path is not used when LEDGER_URL is set


def provision(r: Replicas) -> tuple[str, str]:
    """A tenant (through replica A) with collection ``mem``; returns (tenant, collection id)."""
    name = f"rep{uuid.uuid4().hex[:8]}"
    _, admin = r.key(name)
    adm = admin_client(r.a.port, {"X-API-Key": admin})
    adm.create_tenant(name)
    adm.create_database("default_database", tenant=name)
    coll = chroma_client(r.a.port, name, {"X-API-Key": admin}).create_collection("mem")
    return name, str(coll.id)


def data(s: Server, tenant: str, cid: str, op: str, query: str = "") -> str:
    return f"{s.url}/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}/{op}{query}"


def served(s: Server, key: str, tenant: str, cid: str, op: str, body: Any = None, query: str = "") -> Any:
    """One data-route call through replica `s`; asserts 200 and returns the JSON answer."""
    method = "GET" if op == "count" else "POST"
    r = httpx.request(method, data(s, tenant, cid, op, query), json=body, headers={"X-API-Key": key}, timeout=60,
                      trust_env=False)
    assert r.status_code == 200, (s.url, op, r.status_code, r.text)
    return r.json()


def test_concurrent_contradicting_writes_across_replicas_leave_one_active_fact(replicas: Replicas) -> None:
    """30 writes of one single-valued (subject, predicate), released together and split across both
    replicas: one active row, the same one served by both, 29 superseded in one chain, none lost."""
    n = 30
    tenant, cid = provision(replicas)
    _, writer = replicas.key(tenant, "red", "w", 1)
    _, reader = replicas.key(tenant, "red", "r", 0)
    v = unit_vectors(n, seed=31)
    ids = [f"loc{i}" for i in range(n)]
    start = threading.Barrier(n)

    def write(i: int) -> int:
        body = {"ids": [ids[i]], "embeddings": [v[i]], "documents": [f"the deploy target is region-{i}"],
                "metadatas": [{"mw_scope": "fleet", "mw_subject": "deploy", "mw_predicate": "location",
                               "mw_object": f"region-{i}"}]}
        server = (replicas.a, replicas.b)[i % 2]
        start.wait(timeout=60)
        return httpx.post(data(server, tenant, cid, "add"), json=body, headers={"X-API-Key": writer}, timeout=60,
                          trust_env=False).status_code

    with ThreadPoolExecutor(max_workers=n) as pool:
        statuses = list(pool.map(write, range(n)))
    assert statuses == [200] * n
    where = {"$and": [{"mw_subject": "deploy"}, {"mw_predicate": "location"}]}
    active: dict[str, list[str]] = {}
    for s in (replicas.a, replicas.b):
        for key in (writer, reader):
            got = served(s, key, tenant, cid, "get", {"where": where})
            assert len(got["ids"]) == 1, (s.url, got["ids"])
            active.setdefault(s.url, []).append(got["ids"][0])
            assert served(s, key, tenant, cid, "count") == 1
            hits = served(s, key, tenant, cid, "query", {"query_embeddings": [v[0]], "n_results": n})["ids"][0]
            assert hits == got["ids"], s.url
            every = served(s, key, tenant, cid, "get", {"where": where}, "?include_superseded=true")["ids"]
            assert sorted(every) == sorted(ids), s.url
    winner = active[replicas.a.url][0]
    assert len(active) == 2 and all(x == winner for xs in active.values() for x in xs), active
    # The ledger knows all 30: one active, 29 superseded, linked into a single chain ending at the winner.
    ledger = replicas.ledger()
    try:
        rows = ledger.get_rows("chroma", cid, ids)
        fact = ledger.active_fact("chroma", tenant, "deploy", "location")
    finally:
        ledger.close()
    assert sorted(rows) == sorted(ids)
    assert Counter(r.status for r in rows.values()) == {"active": 1, "superseded": n - 1}
    assert fact is not None and fact.row_id == winner
    chain: list[str] = []
    current = rows[winner]
    while current.supersedes is not None:
        chain.append(current.supersedes[1])
        current = rows[current.supersedes[1]]
    assert sorted(chain + [winner]) == sorted(ids)  # serialised: every write superseded exactly its predecessor
    assert all(r.superseded_by is not None for r in rows.values() if r.status == "superseded")


def test_delete_through_a_cascades_to_a_row_derived_through_b(replicas: Replicas, chroma_server: Server) -> None:
    """A parent written and deleted through A, a row derived from it (``mw_derived_from``) written by
    another agent through B: after the delete neither is served by either replica, to anyone, on get,
    query or count (superseded rows included), and both are tombstoned in the ledger and gone from Chroma."""
    tenant, cid = provision(replicas)
    _, owner = replicas.key(tenant, "red", "w", 1)
    _, peer = replicas.key(tenant, "red", "peer", 1)
    _, mate = replicas.key(tenant, "red", "mate", 0)
    _, boss = replicas.key(tenant, "blue", "boss", 3)
    v = unit_vectors(3, seed=41)
    served(replicas.a, owner, tenant, cid, "add", {"ids": ["obs"], "embeddings": [v[0]], "documents": ["observation 42"],
                                                    "metadatas": [{"mw_scope": "fleet"}]})
    served(replicas.b, peer, tenant, cid, "add", {"ids": ["hyp"], "embeddings": [v[1]], "documents": ["hypothesis from 42"],
                                                   "metadatas": [{"mw_scope": "fleet", "mw_derived_from": "obs"}]})
    served(replicas.b, peer, tenant, cid, "add", {"ids": ["other"], "embeddings": [v[2]], "documents": ["unrelated note"],
                                                   "metadatas": [{"mw_scope": "fleet"}]})
    keys = (owner, peer, mate, boss)
    for s in (replicas.a, replicas.b):  # both rows are served before the delete
        got = served(s, mate, tenant, cid, "get", {"ids": ["obs", "hyp"]})
        assert sorted(got["ids"]) == ["hyp", "obs"] and served(s, mate, tenant, cid, "count") == 3
    assert served(replicas.a, owner, tenant, cid, "delete", {"ids": ["obs"]}) == {"deleted": 1}
    for s in (replicas.a, replicas.b):
        for key in keys:
            for query in ("", "?include_superseded=true"):
                assert served(s, key, tenant, cid, "get", {"ids": ["obs", "hyp"]}, query)["ids"] == [], (s.url, query)
                assert served(s, key, tenant, cid, "get", {}, query)["ids"] == ["other"], (s.url, query)
                hits = served(s, key, tenant, cid, "query", {"query_embeddings": [v[0], v[1]], "n_results": 3}, query)["ids"]
                assert hits == [["other"], ["other"]], (s.url, query)
                assert served(s, key, tenant, cid, "count", query=query) == 1, (s.url, query)
    ledger = replicas.ledger()
    try:
        statuses = {i: r.status for i, r in ledger.get_rows("chroma", cid, ["obs", "hyp", "other"]).items()}
    finally:
        ledger.close()
    assert statuses == {"obs": "deleted", "hyp": "deleted", "other": "active"}
    # and the derived row is gone from Chroma itself, not only hidden
    assert chroma_client(chroma_server.port, tenant).get_collection("mem").get(ids=["obs", "hyp"])["ids"] == []


def test_both_replicas_ready_on_postgres(replicas: Replicas) -> None:
    for s in (replicas.a, replicas.b):
        ready = s.readiness().json()
        assert ready["ready"] and ready["checks"]["ledger"]
        assert s.metrics_url is not None
        metrics = httpx.get(s.metrics_url, trust_env=False).text
        assert 'memwarden_ledger_pool_connections{state="size"}' in metrics
        # not on the API port: agents must not watch decision counters move
        assert httpx.get(s.url + "/_memwarden/metrics", trust_env=False).status_code == 401


def test_revocation_through_a_is_honoured_by_b_on_its_next_request(replicas: Replicas) -> None:
    tenant, _ = provision(replicas)
    key_id, key = replicas.key(tenant, "red", "w", 1)
    via_a = chroma_client(replicas.a.port, tenant, {"X-API-Key": key}).get_collection("mem")
    via_b = chroma_client(replicas.b.port, tenant, {"X-API-Key": key}).get_collection("mem")
    assert via_a.count() == 0 and via_b.count() == 0  # both replicas have served this key (warm)
    # The operator revokes with the CLI against the shared ledger (as on replica A's host).
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "keys", "revoke", key_id],
                         env={**os.environ, **replicas.env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    for s in (replicas.b, replicas.a):
        r = httpx.get(f"{s.url}/api/v2/tenants/{tenant}/databases/default_database/collections/{via_b.id}/count",
                       headers={"X-API-Key": key}, trust_env=False)
        assert r.status_code == 401, (s.name, r.text)


def test_delete_through_a_is_honoured_by_b_on_every_path(replicas: Replicas) -> None:
    tenant, _ = provision(replicas)
    _, writer = replicas.key(tenant, "red", "w", 1)
    _, reader = replicas.key(tenant, "red", "r", 0)
    v = unit_vectors(3, seed=7)
    a = chroma_client(replicas.a.port, tenant, {"X-API-Key": writer}).get_collection("mem")
    a.add(ids=["x", "y", "z"], embeddings=v, documents=["ex", "why", "zed"])
    b = chroma_client(replicas.b.port, tenant, {"X-API-Key": reader}).get_collection("mem")
    assert b.get(ids=["x", "y", "z"])["ids"] == ["x", "y", "z"] and b.count() == 3
    a.delete(ids=["y"])
    assert b.get(ids=["y"])["ids"] == []
    assert "y" not in b.get()["ids"] and b.count() == 2
    assert "y" not in b.query(query_embeddings=[v[1]], n_results=3)["ids"][0]
    with pytest.raises(Exception):  # the tombstone is shared: B refuses to re-create the id
        chroma_client(replicas.b.port, tenant, {"X-API-Key": writer}).get_collection("mem").add(
            ids=["y"], embeddings=[v[1]], documents=["again"])


def test_rescope_through_a_is_honoured_by_b(replicas: Replicas) -> None:
    tenant, _ = provision(replicas)
    _, owner = replicas.key(tenant, "red", "owner", 1)
    _, mate = replicas.key(tenant, "red", "mate", 0)
    v = unit_vectors(1, seed=9)
    a = chroma_client(replicas.a.port, tenant, {"X-API-Key": owner}).get_collection("mem")
    a.add(ids=["f"], embeddings=v, documents=["fleet fact"], metadatas=[{"mw_scope": "fleet"}])
    b = chroma_client(replicas.b.port, tenant, {"X-API-Key": mate}).get_collection("mem")
    assert b.get(ids=["f"])["ids"] == ["f"]
    a.update(ids=["f"], metadatas=[{"mw_scope": "agent"}])  # re-scoped to the owner only
    assert b.get(ids=["f"])["ids"] == [] and b.count() == 0
    assert b.query(query_embeddings=v, n_results=1)["ids"][0] == []


def test_a_new_key_created_after_start_works_on_both(replicas: Replicas) -> None:
    tenant, cid = provision(replicas)
    _, key = replicas.key(tenant, "blue", "late", 2)
    for s in (replicas.a, replicas.b):
        r = httpx.get(f"{s.url}/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}/count",
                       headers={"X-API-Key": key}, trust_env=False)
        assert r.status_code == 200 and r.json() == 0


def test_ledger_outage_denies_and_unreadies(pg_url: str, chroma_server: Server, tmp_path: Path) -> None:
    """A replica whose PostgreSQL goes away (here: its schema is dropped) denies and reports not ready."""
    import psycopg

    schema = fresh_schema()
    env = {"MEMWARDEN_LEDGER_URL": pg_url, "MEMWARDEN_LEDGER_SCHEMA": schema, "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0"}
    side = start_sidecar(chroma_server.url, tmp_path / "unused.db", POLICIES, extra_env=env)
    try:
        ledger = PostgresLedger(pg_url, schema=schema, max_size=1)
        _, key = ledger.create_key("agent", "t", "red", "a", 1)
        ledger.close()
        h = {"X-API-Key": key}
        assert httpx.get(side.url + "/api/v2/heartbeat", headers=h, trust_env=False).status_code == 200
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]
        r = httpx.get(side.url + "/api/v2/heartbeat", headers=h, trust_env=False)
        assert r.status_code == 500 and r.json()["error"] == "internal"
        ready = httpx.get(side.url + "/_memwarden/readyz", trust_env=False)
        assert ready.status_code in (200, 503)  # SELECT 1 still answers: the schema loss shows on requests
        assert side.metrics_url is not None
        metrics = httpx.get(side.metrics_url, trust_env=False).text
        assert 'memwarden_ledger_errors_total{method="authenticate"}' in metrics
    finally:
        side.stop()
