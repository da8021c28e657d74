"""One ledger round trip per read on PostgreSQL: two real `memwarden serve` replicas on one PostgreSQL schema —
A with the hot-path reads in a worker thread (``MEMWARDEN_LEDGER_ASYNC=false``), B on psycopg's asynchronous
pool — in front of one Chroma. A warm get/query/count makes exactly one `read_rows` call (the key re-check, the
rows and their owners in one statement), plus, for a read under the visibility filter, the listing of the
admitted rows (`visible_row_ids`, the id-list form of the filter; none with ``ID_PUSHDOWN_MAX=0``), both replicas answer exactly alike, and a key revoked
behind the replicas' backs (no notification reaches them, so the principal they verified is still in memory)
fails the very next request with 401 on every read path, nothing served."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import psycopg
import pytest

from sidecar.harness import Server, start_sidecar
from sidecar.ledger.postgres import PostgresLedger
from tests.integration.conftest import POLICIES, admin_client, chroma_client, unit_vectors
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


class Pair:
    def __init__(self, a: Server, b: Server, url: str, schema: str) -> None:
        self.a, self.b, self.url, self.schema = a, b, url, schema
        self.tenant = f"one{uuid.uuid4().hex[:8]}"
        _, admin = self.key("admin")
        _, writer = self.key("agent", "red", "w")
        admin_client(a.port, {"X-API-Key": admin}).create_tenant(self.tenant)
        admin_client(a.port, {"X-API-Key": admin}).create_database("default_database", tenant=self.tenant)
        self.cid = str(chroma_client(a.port, self.tenant, {"X-API-Key": admin}).create_collection("mem").id)
        coll = chroma_client(a.port, self.tenant, {"X-API-Key": writer}).get_collection("mem")
        coll.add(ids=[f"f{i}" for i in range(12)], embeddings=unit_vectors(12), documents=[f"fleet {i}" for i in range(12)],
                 metadatas=[{"mw_scope": "fleet"}] * 12)
        coll.add(ids=[f"p{i}" for i in range(6)], embeddings=unit_vectors(6, seed=3), documents=[f"own {i}" for i in range(6)],
                 metadatas=[{"mw_scope": "agent"}] * 6)

    def key(self, kind: str, fleet: str | None = None, agent: str | None = None, trust: int = 1) -> tuple[str, str]:
        ledger = PostgresLedger(self.url, schema=self.schema, min_size=0, max_size=1)
        try:
            rec, key = ledger.create_key(kind, self.tenant, fleet, agent, trust)
        finally:
            ledger.close()
        return rec.key_id, key

    def silent_revoke(self, key_id: str) -> None:
        """Revoke without the notification `revoke_key` sends: the replicas' caches are not told."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'UPDATE "{self.schema}".api_keys SET revoked_at = 1 WHERE key_id = %s', (key_id,))  # type: ignore[arg-type]

    def call(self, side: Server, key: str, op: str, collection: str | None = None) -> httpx.Response:
        base = f"{side.url}/api/v2/tenants/{self.tenant}/databases/default_database/collections/{collection or self.cid}"
        h = {"X-API-Key": key}
        if op == "count":
            return httpx.get(f"{base}/count", headers=h, timeout=30, trust_env=False)
        if op == "query":
            body = {"query_embeddings": unit_vectors(1, seed=9), "n_results": 5, "include": ["documents", "distances"]}
            return httpx.post(f"{base}/query", json=body, headers=h, timeout=30, trust_env=False)
        ids = {"get": ["f1", "f2", "p1", "zz"], "get-none": ["zz", "yy"], "get-all": None}[op]
        return httpx.post(f"{base}/get", json={"ids": ids, "include": ["documents", "metadatas"]}, headers=h,
                          timeout=30, trust_env=False)


def ledger_calls(side: Server) -> dict[str, float]:
    """Ledger calls by method, less the background statistics task (`refresh_statistics`, every 60 s), which
    no request makes."""
    assert side.metrics_url is not None
    text = httpx.get(side.metrics_url, timeout=10, trust_env=False).text
    return {m: float(v) for m, v in re.findall(r'^memwarden_ledger_call_duration_seconds_count\{method="([^"]+)"\} (\S+)$', text, re.M)
            if m != "refresh_statistics"}


