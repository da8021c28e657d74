"""One ledger round trip per read on PostgreSQL: two real `memwarden serve` replicas on one PostgreSQL schema —
A with the hot-path reads in a worker thread (``MEMWARDEN_LEDGER_ASYNC=false``), B on psycopg's asynchronous
pool — in front of one Chroma. A warm get/query/count makes exactly one ledger statement: `read_rows` (the key
re-check, the rows and their owners) for a read by ids or an over-fetched query, `visible_rows` (the admitted
rows' ids listed with those rows, their owners and the key re-check) for a get without ids or a count when few
rows are admitted; a query under the id list makes two (the list, then the rows Chroma returned, read after it
answered), as a get without ids or a count does with ``ID_PUSHDOWN_INLINE_MAX=0``; both replicas
answer exactly alike, and a key revoked behind the replicas' backs (no notification reaches them, so the
principal they verified is still in memory) fails the very next request with 401 on every read path, nothing
served."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import psycopg
import pytest

from memwarden_eval.harness import Server, start_sidecar
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
        _, blue = self.key("agent", "blue", "w")
        chroma_client(a.port, self.tenant, {"X-API-Key": blue}).get_collection("mem").add(
            ids=["b0", "b1"], embeddings=unit_vectors(2, seed=5), documents=["blue 0", "blue 1"],
            metadatas=[{"mw_scope": "fleet"}] * 2)

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
# The one ledger statement of each warm read by a reader of the 12 red fleet rows (of 20): reads by ids and the
# query (whose over-fetch holds its top 5: no pushdown) read their rows (`read_rows`); the reads under the
# visibility filter (get without ids, count) list the 12 admitted rows and read them in one (`visible_rows`).
ONE_STATEMENT = {"get": "read_rows", "get-none": "read_rows", "get-all": "visible_rows", "query": "read_rows",
                 "count": "visible_rows"}
# ... except the query: with few rows admitted and content asked for, it is sent under the ledger's id list
# (`_id_list_expected`: one Chroma fetch with content instead of an over-fetch of stamps and a second fetch of
# content), and reads the rows Chroma returned after it answered, never before (docs/design.md §2.7): two.
PER_READ = {**{op: {s: 1} for op, s in ONE_STATEMENT.items()}, "query": {"visible_row_ids": 1, "read_rows": 1}}


def per_read_calls(pair: Pair, side: Server, key: str, ops: list[str]
                   ) -> tuple[list[tuple[int, object]], list[dict[str, float]]]:
    """Each read of `ops` made once by `key` on `side`: (its answers, the ledger calls each made)."""
    answers, calls = [], []
    for op in ops:
        before = ledger_calls(side)
        r = pair.call(side, key, op)
        answers.append((r.status_code, r.json()))
        after = ledger_calls(side)
        calls.append({m: after.get(m, 0) - before.get(m, 0) for m in after if after.get(m, 0) != before.get(m, 0)})
    return answers, calls


def test_both_paths_answer_alike_with_one_ledger_call_per_read(pair: Pair) -> None:
    _, key = pair.key("agent", "red", "r")  # reads the fleet rows, not another agent's own rows
    for side in (pair.a, pair.b):
        for op in OPS:  # the first verifies the key fully (kept for the next reads); the planner's statistics
            pair.call(side, key, op)
    answers = {}
    for side in (pair.a, pair.b):
        answers[side.port], calls = per_read_calls(pair, side, key, OPS)
        # no authenticate, no get_rows/agent_entities of their own, no second statement
        assert calls == [PER_READ[op] for op in OPS], calls
    a, b = answers[pair.a.port], answers[pair.b.port]
    assert a == b
    got = dict(zip(OPS, a))
    assert got["get"][0] == 200 and sorted(got["get"][1]["ids"]) == ["f1", "f2"]
    assert got["get-none"] == (200, got["get-none"][1]) and got["get-none"][1]["ids"] == []
    assert sorted(got["get-all"][1]["ids"]) == sorted(f"f{i}" for i in range(12))
    assert got["query"][0] == 200 and len(got["query"][1]["ids"][0]) == 5 and all(i.startswith("f") for i in got["query"][1]["ids"][0])
    assert got["count"] == (200, 12)


def test_a_read_of_few_admitted_rows_is_one_statement(pair: Pair, chroma_server: Server, tmp_path: Path) -> None:
    """A reader of the 2 blue fleet rows (of 20). A get without ids and a count, which read every listed row anyway,
    list the admitted rows and read them in one statement (`visible_rows`) on both replicas. Its query (pushed
    down from the start: 10 % readable) lists them (`visible_row_ids`) and reads the rows Chroma returned after
    Chroma answered (`read_rows`): a row's content and scope may change in between, and the content it returns
    must be decided on the scope read after it. A replica with ``ID_PUSHDOWN_INLINE_MAX=0`` answers the same with
    two statements for each."""
    env = {"MEMWARDEN_LEDGER_URL": pair.url, "MEMWARDEN_LEDGER_SCHEMA": pair.schema, "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0",
           "MEMWARDEN_LEDGER_POOL_MIN": "0", "MEMWARDEN_LEDGER_POOL_MAX": "1", "MEMWARDEN_LEDGER_CACHE_TTL_S": "60",
           "MEMWARDEN_ID_PUSHDOWN_INLINE_MAX": "0"}
    c = start_sidecar(chroma_server.url, tmp_path / "c.db", POLICIES, extra_env=env)
    two = {"visible_row_ids": 1, "read_rows": 1}
    try:
        _, key = pair.key("agent", "blue", f"r{uuid.uuid4().hex[:6]}")
        ops = ["query", "get-all", "count"]
        answers = {}
        for side, want in ((pair.a, [two, {"visible_rows": 1}, {"visible_rows": 1}]),
                           (pair.b, [two, {"visible_rows": 1}, {"visible_rows": 1}]), (c, [two, two, two])):
            for op in ops:
                pair.call(side, key, op)
            answers[side.port], calls = per_read_calls(pair, side, key, ops)
            assert calls == want, (side.port, calls)
    finally:
        c.stop()
    a, b, two = answers.values()
    assert a == b == two
    query, get_all, count = a
    assert query[0] == 200 and sorted(query[1]["ids"][0]) == ["b0", "b1"]  # type: ignore[index]
    assert get_all[0] == 200 and sorted(get_all[1]["ids"]) == ["b0", "b1"]  # type: ignore[index]
    assert count == (200, 2)


def test_a_list_longer_than_the_counts_said_is_listed_again_without_rows(pair: Pair) -> None:
    """Replica A's planner keeps a collection's counts for 30 s: 2 blue rows. 70 more are written through replica
    B meanwhile, so A's one statement finds more than ``ID_PUSHDOWN_INLINE_MAX`` (64) admitted rows: A lists them
    again without their rows (`visible_row_ids`) and reads the rows Chroma returns (`read_rows`) — every blue row
    served, none other, as B serves them."""
    _, admin = pair.key("admin")
    cid = str(chroma_client(pair.a.port, pair.tenant, {"X-API-Key": admin}).create_collection("stale").id)
    _, writer = pair.key("agent", "blue", f"w{uuid.uuid4().hex[:6]}")
    _, other = pair.key("agent", "red", f"w{uuid.uuid4().hex[:6]}")
    coll = chroma_client(pair.b.port, pair.tenant, {"X-API-Key": writer}).get_collection("stale")
    coll.add(ids=["b0", "b1"], embeddings=unit_vectors(2, seed=7), documents=["b0", "b1"], metadatas=[{"mw_scope": "fleet"}] * 2)
    chroma_client(pair.b.port, pair.tenant, {"X-API-Key": other}).get_collection("stale").add(
        ids=["r0"], embeddings=unit_vectors(1, seed=8), documents=["r0"], metadatas=[{"mw_scope": "fleet"}])
    _, key = pair.key("agent", "blue", f"r{uuid.uuid4().hex[:6]}")
    pair.call(pair.a, key, "query", collection=cid)  # A reads and keeps the counts
    for want in ({"visible_rows": 1}, {"visible_rows": 1, "visible_row_ids": 1, "read_rows": 1}):
        if "read_rows" in want:
            more = [f"m{i}" for i in range(70)]
            coll.add(ids=more, embeddings=unit_vectors(70, seed=9), documents=more, metadatas=[{"mw_scope": "fleet"}] * 70)
        before = ledger_calls(pair.a)
        r = pair.call(pair.a, key, "get-all", collection=cid)
        after = ledger_calls(pair.a)
        assert {m: after.get(m, 0) - before.get(m, 0) for m in after if after.get(m, 0) != before.get(m, 0)} == want
        assert r.status_code == 200
        assert r.json() == pair.call(pair.b, key, "get-all", collection=cid).json()
    assert sorted(r.json()["ids"]) == sorted(["b0", "b1", *more])


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
    principal, operation, action, decision detail or row counts of the kept principal; only the key id the
    presented credential names (logged before any check, issue 34 finding 4) and the client address differ."""
    import json
    import time

    def decision(log: Path, request_id: str) -> dict:
        for _ in range(100):
            for line in log.read_text(errors="replace").split("\n")[:-1]:  # lines written whole
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
    unknown_id = uuid.uuid4().hex[:16]
    unknown = pair.call(pair.a, f"mwk_{unknown_id}.{'0' * 40}", op)  # well formed, no such key
    assert revoked.status_code == unknown.status_code == 401
    lines = [decision(pair.a.log, r.headers["x-request-id"]) for r in (revoked, unknown)]
    assert (lines[0]["key_id"], lines[1]["key_id"]) == (key_id, unknown_id)
    for line in lines:
        for field in ("request_id", "latency_us", "timestamp", "client", "key_id"):
            line.pop(field, None)
    assert lines[0] == lines[1] and lines[0]["principal"] is None and lines[0]["reason"] == "not_authenticated"
