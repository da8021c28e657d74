"""The decision event is written after the response has been handed to the connection, with the status
actually sent, and also when the client goes away mid-send (`sidecar.app.PipelineMiddleware`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar import Settings, create_app, decisionlog
from sidecar.ledger import CollectionRecord, SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "11111111-1111-1111-1111-111111111111"
PATH = f"/api/v2/tenants/t/databases/db/collections/{CID}/get"


def backend(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"ids": [], "metadatas": [], "documents": [], "included": []})


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    ledger = SQLiteLedger(tmp_path / "l.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9"),
                     transport=httpx.MockTransport(backend), ledger=ledger)
    # the sink is configured once per process (`decisionlog.configure`): collect the events this test emits
    log: list[dict[str, Any]] = []
    monkeypatch.setattr(decisionlog, "_write", log.append)
    yield app, key, log
    ledger.close()


def call(app: Any, key: str, send: Any) -> None:
    body = json.dumps({"ids": ["x"]}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": PATH, "raw_path": PATH.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"x-api-key", key.encode()), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    asyncio.run(app(scope, receive, send))


def test_the_event_is_written_after_the_body_was_sent(served: Any) -> None:
    app, key, log = served
    seen: list[tuple[str, int]] = []  # (message type, decision events in the sink when it was sent)

    async def send(message: dict[str, Any]) -> None:
        seen.append((message["type"], len(log)))

    call(app, key, send)
    # nothing was in the sink while the answer left (the old order wrote the event first: 1, 1)
    assert seen == [("http.response.start", 0), ("http.response.body", 0)]
    [event] = log
    assert (event["status"], event["decision"], event["operation"]) == (200, "allow", "get")


def test_a_client_gone_mid_send_still_gets_its_event(served: Any) -> None:
    app, key, log = served

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            raise OSError("connection reset by peer")

    with pytest.raises(OSError):
        call(app, key, send)
    [event] = log
    assert (event["status"], event["decision"]) == (200, "allow")