@pytest.fixture(scope="module")
def pair(pg_url: str, chroma_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:  # noqa: F811
    schema = fresh_schema()
    tmp: Path = tmp_path_factory.mktemp("onetrip")
    env = {"MEMWARDEN_LEDGER_URL": pg_url, "MEMWARDEN_LEDGER_SCHEMA": schema, "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
           "MEMWARDEN_LEDGER_POOL_MIN": "0", "MEMWARDEN_LEDGER_POOL_MAX": "2", "MEMWARDEN_LEDGER_CACHE_TTL_S": "60"}
    a = start_sidecar(chroma_server.url, tmp / "a.db", POLICIES, extra_env={**env, "MEMWARDEN_LEDGER_ASYNC": "false"})
    try:
        b = start_sidecar(chroma_server.url, tmp / "b.db", POLICIES, extra_env={**env, "MEMWARDEN_LEDGER_ASYNC": "true"})
    except BaseException:
        a.stop()
        raise
    try:
        yield Pair(a, b, pg_url, schema)
    finally:
        a.stop()
        b.stop()


OPS = ["get", "get-none", "get-all", "query", "count"]
PUSHED = ["get-all", "query", "count"]  # the reads of OPS under the visibility filter (sent as the ledger's id list)


def test_both_paths_answer_alike_with_one_ledger_call_per_read(pair: Pair) -> None:
    _, key = pair.key("agent", "red", "r")  # reads the fleet rows, not another agent's own rows
    for side in (pair.a, pair.b):
        for op in OPS:  # the first verifies the key fully (kept for the next reads); the planner's statistics
            pair.call(side, key, op)
    answers = {}
    for side in (pair.a, pair.b):
        before = ledger_calls(side)
        answers[side.port] = [(r.status_code, r.json()) for r in (pair.call(side, key, op) for op in OPS)]
        after = ledger_calls(side)
        delta = {m: after.get(m, 0) - before.get(m, 0) for m in after if after.get(m, 0) != before.get(m, 0)}
        # no authenticate, no get_rows/agent_entities of their own; the reads that push the visibility filter
        # down (get without ids, count, the query's pushdown) list the admitted rows first (`visible_row_ids`)
        assert delta == {"read_rows": len(OPS), "visible_row_ids": len(PUSHED)}, delta
    a, b = answers[pair.a.port], answers[pair.b.port]
    assert a == b
    got = dict(zip(OPS, a))
    assert got["get"][0] == 200 and sorted(got["get"][1]["ids"]) == ["f1", "f2"]
    assert got["get-none"] == (200, got["get-none"][1]) and got["get-none"][1]["ids"] == []
    assert sorted(got["get-all"][1]["ids"]) == sorted(f"f{i}" for i in range(12))
    assert got["query"][0] == 200 and len(got["query"][1]["ids"][0]) == 5 and all(i.startswith("f") for i in got["query"][1]["ids"][0])
    assert got["count"] == (200, 12)


@pytest.mark.parametrize("op", OPS + ["unknown-collection"])
def test_a_key_revoked_behind_the_replicas_back_fails_the_next_read(pair: Pair, op: str) -> None:
    """The principal is still in each replica's memory (no notification came), yet the next read is 401 with
    no rows: the key is re-checked in the statement that reads the rows (or, when the read needs none, by
    itself before the answer) — an unknown collection is 401, not 404."""
    key_id, key = pair.key("agent", "red", f"v{uuid.uuid4().hex[:6]}")
    for side in (pair.a, pair.b):
        assert pair.call(side, key, "get").status_code == 200  # verified and kept
    pair.silent_revoke(key_id)
    for side in (pair.a, pair.b):
        r = (pair.call(side, key, "get", collection=str(uuid.uuid4())) if op == "unknown-collection"
             else pair.call(side, key, op))
        assert r.status_code == 401, (side.port, op, r.status_code, r.text)
        assert r.json()["error"] == "unauthenticated" and "ids" not in r.json()
        assert pair.call(side, key, op if op != "unknown-collection" else "get").status_code == 401  # and stays so


def test_a_revoked_key_is_refused_on_writes_too(pair: Pair) -> None:
    """Writes never use a kept principal: each verifies the key before it does anything."""
    key_id, key = pair.key("agent", "red", f"x{uuid.uuid4().hex[:6]}")
    for side in (pair.a, pair.b):
        assert pair.call(side, key, "get").status_code == 200
    pair.silent_revoke(key_id)
    for side in (pair.a, pair.b):
        url = f"{side.url}/api/v2/tenants/{pair.tenant}/databases/default_database/collections/{pair.cid}/add"
        r = httpx.post(url, json={"ids": ["new1"], "embeddings": unit_vectors(1), "documents": ["x"]},
                       headers={"X-API-Key": key}, timeout=30, trust_env=False)
        assert r.status_code == 401
    _, reader = pair.key("agent", "red", "r2")
    r = pair.call(pair.b, reader, "get")
    assert r.status_code == 200 and "new1" not in r.json()["ids"]


def test_inline_ledger_calls_are_one_trip_too(pair: Pair, chroma_server: Server, tmp_path: Path) -> None:
    """With ``LEDGER_OFF_LOOP=false`` (PostgreSQL calls inline on the loop) and the visibility filter always as
    Chroma's metadata filter (``ID_PUSHDOWN_MAX=0``), a warm read is one `read_rows` statement, with the same
    answers as a replica that sends the id list."""
    env = {"MEMWARDEN_LEDGER_URL": pair.url, "MEMWARDEN_LEDGER_SCHEMA": pair.schema, "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
           "MEMWARDEN_LEDGER_POOL_MIN": "0", "MEMWARDEN_LEDGER_POOL_MAX": "1", "MEMWARDEN_LEDGER_CACHE_TTL_S": "60",
           "MEMWARDEN_LEDGER_OFF_LOOP": "false", "MEMWARDEN_ID_PUSHDOWN_MAX": "0"}
    c = start_sidecar(chroma_server.url, tmp_path / "c.db", POLICIES, extra_env=env)
    try:
        _, key = pair.key("agent", "red", f"i{uuid.uuid4().hex[:6]}")
        for op in OPS:
            pair.call(c, key, op)
        before = ledger_calls(c)
        got = [(r.status_code, r.json()) for r in (pair.call(c, key, op) for op in OPS)]
        after = ledger_calls(c)
        want = [(r.status_code, r.json()) for r in (pair.call(pair.a, key, op) for op in OPS)]
    finally:
        c.stop()
    delta = {m: after.get(m, 0) - before.get(m, 0) for m in after if after.get(m, 0) != before.get(m, 0)}
    assert delta == {"read_rows": len(OPS)}, delta
    assert got == want


@pytest.mark.parametrize("op", OPS)
def test_a_failed_deferred_recheck_is_logged_as_a_first_check_401(pair: Pair, op: str) -> None:
    """The deferred re-check's 401 is logged as unauthenticated exactly as an unknown key's 401 is: no
    principal, key, operation, action, decision detail or row counts of the kept principal."""
    import json
    import time

    def decision(log: Path, request_id: str) -> dict:
        for _ in range(100):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("{") and f'"request_id":"{request_id}"' in line:
                    event = json.loads(line)
                    if event.get("event") == "decision":
                        return dict(event)
            time.sleep(0.05)
        raise AssertionError(f"no decision line for {request_id}")

    key_id, key = pair.key("agent", "red", f"l{uuid.uuid4().hex[:6]}")
    assert pair.call(pair.a, key, "get").status_code == 200
    pair.silent_revoke(key_id)
    revoked = pair.call(pair.a, key, op)
    unknown = pair.call(pair.a, "mw_" + "0" * 40, op)
    assert revoked.status_code == unknown.status_code == 401
    lines = [decision(pair.a.log, r.headers["x-request-id"]) for r in (revoked, unknown)]
    for line in lines:
        for field in ("request_id", "latency_us", "timestamp"):
            line.pop(field, None)
    assert lines[0] == lines[1] and lines[0]["principal"] is None and lines[0]["key_id"] is None
