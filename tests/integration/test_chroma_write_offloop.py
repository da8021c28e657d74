"""The Chroma profile's write paths make no blocking ledger call on the event loop on a PostgreSQL ledger:
add, upsert, update and delete (by id and by where) — their Cedar decisions (which read owners), provenance
checks, reservations, activations and tombstones — run every synchronous ledger call in a worker thread
(`sidecar.ledger.offloop.call`, watched by `tests.integration.loopspy.LoopSpy`), against a real Chroma; and
each answers as the same request does on a SQLite ledger (inline by design)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar import Settings, create_app
from memwarden_eval.harness import Server
from sidecar.ledger import SQLiteLedger
from sidecar.ledger.postgres import PostgresLedger
from tests.integration.conftest import POLICIES, unit_vectors
from tests.integration.loopspy import LoopSpy, serve
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

WRITES = {"add", "upsert", "update", "delete"}


def _keys(ledger: Any, tenant: str) -> dict[str, str]:
    return {"admin": ledger.create_key("admin", tenant, None, None, 0)[1],
            "a": ledger.create_key("agent", tenant, "red", "a", 2)[1],
            "c": ledger.create_key("agent", tenant, "red", "c", 1)[1],
            "b": ledger.create_key("agent", tenant, "blue", "b", 1)[1],
            "z": ledger.create_key("agent", tenant, "red", "z", 0)[1]}


async def _scenario(client: httpx.AsyncClient, tenant: str, keys: dict[str, str], spy: LoopSpy | None
                    ) -> list[tuple[str, int, Any]]:
    def h(who: str) -> dict[str, str]:
        return {"X-API-Key": keys[who]}

    assert (await client.post("/api/v2/tenants", json={"name": tenant}, headers=h("admin"))).status_code == 200
    db = f"/api/v2/tenants/{tenant}/databases"
    assert (await client.post(db, json={"name": "default_database"}, headers=h("admin"))).status_code == 200
    r = await client.post(f"{db}/default_database/collections", json={"name": "mem"}, headers=h("admin"))
    assert r.status_code == 200, r.text
    base = f"{db}/default_database/collections/{r.json()['id']}"
    out: list[tuple[str, int, Any]] = []
    on_loop: dict[str, list[str]] = {}

    async def step(label: str, op: str, who: str, body: dict[str, Any]) -> None:
        if spy is not None:
            spy.reset()
        r = await client.post(f"{base}/{op}", json=body, headers=h(who))
        if spy is not None and op in WRITES:
            on_loop[label] = spy.on_loop()
        got = r.json()
        if op == "get" and r.status_code == 200:
            got = sorted(zip(got["ids"], got["documents"], [m.get("mw_scope") for m in got["metadatas"]]))
        out.append((label, r.status_code, got))

    vec = unit_vectors(6)
    await step("add", "add", "a", {"ids": ["r1", "r2", "r3"], "embeddings": vec[:3], "documents": ["one", "two", "three"],
                                   "metadatas": [{"mw_scope": "fleet"}, {"mw_scope": "fleet"}, {"mw_scope": "agent"}]})
    await step("add-again", "add", "a", {"ids": ["r1"], "embeddings": vec[:1], "documents": ["one"]})
    await step("add-bad-governance", "add", "c", {"ids": ["c1"], "embeddings": vec[:1], "documents": ["x"],
                                                  "metadatas": [{"mw_scope": "tenant", "mw_readers": ["nobody"]}]})
    await step("add-denied", "add", "z", {"ids": ["z1"], "embeddings": vec[:1], "documents": ["x"],
                                          "metadatas": [{"mw_scope": "tenant"}]})
    await step("upsert", "upsert", "a", {"ids": ["r2", "r4"], "embeddings": vec[1:3], "documents": ["two v2", "four"]})
    await step("update-text", "update", "a", {"ids": ["r1"], "documents": ["one v2"]})
    await step("update-move", "update", "a", {"ids": ["r1"], "metadatas": [{"mw_scope": "agent"}]})
    await step("update-unknown", "update", "a", {"ids": ["nope"], "documents": ["x"]})
    await step("update-foreign", "update", "b", {"ids": ["r2"], "documents": ["x"]})
    await step("update-denied", "update", "c", {"ids": ["r2"], "documents": ["x"]})
    await step("delete-denied", "delete", "c", {"ids": ["r2"]})
    await step("delete-ids", "delete", "a", {"ids": ["r2", "nope"]})
    await step("delete-where", "delete", "a", {"where": {"mw_scope": "agent"}})
    await step("add-deleted-id", "add", "a", {"ids": ["r2"], "embeddings": vec[:1], "documents": ["back"]})
    await step("get", "get", "a", {"include": ["documents", "metadatas"]})
    if spy is not None:
        assert {label: calls for label, calls in on_loop.items() if calls} == {}
    return out


def test_writes_make_no_ledger_call_on_the_event_loop(chroma_server: Server, pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    base = dict(backend_url=chroma_server.url, policies_dir=POLICIES, metrics_port=0, policy_watch_interval_s=0,
                reconcile_interval_s=0)
    schema = fresh_schema()
    raw = PostgresLedger(pg_url, schema=schema, min_size=0, max_size=2)
    spy = LoopSpy(raw)
    try:
        tenant = f"pg{uuid.uuid4().hex[:8]}"
        keys = _keys(raw, tenant)
        app = create_app(Settings(**base, ledger_url=pg_url, ledger_schema=schema), ledger=spy)  # type: ignore[arg-type]
        got = serve(app, spy, lambda client: _scenario(client, tenant, keys, spy))
        assert spy.off_loop()  # the calls were made, in worker threads
    finally:
        raw.close()
    sqlite = SQLiteLedger(tmp_path / "l.db")
    try:
        tenant = f"sq{uuid.uuid4().hex[:8]}"
        keys = _keys(sqlite, tenant)
    finally:
        sqlite.close()
    app = create_app(Settings(**base, ledger_path=tmp_path / "l.db"))  # type: ignore[arg-type]
    want = serve(app, None, lambda client: _scenario(client, tenant, keys, None))
    assert got == want
    assert [(label, status) for label, status, _ in got if status != 200] == [
        ("add-again", 409), ("add-bad-governance", 400), ("add-denied", 403), ("update-unknown", 404),
        ("update-foreign", 404), ("update-denied", 403), ("delete-denied", 403), ("add-deleted-id", 409)]
    answers = {label: body for label, _, body in got}
    assert answers["get"] == [("r4", "four", "fleet")], answers


@pytest.mark.parametrize("failing", ["reserve_rows", "content_copies", "activate_rows", "tombstone"])
def test_a_ledger_failure_on_a_write_denies_with_503_and_serves_nothing(chroma_server: Server, pg_url: str,  # noqa: F811
                                                                        failing: str) -> None:
    """The ledger fails (psycopg OperationalError) at one step of a write: 503 ``ledger_unavailable``, and
    the rows of the failed write are not served afterwards (a failed delete's rows still are)."""
    schema = fresh_schema()
    raw = PostgresLedger(pg_url, schema=schema, min_size=0, max_size=2)
    spy = LoopSpy(raw)
    tenant = f"f{uuid.uuid4().hex[:8]}"
    try:
        keys = _keys(raw, tenant)
        app = create_app(Settings(backend_url=chroma_server.url, policies_dir=POLICIES, metrics_port=0,  # type: ignore[arg-type]
                                  policy_watch_interval_s=0, reconcile_interval_s=0, ledger_url=pg_url,
                                  ledger_schema=schema), ledger=spy)

        async def scenario(client: httpx.AsyncClient) -> None:
            h = {"X-API-Key": keys["admin"]}
            db = f"/api/v2/tenants/{tenant}/databases"
            await client.post("/api/v2/tenants", json={"name": tenant}, headers=h)
            await client.post(db, json={"name": "default_database"}, headers=h)
            cid = (await client.post(f"{db}/default_database/collections", json={"name": "mem"}, headers=h)).json()["id"]
            base = f"{db}/default_database/collections/{cid}"
            a = {"X-API-Key": keys["a"]}
            r = await client.post(f"{base}/add", json={"ids": ["k1"], "embeddings": unit_vectors(1), "documents": ["kept"]}, headers=a)
            assert r.status_code == 200
            spy.fail = {failing}
            if failing == "tombstone":
                r = await client.post(f"{base}/delete", json={"ids": ["k1"]}, headers=a)
            else:
                r = await client.post(f"{base}/add", json={"ids": ["n1"], "embeddings": unit_vectors(1, seed=2),
                                                           "documents": ["new"]}, headers=a)
            assert r.status_code == 503 and r.json()["error"] == "ledger_unavailable", r.text
            spy.fail = set()
            got = await client.post(f"{base}/get", json={"include": ["documents"]}, headers=a)
            assert got.status_code == 200 and got.json()["ids"] == ["k1"], got.text
        serve(app, spy, scenario)
    finally:
        raw.close()
