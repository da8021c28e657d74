"""``MAX_ROW_BYTES`` (issue 34, finding 3): a write whose row — its text in UTF-8 bytes plus its client metadata as
compact JSON — is over the limit is 413 naming it, before anything is decided or forwarded, on both backends
(in-process against an `httpx.MockTransport` backend that records what reaches it); the setting is validated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.config import ConfigError, load_settings
from sidecar.errors import PayloadTooLarge
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger
from sidecar.rowsize import check_row_size, row_bytes

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "33333333-3333-3333-3333-333333333333"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"
LIMIT = 1000


def test_a_row_is_its_text_in_utf8_bytes_and_its_metadata_as_compact_json() -> None:
    assert row_bytes("é" * 10) == 20 and row_bytes(None) == 0
    assert row_bytes("ab", {"k": "v"}) == 2 + len('{"k":"v"}')
    assert row_bytes("x", "https://u", {"n": [1, 2]}) == 1 + 9 + len('{"n":[1,2]}')
    check_row_size("row 'a'", LIMIT, LIMIT)  # at the limit: accepted
    with pytest.raises(PayloadTooLarge) as err:
        check_row_size("row 'a'", LIMIT + 1, LIMIT)
    assert err.value.status == 413 and "MEMWARDEN_MAX_ROW_BYTES" in err.value.message and str(LIMIT) in err.value.message


def test_the_setting_is_positive_and_below_the_response_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().max_row_bytes == 1024 * 1024
    for bad in (0, -1):
        with pytest.raises(pydantic.ValidationError):
            Settings(max_row_bytes=bad)
    with pytest.raises(pydantic.ValidationError, match="BACKEND_MAX_RESPONSE_BYTES"):
        Settings(max_row_bytes=64 * 1024 * 1024)
    assert Settings(max_row_bytes=2_000_000, backend_max_response_bytes=2_000_001).max_row_bytes == 2_000_000
    monkeypatch.setenv("MEMWARDEN_MAX_ROW_BYTES", "4096")
    monkeypatch.setenv("MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES", "4096")
    with pytest.raises(ConfigError, match="MEMWARDEN_MAX_ROW_BYTES"):
        load_settings()


class Backend:
    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if request.url.path.endswith("/get"):
            return httpx.Response(200, json={"ids": [], "metadatas": [], "documents": []})
        return httpx.Response(200, json=True)


def make(tmp_path: Path, backend: str) -> tuple[TestClient, Backend, str]:
    ledger = SQLiteLedger(tmp_path / "l.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    collection = CID if backend == "chroma" else "default"
    ledger.reserve_rows([Row(backend, collection, "old", "t", "red", "t/red/a", "fleet", "t/red/a", 1)])
    ledger.activate_rows(backend, collection, ["old"])
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    fake = Backend()
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", backend=backend,  # type: ignore[arg-type]
                              policy_watch_interval_s=0, reconcile_interval_s=0, max_row_bytes=LIMIT),
                     transport=httpx.MockTransport(fake), ledger=ledger)
    return TestClient(app), fake, key


CHROMA_WRITES: list[tuple[str, dict[str, Any]]] = [
    ("add", {"ids": ["n1"], "embeddings": [[0.1]], "documents": ["x" * (LIMIT + 1)]}),
    ("add", {"ids": ["n1", "n2"], "embeddings": [[0.1], [0.2]], "documents": ["ok", "é" * (LIMIT // 2 + 1)]}),
    ("upsert", {"ids": ["n1"], "embeddings": [[0.1]], "documents": ["small"], "metadatas": [{"note": "x" * LIMIT}]}),
    ("add", {"ids": ["n1"], "embeddings": [[0.1]], "uris": ["u" * (LIMIT + 1)]}),
    ("update", {"ids": ["old"], "documents": ["x" * (LIMIT + 1)]}),
    ("update", {"ids": ["old"], "metadatas": [{"note": "x" * LIMIT}]}),
]


@pytest.mark.parametrize("op,body", CHROMA_WRITES)
def test_chroma_a_write_with_a_row_over_the_limit_is_413_and_nothing_is_forwarded(tmp_path: Path, op: str,
                                                                                   body: dict[str, Any]) -> None:
    client, fake, key = make(tmp_path, "chroma")
    r = client.post(f"{BASE}/{op}", json=body, headers={"X-API-Key": key})
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "payload_too_large" and f"{LIMIT} bytes per row (MEMWARDEN_MAX_ROW_BYTES)" in r.json()["message"]
    assert fake.seen == []
    ok = {**body, "documents": ["small"] * len(body["ids"])} if "documents" in body else None
    if ok is not None and "metadatas" not in ok and "uris" not in ok:
        assert client.post(f"{BASE}/{op}", json=ok, headers={"X-API-Key": key}).status_code == 200


MEM0_WRITES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/memories", {"messages": [{"role": "user", "content": "x" * (LIMIT + 1)}], "infer": False}),
    ("POST", "/memories", {"messages": [{"role": "user", "content": "fine"}, {"role": "user", "content": "é" * (LIMIT // 2 + 1)}],
                           "infer": False}),
    ("POST", "/memories", {"messages": [{"role": "user", "content": "short"}], "metadata": {"note": "x" * LIMIT},
                           "infer": False}),
    ("PUT", "/memories/old", {"text": "x" * (LIMIT + 1)}),
    ("PUT", "/memories/old", {"text": "short", "metadata": {"note": "x" * LIMIT}}),
]


@pytest.mark.parametrize("method,path,body", MEM0_WRITES)
def test_mem0_a_write_with_a_row_over_the_limit_is_413_and_nothing_is_forwarded(tmp_path: Path, method: str, path: str,
                                                                                 body: dict[str, Any]) -> None:
    client, fake, key = make(tmp_path, "mem0")
    r = client.request(method, path, json=body, headers={"X-API-Key": key})
    assert r.status_code == 413, r.text
    assert "MEMWARDEN_MAX_ROW_BYTES" in r.json()["message"] and str(LIMIT) in r.json()["message"]
    assert fake.seen == []
