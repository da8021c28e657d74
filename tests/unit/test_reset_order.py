"""An operator's reset changes the ledger only once the backend's own reset answered 2xx (issue 34, finding 8), on
both backends, in-process against an `httpx.MockTransport` backend that refuses (4xx), fails (5xx) or is down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "11111111-1111-1111-1111-111111111111"


def backend(reset_status: int | None) -> Any:
    """A backend answering its reset with `reset_status` (None: unreachable) and 200 to anything else."""
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/reset"):
            if reset_status is None:
                raise httpx.ConnectError("refused", request=request)
            return httpx.Response(reset_status, json={"detail": "Reset is disabled by config"})
        return httpx.Response(200, json=True)
    return handle


def make(tmp_path: Path, name: str, reset_status: int | None) -> tuple[TestClient, SQLiteLedger, str, str]:
    """(client, ledger, operator key, ledger collection) of a sidecar for backend `name` holding two active rows."""
    ledger = SQLiteLedger(tmp_path / "l.db")
    settings: dict[str, Any] = {"backend": name} if name == "mem0" else {}
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", policy_watch_interval_s=0, **settings),
                     transport=httpx.MockTransport(backend(reset_status)), ledger=ledger)
    collection = "default" if name == "mem0" else CID
    if name == "chroma":
        ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    for rid in ("r1", "r2"):
        ledger.reserve_rows([Row(name, collection, rid, "t", "red", "t/red/a", "fleet", "t/red/a", 1)])
        ledger.activate_rows(name, collection, [rid])
    _, op = ledger.create_key("operator", None, None, None, 0)
    return TestClient(app), ledger, op, collection


PATH = {"chroma": "/api/v2/reset", "mem0": "/reset"}


@pytest.mark.parametrize("name", ["chroma", "mem0"])
@pytest.mark.parametrize("reset_status,answer", [(403, 403), (500, 502), (None, 502)])
def test_a_refused_or_failed_reset_changes_nothing(tmp_path: Path, name: str, reset_status: int | None, answer: int) -> None:
    client, ledger, op, collection = make(tmp_path, name, reset_status)
    r = client.post(PATH[name], headers={"X-API-Key": op})
    assert r.status_code == answer, r.text
    assert {row.status for row in ledger.get_rows(name, collection, ["r1", "r2"]).values()} == {"active"}
    assert ledger.pending_tombstones(name) == []
    if name == "chroma":
        assert ledger.get_collection("chroma", CID) is not None


@pytest.mark.parametrize("name", ["chroma", "mem0"])
def test_a_reset_the_backend_made_wipes_governance(tmp_path: Path, name: str) -> None:
    client, ledger, op, collection = make(tmp_path, name, 200)
    assert client.post(PATH[name], headers={"X-API-Key": op}).status_code == 200
    assert {row.status for row in ledger.get_rows(name, collection, ["r1", "r2"]).values()} == {"deleted"}
    assert ledger.pending_tombstones(name) == []  # the backend's reset removed them: confirmed
    if name == "chroma":
        assert ledger.get_collection("chroma", CID) is None
