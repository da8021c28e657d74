"""One malformed backend row never fails a response for the rows it does not concern: it is dropped,
counted (``memwarden_rows_total{result="malformed"}``) and logged by id; the others are served. Both
profiles, with an `httpx.MockTransport` backend that returns governed rows plus malformed ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "11111111-1111-1111-1111-111111111111"


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"d": value}
    return value


def governed(ledger: SQLiteLedger, backend: str, collection: str, ids: list[str]) -> None:
    rows = [Row(backend, collection, i, "t", "red", "t/red/a", "tenant", "t/red/a", 1) for i in ids]
    ledger.reserve_rows(rows)
    ledger.activate_rows(backend, collection, ids)


def app(tmp_path: Path, backend: str, reply: Any) -> tuple[TestClient, SQLiteLedger, str, Any]:
    ledger = SQLiteLedger(tmp_path / "l.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    application = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", backend=backend,  # type: ignore[arg-type]
                                      reconcile_interval_s=0), transport=httpx.MockTransport(reply), ledger=ledger)
    return TestClient(application), ledger, key, application.state.services.metrics


def malformed_count(metrics: Any) -> float:
    return metrics.registry.get_sample_value("memwarden_rows_total", {"result": "malformed"}) or 0.0


def test_chroma_get_and_query_drop_only_the_malformed_rows(tmp_path: Path) -> None:
    ids = ["ok1", "deep", "nan", "ok2"]
    metas: list[Any] = [{"mw_scope": "tenant", "mw_fleet": "red"}, {"n": deep(40)}, {"x": float("nan")}, {"mw_scope": "tenant", "mw_fleet": "red"}]

    def reply(request: httpx.Request) -> httpx.Response:
        asked = __import__("json").loads(request.content)
        if request.url.path.endswith("/get") and "documents" in (asked.get("include") or []):
            # the content of the rows a read serves (its second phase), by their ids: those rows, as Chroma answers
            body = {"ids": asked["ids"], "metadatas": [metas[ids.index(i)] for i in asked["ids"]],
                    "documents": [f"doc of {i}" for i in asked["ids"]]}
        elif request.url.path.endswith("/get"):
            body = {"ids": ids + [7], "metadatas": metas + [{}], "documents": ["a", "b", "c", "d", "e"], "included": ["metadatas"]}
        else:
            body = {"ids": [ids], "metadatas": [metas], "distances": [[0.1, 0.2, 0.3, 0.4]], "documents": [["a", "b", "c", "d"]],
                    "included": ["metadatas", "distances"]}
        # NaN as Python's json writes it (not valid JSON, but what a backend may emit)
        return httpx.Response(200, content=__import__("json").dumps(body).encode(), headers={"content-type": "application/json"})

    client, ledger, key, metrics = app(tmp_path, "chroma", reply)
    governed(ledger, "chroma", CID, ids)
    base = f"/api/v2/tenants/t/databases/db/collections/{CID}"
    got = client.post(f"{base}/get", json={}, headers={"X-API-Key": key})
    assert got.status_code == 200, got.text
    assert got.json()["ids"] == ["ok1", "ok2"]
    queried = client.post(f"{base}/query", json={"query_embeddings": [[0.1]], "n_results": 5}, headers={"X-API-Key": key})
    assert queried.status_code == 200, queried.text
    assert queried.json()["ids"] == [["ok1", "ok2"]]
    assert malformed_count(metrics) == 3 + 2


def test_mem0_list_and_search_drop_only_the_malformed_rows(tmp_path: Path) -> None:
    rows: list[Any] = [{"id": "ok1", "memory": "a", "metadata": {}}, {"id": "deep", "memory": "b", "metadata": {"n": deep(40)}},
                       {"id": 5, "memory": "c"}, "not an object", {"id": "ok2", "memory": "d", "metadata": {}}]

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"results": rows})

    client, ledger, key, metrics = app(tmp_path, "mem0", reply)
    governed(ledger, "mem0", "default", ["ok1", "deep", "ok2"])
    listed = client.get("/memories", params={"agent_id": "a"}, headers={"X-API-Key": key})
    assert listed.status_code == 200, listed.text
    assert [m["id"] for m in listed.json()["results"]] == ["ok1", "ok2"]
    found = client.post("/search", json={"query": "x"}, headers={"X-API-Key": key})
    assert found.status_code == 200, found.text
    assert [m["id"] for m in found.json()["results"]] == ["ok1", "ok2"]
    assert malformed_count(metrics) == 3 + 3


def test_a_body_the_encoder_refuses_is_500_without_rows() -> None:
    """Defence in depth: whatever reaches the response encoder and fails is a 500 with no body rows."""
    from sidecar.app import PipelineMiddleware

    recorded: list[tuple[Any, int]] = []

    class Boom:
        async def run(self, scope: Any, receive: Any) -> Any:
            from sidecar.exchange import Exchange
            ex = Exchange("GET", "/")
            ex.decision = "allow"
            return 200, {"rows": [float("nan")]}, ex

        def record(self, ex: Any, status: int) -> None:
            recorded.append((ex, status))

    sent: list[Any] = []
    mw = PipelineMiddleware(lambda *a: None, Boom())  # type: ignore[arg-type]

    async def send(message: Any) -> None:
        sent.append(message)

    import asyncio
    asyncio.run(mw({"type": "http", "raw_path": b"/x", "path": "/x"}, None, send))
    assert sent[0]["status"] == 500 and b"rows" not in sent[1]["body"]
    # the decision event is that of the answer sent: a 500, an error, not the 200 the pipeline decided
    [(ex, status)] = recorded
    assert status == 500 and (ex.decision, ex.reason) == ("error", "internal_error")
