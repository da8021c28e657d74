"""Chroma reads that include content fetch it only for the rows they serve (issue 34, finding 3): the first fetch
— paged get, query over-fetch and refill — asks for ids and stamps (and distances), the second a ``get`` by the ids
of the rows served. In-process against an `httpx.MockTransport` Chroma that answers from a dict of rows and records
every request; the ledger is a real SQLite one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.backends.chroma import DEFAULT_QUERY_INCLUDE, content_include, stamp
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "55555555-5555-5555-5555-555555555555"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"
ROWS = [Row("chroma", CID, "own", "t", "red", "t/red/a", "agent", "t/red/a", 1),
        Row("chroma", CID, "fleet", "t", "red", "t/red/b", "fleet", "t/red/b", 1),
        Row("chroma", CID, "secret1", "t", "red", "t/red/b", "agent", "t/red/b", 1),
        Row("chroma", CID, "secret2", "t", "blue", "t/blue/c", "fleet", "t/blue/c", 1)]
CONTENT = ("documents", "embeddings", "uris")


class Chroma:
    """get and query over `ROWS` (every query ranks them in this order), each answer holding only the columns asked."""

    def __init__(self) -> None:
        self.rows = {r.row_id: {"documents": f"text of {r.row_id}", "metadatas": stamp({"k": 1}, r),
                                "embeddings": [0.5, 0.5], "uris": f"u:{r.row_id}"} for r in ROWS}
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.before_content: Any = lambda: None  # run when a content fetch arrives, before it is answered

    def __call__(self, request: httpx.Request) -> httpx.Response:
        op = request.url.path.rsplit("/", 1)[1]
        body = json.loads(request.content)
        self.sent.append((op, body))
        if op == "get" and "documents" in (body.get("include") or []):
            self.before_content()
        ids = [i for i in self.rows if body.get("ids") is None or i in body["ids"]]
        if op == "get":
            include = body.get("include", ["metadatas", "documents"])
            page = ids[body.get("offset") or 0:][:body.get("limit") or len(ids)]
            return httpx.Response(200, json={"ids": page, **{k: [self.rows[i][k] for i in page] for k in include if k in CONTENT + ("metadatas",)}})
        include = body.get("include", list(DEFAULT_QUERY_INCLUDE))
        top = ids[:body["n_results"]]
        cols = {k: [[self.rows[i][k] for i in top]] for k in include if k in CONTENT + ("metadatas",)}
        if "distances" in include:
            cols["distances"] = [[0.1 * n for n in range(len(top))]]
        return httpx.Response(200, json={"ids": [top], **cols})

    def content_asked(self) -> list[str]:
        """Ids whose content any request asked for."""
        return [i for _, b in self.sent if any(c in (b.get("include") or ["documents"]) for c in CONTENT)
                for i in (b.get("ids") or ["<all>"])]


def make(tmp_path: Path, pushdown: str) -> tuple[TestClient, Chroma, str, SQLiteLedger]:
    ledger = SQLiteLedger(tmp_path / "l.db")
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    ledger.reserve_rows(ROWS)
    ledger.activate_rows("chroma", CID, [r.row_id for r in ROWS])
    _, key = ledger.create_key("agent", "t", "red", "a", 1)
    chroma = Chroma()
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", policy_watch_interval_s=0,
                              reconcile_interval_s=0, query_plan="postfilter-first", id_pushdown_max=0,
                              pushdown=pushdown),  # type: ignore[arg-type]
                     transport=httpx.MockTransport(chroma), ledger=ledger)
    return TestClient(app), chroma, key, ledger


@pytest.fixture
def world(tmp_path: Path) -> tuple[TestClient, Chroma, str, SQLiteLedger]:
    """Pushdown ``scope``: gets without ids and refills are under the caller's own filter (one phase)."""
    return make(tmp_path, "scope")


@pytest.fixture
def wide(tmp_path: Path) -> tuple[TestClient, Chroma, str, SQLiteLedger]:
    """Pushdown ``tenant``: no fetch is under the caller's own filter (this mock applies none: every row comes back)."""
    return make(tmp_path, "tenant")


def test_the_phases_of_an_include() -> None:
    assert content_include(["documents", "metadatas"], ()) == (["metadatas"], ["documents", "metadatas"])
    assert content_include(None, DEFAULT_QUERY_INCLUDE) == (["metadatas", "distances"], ["metadatas", "documents"])
    assert content_include(["embeddings", "distances", "metadatas"], ()) == (["distances", "metadatas"],
                                                                            ["embeddings", "metadatas"])
    assert content_include(["metadatas", "distances"], ()) == (["metadatas", "distances"], None)  # no content
    assert content_include(["documents", "bogus"], ()) == (["documents", "bogus"], None)  # Chroma refuses it whole
    assert content_include("documents", ()) == ("documents", None)


