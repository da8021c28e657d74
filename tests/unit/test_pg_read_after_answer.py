"""A query under the ledger's id list decides the rows the backend returned on ledger rows read after the backend
answered, on PostgreSQL too, where the list and the rows could come from one statement (`visible_rows`): an update
that rewrites a row's content in Chroma and narrows its scope in the ledger may complete between the list and the
answer, and the new content must not be served on the old scope (the stamp check, docs/design.md §2.6, guards it
too: `tests/unit/test_update_race.py`). A get without ids and a count, which read their listed rows early anyway,
take the one statement. Real PostgreSQL ledger (`tests.pgutil`); the backend is an `httpx.MockTransport` that
narrows the row while it "answers", and answers the content stamped as the update stamps it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.backends.chroma import stamp
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord
from sidecar.ledger.postgres import PostgresLedger
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "33333333-3333-3333-3333-333333333333"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"


class NotingLedger(PostgresLedger):
    """PostgreSQL ledger noting which of its hot-path reads each request makes."""

    calls: list[str]

    def visible_rows(self, *a: Any, **k: Any) -> Any:
        self.calls.append("visible_rows")
        return super().visible_rows(*a, **k)

    async def visible_rows_async(self, *a: Any, **k: Any) -> Any:
        self.calls.append("visible_rows")
        return await super().visible_rows_async(*a, **k)

    def visible_row_ids(self, *a: Any, **k: Any) -> Any:
        self.calls.append("visible_row_ids")
        return super().visible_row_ids(*a, **k)

    def read_rows(self, *a: Any, **k: Any) -> Any:
        self.calls.append("read_rows")
        return super().read_rows(*a, **k)

    async def read_rows_async(self, *a: Any, **k: Any) -> Any:
        self.calls.append("read_rows")
        return await super().read_rows_async(*a, **k)


@pytest.fixture(params=[False, True], ids=["thread", "async"])
def world(request: pytest.FixtureRequest, pg_url: str) -> Iterator[tuple[TestClient, NotingLedger, str, Row, list[str]]]:  # noqa: F811
    ledger = NotingLedger(pg_url, schema=fresh_schema(), min_size=0, max_size=2)
    ledger.calls = []
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    _, key = ledger.create_key("agent", "t", "blue", "r", 1)
    x = Row("chroma", CID, "x", "t", "blue", "t/blue/w", "fleet", "t/blue/w", 1)  # readable by t/blue/r: its fleet's
    others = [Row("chroma", CID, f"o{i}", "t", "red", "t/red/o", "agent", "t/red/o", 1) for i in range(19)]
    ledger.reserve_rows([x, *others])
    ledger.activate_rows("chroma", CID, ["x", *(r.row_id for r in others)])
    events: list[str] = []

    def reply(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path.endswith(("/query", "/get")):
            events.append(path.rsplit("/", 1)[1])
            if path.endswith("/query"):
                # the concurrent update lands now: Chroma has the new content, the ledger the narrowed scope
                narrowed = dataclasses.replace(x, scope="agent")  # now t/blue/w's own row only
                ledger.update_governance([narrowed])
                return httpx.Response(200, json={"ids": [["x"]], "documents": [["new content, narrowed"]],
                                                 "metadatas": [[stamp({}, narrowed)]], "distances": [[0.1]],
                                                 "included": ["documents", "metadatas", "distances"]})
            return httpx.Response(200, json={"ids": ["x"], "documents": ["content"],
                                             "metadatas": [stamp({}, x)], "included": ["documents", "metadatas"]})
        return httpx.Response(404, json={"error": "NotFound"})

    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", reconcile_interval_s=0,
                              policy_watch_interval_s=0, ledger_async=request.param),
                     transport=httpx.MockTransport(reply), ledger=ledger)
    try:
        with TestClient(app) as client:
            yield client, ledger, key, x, events
    finally:
        ledger.close()


def test_a_query_decides_on_rows_read_after_the_backend_answered(world: Any) -> None:
    client, ledger, key, x, events = world
    got = client.post(f"{BASE}/query", json={"query_embeddings": [[0.1, 0.2]], "n_results": 1,
                                             "include": ["documents", "distances"]}, headers={"X-API-Key": key})
    assert got.status_code == 200, got.text
    assert events == ["query"]  # pushed down (1 of 20 rows readable): one backend call, under the id list
    assert got.json()["ids"] == [[]] and "new content, narrowed" not in got.text
    assert "visible_rows" not in ledger.calls and ledger.calls[-2:] == ["visible_row_ids", "read_rows"]


def test_a_whole_get_takes_the_one_statement(world: Any) -> None:
    """A get without ids, filter or limit reads its listed rows early anyway (`_scan`'s early read): with the
    planner's counts kept (by a first query) it lists and reads them in one statement, and reads nothing after."""
    client, ledger, key, x, events = world
    client.post(f"{BASE}/query", json={"query_embeddings": [[0.1, 0.2]], "n_results": 1}, headers={"X-API-Key": key})
    ledger.update_governance([x])  # readable again
    ledger.calls.clear()
    got = client.post(f"{BASE}/get", json={"include": ["documents"]}, headers={"X-API-Key": key})
    assert got.status_code == 200, got.text
    assert ledger.calls == ["visible_rows"]
    assert got.json()["ids"] == ["x"]
