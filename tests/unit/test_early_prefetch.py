"""A Chroma get by ids reads its ledger rows while Chroma answers (`Authorizer.start_prefetch`), not after:
the answer is unchanged (same rows served, the same rows withheld for the same reasons), a failing backend
still answers its own error, and a ledger that fails during the early read denies the whole read
(nothing served). The backend is an `httpx.MockTransport` whose handler waits, so the order of the two
reads is observable; the ledger is a real SQLite ledger with its reads noted."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.backends.chroma import stamp
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "22222222-2222-2222-2222-222222222222"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"


class NotingLedger(SQLiteLedger):
    """SQLite ledger noting each `get_rows` (and able to fail it, as a broken ledger would)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads: list[list[str]] = []
        self.fail = False

    def get_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> dict[str, Row]:
        self.reads.append(list(row_ids))
        if self.fail:
            raise sqlite3.OperationalError("disk I/O error")
        return super().get_rows(backend, collection_id, row_ids)


ROWS = {r.row_id: r for r in (Row("chroma", CID, "mine", "t", "red", "t/red/a", "agent", "t/red/a", 1),
                               Row("chroma", CID, "fleet", "t", "red", "t/red/b", "fleet", "t/red/b", 1),
                               Row("chroma", CID, "theirs", "t", "blue", "t/blue/c", "agent", "t/blue/c", 1),
                               Row("chroma", CID, "gone", "t", "red", "t/red/a", "agent", "t/red/a", 1))}


def world(tmp_path: Path, reply: Any, **settings: Any) -> tuple[TestClient, NotingLedger, str]:
    ledger = NotingLedger(tmp_path / "l.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    rows = list(ROWS.values())
    ledger.reserve_rows(rows)
    ledger.activate_rows("chroma", CID, [r.row_id for r in rows])
    ledger.tombstone("chroma", CID, ["gone"], "t/red/a", "req")
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", reconcile_interval_s=0,
                              policy_watch_interval_s=0, **settings), transport=httpx.MockTransport(reply), ledger=ledger)
    return TestClient(app), ledger, key


def chroma_rows(ids: list[str]) -> dict[str, Any]:
    # each row's metadata as the sidecar stamped it (`stamp`); an id the ledger does not know, a client's own
    return {"ids": ids, "documents": [f"doc {i}" for i in ids],
            "metadatas": [stamp({"k": i}, ROWS[i]) if i in ROWS else {"k": i} for i in ids],
            "included": ["documents", "metadatas"]}


def test_the_ledger_is_read_while_chroma_answers_and_the_answer_is_unchanged(tmp_path: Path) -> None:
    asked = ["mine", "fleet", "theirs", "gone", "unknown"]
    order: list[str] = []

    async def reply(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)  # Chroma takes its time: the early ledger read runs meanwhile
        order.append(f"backend answered after {len(ledger.reads)} ledger reads")
        return httpx.Response(200, json=chroma_rows(asked))

    client, ledger, key = world(tmp_path, reply)
    # (Chroma's default include holds documents: the ledger read then comes before Chroma is asked, for the
    # readable ids only — `ChromaProfile._scan_named`; without content it runs while Chroma answers.)
    got = client.post(f"{BASE}/get", json={"ids": asked}, headers={"X-API-Key": key})
    assert got.status_code == 200, got.text
    assert sorted(got.json()["ids"]) == ["fleet", "mine"]  # own row, fleet row; not another fleet's, not the deleted
    assert order == ["backend answered after 1 ledger reads"]
    assert ledger.reads == [asked]  # one read, of the ids asked, made before the backend answered


def test_a_get_without_ids_reads_the_ledger_after_the_backend(tmp_path: Path) -> None:
    """Under the metadata filter (``ID_PUSHDOWN_MAX=0``) no row is named before the backend answers."""
    order: list[int] = []

    async def reply(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        order.append(len(ledger.reads))
        body = chroma_rows(["mine", "fleet"]) if b'"offset":0' in request.content.replace(b" ", b"") else chroma_rows([])
        if b'"offset"' not in request.content:  # the content of the rows served (the read's second phase), by id
            body = chroma_rows(__import__("json").loads(request.content)["ids"])
        return httpx.Response(200, json=body)

    client, ledger, key = world(tmp_path, reply, id_pushdown_max=0)
    got = client.post(f"{BASE}/get", json={}, headers={"X-API-Key": key})
    assert got.status_code == 200, got.text
    assert sorted(got.json()["ids"]) == ["fleet", "mine"]
    assert order[0] == 0  # nothing to read before the backend names the rows


def test_a_get_by_the_id_list_reads_the_listed_rows_early_unless_it_pages(tmp_path: Path) -> None:
    """Under the id list the rows are named before the backend answers: read meanwhile for a whole read (every
    listed row may be served), not for a page shorter than the list nor under a client filter."""
    order: list[int] = []
    bodies: list[Any] = []

    async def reply(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        order.append(len(ledger.reads))
        bodies.append(httpx.Request("POST", "http://x", content=request.content).read())
        return httpx.Response(200, json=chroma_rows(["mine", "fleet"]))

    client, ledger, key = world(tmp_path, reply)
    got = client.post(f"{BASE}/get", json={}, headers={"X-API-Key": key})
    assert got.status_code == 200 and sorted(got.json()["ids"]) == ["fleet", "mine"]
    assert order[0] == 1 and sorted(ledger.reads[0]) == ["fleet", "mine"]  # the listed rows, before the answer
    for body in ({"limit": 1}, {"where": {"k": "v"}}):
        ledger.reads.clear()
        order.clear()
        got = client.post(f"{BASE}/get", json=body, headers={"X-API-Key": key})
        assert got.status_code == 200, got.text
        assert order[0] == 0, body  # nothing read before the backend answered


def test_a_failing_backend_answers_its_error_and_the_early_read_is_dropped(tmp_path: Path) -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": "boom"})

    client, ledger, key = world(tmp_path, reply)
    got = client.post(f"{BASE}/get", json={"ids": ["mine"]}, headers={"X-API-Key": key})
    assert got.status_code == 502, got.text
    assert "doc" not in got.text


@pytest.mark.parametrize("ids", [["mine"], ["mine", "fleet", "theirs"]])
def test_a_ledger_failing_during_the_early_read_serves_nothing(tmp_path: Path, ids: list[str]) -> None:
    async def reply(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.02)
        return httpx.Response(200, json=chroma_rows(ids))

    client, ledger, key = world(tmp_path, reply)
    ledger.fail = True
    got = client.post(f"{BASE}/get", json={"ids": ids}, headers={"X-API-Key": key})
    assert got.status_code >= 500, got.text
    assert "doc" not in got.text and "mine" not in got.text
