"""The Chroma get and query write `Authorizer.prefetched` out (``await prefetch`` then ``try``/``finally``
`release`) instead of entering an async context manager per read: as the context manager did, the rows a
read prefetched (on a ledger with ``read_rows``: PostgreSQL; here a SQLite ledger given one) are the ones its
decisions use, and they are dropped when the read ends — answered, or failed while deciding."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar import Settings, create_app
from sidecar.exchange import Exchange
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "22222222-2222-2222-2222-222222222222"
PARAMS = {"tenant": "t", "database": "db", "collection": CID}


class ReadRowsLedger(SQLiteLedger):
    """A SQLite ledger with PostgreSQL's one-statement ``read_rows``, noting which read each row came from."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.read_rows_calls: list[list[str]] = []
        self.get_rows_calls: list[list[str]] = []

    def read_rows(self, backend: str, collection_id: str, row_ids: list[str], key_id: str | None = None
                  ) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
        self.read_rows_calls.append(list(row_ids))
        rows = SQLiteLedger.get_rows(self, backend, collection_id, row_ids)
        owners = self.agent_entities({r.owner for r in rows.values()}) if rows else {}
        return rows, owners, key_id is None or self.key_valid(key_id)

    def get_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> dict[str, Row]:
        self.get_rows_calls.append(list(row_ids))
        return super().get_rows(backend, collection_id, row_ids)


def reply(request: httpx.Request) -> httpx.Response:
    ids = ["mine", "fleet", "theirs"]
    if request.url.path.endswith("/query"):
        return httpx.Response(200, json={"ids": [ids], "distances": [[0.1, 0.2, 0.3]], "documents": [["a", "b", "c"]],
                                         "metadatas": [[{}, {}, {}]], "included": ["documents", "metadatas", "distances"]})
    return httpx.Response(200, json={"ids": ids, "documents": ["a", "b", "c"], "metadatas": [{}, {}, {}],
                                     "included": ["documents", "metadatas"]})


def world(tmp_path: Path) -> tuple[Any, ReadRowsLedger, str]:
    ledger = ReadRowsLedger(tmp_path / "l.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    rows = [Row("chroma", CID, "mine", "t", "red", "t/red/a", "agent", "t/red/a", 1),
            Row("chroma", CID, "fleet", "t", "red", "t/red/b", "fleet", "t/red/b", 1),
            Row("chroma", CID, "theirs", "t", "blue", "t/blue/c", "agent", "t/blue/c", 1)]
    ledger.reserve_rows(rows)
    ledger.activate_rows("chroma", CID, [r.row_id for r in rows])
    # ID_PUSHDOWN_MAX=0: the get's pushdown stays the metadata filter, as `reply` answers every read with all
    # three rows (an id list would have the rows it names read early, `test_early_prefetch.py`)
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", reconcile_interval_s=0,
                              policy_watch_interval_s=0, id_pushdown_max=0), transport=httpx.MockTransport(reply),
                     ledger=ledger)
    return app.state.services, ledger, key


def run(services: Any, key: str, op: str, body: dict[str, Any]) -> tuple[Exchange, Any]:
    async def go() -> tuple[Exchange, Any]:
        ex = Exchange(method="POST", raw_path=f"/api/v2/tenants/t/databases/db/collections/{CID}/{op}", body=body)
        ex.principal = await services.authz.authenticate(ex, key)
        try:
            result: Any = await getattr(services.profile, f"op_{op}")(ex, PARAMS)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            result = exc
        return ex, result
    return asyncio.run(go())


@pytest.mark.parametrize("op,body", [("get", {"include": ["documents"]}),
                                     ("query", {"query_embeddings": [[0.0, 1.0]], "n_results": 2})])
def test_the_prefetched_rows_decide_the_read_and_are_dropped_after(tmp_path: Path, op: str, body: dict[str, Any]) -> None:
    services, ledger, key = world(tmp_path)
    ex, result = run(services, key, op, body)
    status, answer = result
    served = answer["ids"] if op == "get" else answer["ids"][0]
    assert status == 200 and served == ["mine", "fleet"]
    assert ledger.read_rows_calls and ledger.get_rows_calls == []  # decided on the prefetched rows only
    assert ex.prefetched == {} and ex.prefetched_owners == {}


@pytest.mark.parametrize("op,body", [("get", {"include": ["documents"]}),
                                     ("query", {"query_embeddings": [[0.0, 1.0]], "n_results": 2})])
def test_a_read_failing_while_deciding_drops_its_prefetched_rows(tmp_path: Path, op: str, body: dict[str, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    services, ledger, key = world(tmp_path)
    seen: list[dict[Any, Any]] = []

    def failing(ex: Exchange, *args: Any, **kwargs: Any) -> Any:
        seen.append(dict(ex.prefetched))
        raise RuntimeError("decision failed")

    monkeypatch.setattr(services.authz, "readable", failing)
    ex, result = run(services, key, op, body)
    assert isinstance(result, RuntimeError)
    assert seen and seen[0].get(("chroma", CID))  # the rows were prefetched when the decision ran
    assert ex.prefetched == {} and ex.prefetched_owners == {}
