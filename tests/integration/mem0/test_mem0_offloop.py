"""The Mem0 profile's write paths make no blocking ledger call on the event loop on a PostgreSQL ledger:
every synchronous ledger call of add, update, delete, delete-all and a tenant reset runs in a worker thread
(`sidecar.ledger.offloop.call`, watched by `tests.integration.loopspy.LoopSpy`), and the answers are those
of the same requests on a SQLite ledger (inline by design)."""

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
from tests.integration.conftest import POLICIES
from tests.integration.loopspy import LoopSpy, serve
from tests.integration.mem0.conftest import MEM0_KEY
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def _keys(ledger: Any, tenant: str) -> dict[str, str]:
    return {"a": ledger.create_key("agent", tenant, "red", "a", 1)[1],
            "c": ledger.create_key("agent", tenant, "red", "c", 1)[1],
            "b": ledger.create_key("agent", tenant, "blue", "b", 1)[1],
            "admin": ledger.create_key("admin", tenant, None, None, 0)[1]}


async def _scenario(client: httpx.AsyncClient, keys: dict[str, str], spy: LoopSpy | None) -> list[tuple[str, int, Any]]:
    """Writes of every kind (and the reads that read the ledger beside their rows: search's filters, history's
    redaction, a named list), noting the ledger calls each made on the loop (none is the point)."""
    out: list[tuple[str, int, Any]] = []
    on_loop: dict[str, list[str]] = {}

    def h(who: str) -> dict[str, str]:
        return {"X-API-Key": keys[who]}

    async def step(label: str, method: str, url: str, who: str, **kw: Any) -> httpx.Response:
        if spy is not None:
            spy.reset()
        r = await client.request(method, url, headers=h(who), **kw)
        if spy is not None:
            on_loop[label] = spy.on_loop()
        body = r.json()
        if isinstance(body, dict) and isinstance(body.get("results"), list):
            body = {**body, "results": [{k: v for k, v in e.items() if k != "id"} for e in body["results"]]}
        out.append((label, r.status_code, body))
        return r

    def add_body(text: str, **meta: Any) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}], "infer": False, "metadata": meta}

    ids = []
    for i, text in enumerate(["alpha note", "beta note", "gamma note"]):
        r = await step(f"add{i}", "POST", "/memories", "a", json=add_body(text, mw_scope="fleet"))
        ids.append(r.json()["results"][0]["id"])
    await step("update-text", "PUT", f"/memories/{ids[0]}", "a", json={"text": "alpha changed"})
    await step("update-move", "PUT", f"/memories/{ids[0]}", "a", json={"metadata": {"mw_scope": "agent"}})
    await step("update-foreign", "PUT", f"/memories/{ids[1]}", "b", json={"text": "nope"})
    await step("update-readable-denied", "PUT", f"/memories/{ids[1]}", "c", json={"text": "nope"})
    await step("update-unknown", "PUT", f"/memories/{uuid.uuid4()}", "a", json={"text": "nope"})
    await step("search", "POST", "/search", "c", json={"query": "note", "top_k": 5, "threshold": 0.0,
                                                        "filters": {"agent_id": "a"}})
    out[-1] = (out[-1][0], out[-1][1], sorted(e["memory"] for e in out[-1][2]["results"]))
    await step("history", "GET", f"/memories/{ids[0]}/history", "a")
    out[-1] = (out[-1][0], out[-1][1], [(e.get("old_memory"), e.get("new_memory"), e.get("event")) for e in out[-1][2]])
    await step("list-named", "GET", "/memories", "c", params={"agent_id": "a"})
    out[-1] = (out[-1][0], out[-1][1], sorted(e["memory"] for e in out[-1][2]["results"]))
    await step("delete-denied", "DELETE", f"/memories/{ids[1]}", "c")
    await step("delete-unknown", "DELETE", f"/memories/{uuid.uuid4()}", "a")
    await step("delete", "DELETE", f"/memories/{ids[1]}", "a")
    await step("get-deleted", "GET", f"/memories/{ids[1]}", "a")
    await step("get-updated", "GET", f"/memories/{ids[0]}", "a")
    out[-1] = (out[-1][0], out[-1][1], {k: out[-1][2].get(k) for k in ("memory",)})
    await step("delete-all", "DELETE", "/memories", "a", params={"agent_id": "a"})
    await step("reset", "POST", "/reset", "admin")
    await step("list-after", "GET", "/memories", "a")
    if spy is not None:
        assert {label: calls for label, calls in on_loop.items() if calls} == {}
    return out


def test_writes_make_no_ledger_call_on_the_event_loop(mem0_server: Server, pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    base = dict(backend="mem0", backend_url=mem0_server.url, backend_token=MEM0_KEY, policies_dir=POLICIES,
                metrics_port=0, policy_watch_interval_s=0, reconcile_interval_s=0)
    schema = fresh_schema()
    raw = PostgresLedger(pg_url, schema=schema, min_size=0, max_size=2)
    spy = LoopSpy(raw)
    try:
        keys = _keys(raw, f"pg{uuid.uuid4().hex[:8]}")
        app = create_app(Settings(**base, ledger_url=pg_url, ledger_schema=schema), ledger=spy)  # type: ignore[arg-type]
        got = serve(app, spy, lambda client: _scenario(client, keys, spy))
        assert spy.off_loop()  # the calls were made, in worker threads
    finally:
        raw.close()
    sqlite = SQLiteLedger(tmp_path / "l.db")
    try:
        keys = _keys(sqlite, f"sq{uuid.uuid4().hex[:8]}")
    finally:
        sqlite.close()
    app = create_app(Settings(**base, ledger_path=tmp_path / "l.db"))  # type: ignore[arg-type]
    want = serve(app, None, lambda client: _scenario(client, keys, None))
    assert got == want
    assert [s for _, s, _ in got] == [200, 200, 200, 200, 200, 404, 403, 404, 200, 200, 200, 403, 404, 200, 404, 200, 200, 200, 200]