@pytest.mark.parametrize("body", [{"ids": [r.row_id for r in ROWS]}, {"ids": [r.row_id for r in ROWS], "include": CONTENT},
                                  {"ids": [r.row_id for r in ROWS], "where": {"k": 1}, "limit": 1, "offset": 1}])
def test_a_get_of_named_rows_decides_them_first_and_fetches_the_readable_ones_once(world: Any, body: dict[str, Any]) -> None:
    client, chroma, key, _ = world
    r = client.post(f"{BASE}/get", json=body, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    served = r.json()["ids"]
    assert set(served) <= {"own", "fleet"} and served
    assert len(chroma.sent) == 1 and sorted(chroma.sent[0][1]["ids"]) == ["fleet", "own"]  # one fetch, readable only
    docs = r.json()["documents"]
    assert docs is None or docs == [f"text of {i}" for i in served]
    if "include" in body:
        assert r.json()["uris"] == [f"u:{i}" for i in served] and r.json()["metadatas"] is None


@pytest.mark.parametrize("body", [{"include": ["documents"]}, {"where": {"k": 1}}, {"limit": 1, "offset": 1}])
def test_a_get_without_the_callers_filter_fetches_the_content_of_the_rows_it_serves_only(wide: Any,
                                                                                          body: dict[str, Any]) -> None:
    client, chroma, key, _ = wide
    r = client.post(f"{BASE}/get", json=body, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    served = r.json()["ids"]
    assert set(served) <= {"own", "fleet"} and served
    assert sorted(chroma.content_asked()) == sorted(served)
    assert r.json()["documents"] == [f"text of {i}" for i in served]


def test_a_get_under_the_callers_filter_is_one_fetch(world: Any) -> None:
    client, chroma, key, _ = world
    r = client.post(f"{BASE}/get", json={"include": ["documents"]}, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    (op, sent), = chroma.sent
    assert "documents" in sent["include"] and "mw_scope" in json.dumps(sent["where"])  # the pushdown, with content


@pytest.mark.parametrize("include", [None, ["documents"], ["documents", "distances", "embeddings"]])
@pytest.mark.parametrize("which", ["world", "wide"])
def test_a_query_ranks_on_stamps_and_fetches_the_content_of_the_rows_it_serves_only(request: pytest.FixtureRequest,
                                                                                     which: str, include: Any) -> None:
    """The over-fetch (``postfilter-first``) and, under pushdown ``tenant``, every fetch: no content."""
    client, chroma, key, _ = request.getfixturevalue(which)
    body: dict[str, Any] = {"query_embeddings": [[0.5, 0.5]], "n_results": 2}
    if include is not None:
        body["include"] = include
    r = client.post(f"{BASE}/query", json=body, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    assert r.json()["ids"] == [["own", "fleet"]]
    assert r.json()["documents"] == [["text of own", "text of fleet"]]
    queries = [b for op, b in chroma.sent if op == "query"]
    assert queries and all(not set(CONTENT) & set(b["include"]) for b in queries)  # no content in any query
    assert sorted(chroma.content_asked()) == ["fleet", "own"]
    if include is None or "distances" in include:
        assert r.json()["distances"] == [[0.0, 0.1]]


@pytest.mark.parametrize("change,served", [({"scope": "agent"}, False), ({"labels": ("ops",)}, True)],
                         ids=["narrowed", "labelled"])
@pytest.mark.parametrize("ledger_too", [False, True], ids=["stamp-only", "stamp-and-ledger"])
@pytest.mark.parametrize("which,body", [("world", {"ids": ["own", "fleet"], "include": ["documents"]}),
                                        ("wide", {"include": ["documents"]})], ids=["named-ids", "two-phase"])
def test_a_row_whose_stamp_changed_between_the_phases_is_decided_again(request: pytest.FixtureRequest, which: str,
                                                                       body: dict[str, Any], change: dict[str, Any],
                                                                       served: bool, ledger_too: bool) -> None:
    """An update of ``fleet`` lands between the first fetch and the content fetch: its new content and stamp in
    Chroma, then (`ledger_too`) its ledger row. The row is decided again on the ledger row now against the stamp its
    content came with: withheld while they disagree or when the new governance is not the reader's (narrowed to
    its owner), served with the new content once they agree on governance the reader may read (a label added).
    Named ids are decided before the one fetch, which the update races; otherwise it races the content fetch."""
    client, chroma, key, ledger = request.getfixturevalue(which)
    after = dataclasses.replace(ROWS[1], **change)

    def update() -> None:
        chroma.rows["fleet"] = {**chroma.rows["fleet"], "documents": "new text", "metadatas": stamp({"k": 1}, after)}
        if ledger_too:
            ledger.update_governance([after])
    chroma.before_content = update
    r = client.post(f"{BASE}/get", json=body, headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    if served and ledger_too:
        assert r.json()["ids"] == ["own", "fleet"] and r.json()["documents"] == ["text of own", "new text"]
    else:
        assert r.json()["ids"] == ["own"] and "new text" not in r.text
