"""Reads racing an update that changes a row's content and governance.

An update writes the new content to the backend, stamped with the new governance, then the new governance to the
ledger (`ChromaProfile._write`, `Mem0Profile.op_update`). A read takes the row's content from the backend and its
governance from the ledger, in either order: a get by ids reads the ledger while the backend answers (early), a
query after. Either way it may pair content of one governance with the ledger row of another; the stamp the
content came back with tells which (`sidecar.governance.stamped_as`), and a row whose stamp disagrees with the
ledger row it would be decided on is read again (early reads) and otherwise withheld, never served.

The backend is an `httpx.MockTransport` holding one row, on which the test lands the update's two steps at chosen
points of the read: W (the backend's copy) and A (the ledger's row). The ledger is real: SQLite, and PostgreSQL
with the worker-thread and the asynchronous pool. Each race below served the row on the code before this test."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.backends.chroma import stamp
from sidecar.backends.mem0 import Mem0Profile
from sidecar.governance import Row, stamped_as
from sidecar.ledger import CollectionRecord, SQLiteLedger
from sidecar.ledger.postgres import PostgresLedger
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "44444444-4444-4444-4444-444444444444"
BASE = f"/api/v2/tenants/t/databases/db/collections/{CID}"
OLD, NEW = "old text", "new text"
# How long the backend takes to answer: a ledger read started with the request (a get by ids) ends meanwhile, so
# an update landing "while the backend answers" lands after it.
EARLY_READ_S = 0.05


class Update:
    """One update of row ``x`` in two steps, `write` (the backend's copy: content and stamp) and `govern` (the
    ledger row), and the backend's copy as a read sees it."""

    def __init__(self, ledger: Any, before: Row, after: Row) -> None:
        self.ledger, self.before, self.after = ledger, before, after
        self.content, self.stamped = OLD, before

    def write(self) -> None:
        self.content, self.stamped = NEW, self.after

    def govern(self) -> None:
        self.ledger.update_governance([self.after])


def x_row(backend: str, collection: str, scope: str, labels: tuple[str, ...] = ()) -> Row:
    return Row(backend, collection, "x", "t", "blue", "t/blue/w", scope, "t/blue/w", 1, labels=labels)


@pytest.fixture(params=["sqlite", "pg-thread", "pg-async"])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path, pg_url: str) -> Iterator[Callable[[], Any]]:  # noqa: F811
    made: list[Any] = []

    def make() -> Any:
        if request.param == "sqlite":
            ledger: Any = SQLiteLedger(tmp_path / "l.db")
        else:
            ledger = PostgresLedger(pg_url, schema=fresh_schema(), min_size=0, max_size=2)
        made.append(ledger)
        return ledger
    make.asynchronous = request.param == "pg-async"  # type: ignore[attr-defined]
    yield make
    for ledger in made:
        ledger.close()


# -- Chroma -----------------------------------------------------------------------------------------------------


class ChromaWorld:
    def __init__(self, make_ledger: Any, before_scope: str, after: dict[str, Any]) -> None:
        self.ledger = make_ledger()
        self.ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
        _, self.reader = self.ledger.create_key("agent", "t", "blue", "r", 1)  # a peer of x's owner, same fleet
        before = x_row("chroma", CID, before_scope)
        self.ledger.reserve_rows([before])
        self.ledger.activate_rows("chroma", CID, ["x"])
        self.update = Update(self.ledger, before, dataclasses.replace(before, **after))
        self.during: Callable[[], None] = lambda: None  # run while the backend answers, before it reads its copy
        self.after_answer: Callable[[], None] = lambda: None  # run once its answer is made, before it is returned
        self.sent: list[dict[str, Any]] = []
        # Every read asks the backend, whatever the reader may see (no id list, the unfiltered fetch first): the
        # answer is the one row, as an unfiltered Chroma read would return it.
        app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", reconcile_interval_s=0,
                                  policy_watch_interval_s=0, ledger_async=make_ledger.asynchronous,
                                  id_pushdown_max=0, query_plan="postfilter-first"),
                         transport=httpx.MockTransport(self.reply), ledger=self.ledger)
        self.client = TestClient(app)

    async def reply(self, request: httpx.Request) -> httpx.Response:
        op = request.url.path.rsplit("/", 1)[1]
        if op not in ("get", "query"):
            return httpx.Response(404, json={"error": "NotFound"})
        body = json.loads(request.content)
        self.sent.append(body)
        await asyncio.sleep(EARLY_READ_S)
        self.during()
        include = body.get("include") or ["metadatas", "documents"]
        u = self.update
        row = {"documents": u.content, "metadatas": stamp({"topic": "t"}, u.stamped), "distances": 0.1}
        if op == "get":
            answer: dict[str, Any] = {"ids": ["x"], **{k: [row[k]] for k in include if k in row}, "included": include}
        else:
            answer = {"ids": [["x"]], **{k: [[row[k]]] for k in include if k in row}, "included": include}
        self.after_answer()
        return httpx.Response(200, json=answer)

    def post(self, op: str, body: dict[str, Any]) -> httpx.Response:
        asked = len(self.sent)
        got = self.client.post(f"{BASE}/{op}", json=body, headers={"X-API-Key": self.reader})
        assert got.status_code == 200, got.text
        assert len(self.sent) > asked  # the backend answered this read: the race was run
        return got


GET_BY_ID = ("get", {"ids": ["x"]})
GET_ALL = ("get", {})
QUERY = ("query", {"query_embeddings": [[0.1, 0.2]], "n_results": 1})
DOCUMENTS_ONLY = ("get", {"ids": ["x"], "include": ["documents"]})
READS = [GET_BY_ID, GET_ALL, QUERY, DOCUMENTS_ONLY]
READ_IDS = ["get-by-id", "get-all", "query", "get-documents-only"]


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_new_content_before_its_narrowed_ledger_row_is_not_served(make_ledger: Any, read: Any) -> None:
    """W lands while the backend answers and A has not landed when the read decides: the ledger still says fleet
    (the reader's), the content is the one written for the owner alone."""
    w = ChromaWorld(make_ledger, "fleet", {"scope": "agent"})
    w.during = w.update.write
    got = w.post(*read)
    assert NEW not in got.text and "x" not in json.dumps(got.json()["ids"])
    w.update.govern()  # A lands: the row is the owner's alone, and the reader still sees nothing of it
    assert NEW not in w.post(*read).text


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_new_content_with_its_narrowed_ledger_row_landing_meanwhile_is_not_served(make_ledger: Any,
                                                                                        read: Any) -> None:
    """W and A both land while the backend answers: a ledger read made before (early) is of the old governance."""
    w = ChromaWorld(make_ledger, "fleet", {"scope": "agent"})
    w.during = lambda: (w.update.write(), w.update.govern())
    got = w.post(*read)
    assert NEW not in got.text and "x" not in json.dumps(got.json()["ids"])


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_old_content_under_a_widened_ledger_row_is_not_served(make_ledger: Any, read: Any) -> None:
    """The backend answers the old content (the owner's alone), then W and A land before the read decides: a
    ledger read made after the answer is of the new, wider governance, which the old content was never under."""
    w = ChromaWorld(make_ledger, "agent", {"scope": "fleet"})
    w.after_answer = lambda: (w.update.write(), w.update.govern())
    got = w.post(*read)
    assert OLD not in got.text
    if read is QUERY:  # read after the answer: withheld, never decided on the wider row
        assert got.json()["ids"] == [[]]
    assert NEW in w.post(*read).text  # the next read pairs the new content with the new governance


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_a_consistent_row_is_served_and_an_early_read_is_read_again(make_ledger: Any, read: Any) -> None:
    """The control: a label added with new content keeps the row the reader's. Landing during the answer, the
    early read (old labels) disagrees with the stamp, is read again and then served with the new content."""
    w = ChromaWorld(make_ledger, "fleet", {"labels": ("ops",)})
    assert OLD in w.post(*read).text  # nothing racing: served
    w.during = lambda: (w.update.write(), w.update.govern())
    got = w.post(*read)
    assert NEW in got.text and "x" in json.dumps(got.json()["ids"])


def test_chroma_the_stamp_is_fetched_and_not_shown_when_the_client_did_not_ask_for_metadata(make_ledger: Any) -> None:
    w = ChromaWorld(make_ledger, "fleet", {"scope": "agent"})
    got = w.post("get", {"ids": ["x"], "include": ["documents"]}).json()
    assert w.sent[-1]["include"] == ["documents", "metadatas"]
    assert got["ids"] == ["x"] and got["documents"] == [OLD] and got["metadatas"] is None
    assert got["included"] == ["documents"]
    q = w.post("query", {"query_embeddings": [[0.1]], "n_results": 1, "include": ["distances"]}).json()
    assert w.sent[-1]["include"] == ["distances", "metadatas"]
    assert q["ids"] == [["x"]] and q["metadatas"] is None and q["included"] == ["distances"]
    ids_only = w.post("get", {"ids": ["x"], "include": []}).json()
    assert w.sent[-1]["include"] == [] and ids_only["ids"] == ["x"]  # no content: no stamp needed


# -- Mem0 -------------------------------------------------------------------------------------------------------


class Mem0World:
    def __init__(self, make_ledger: Any, before_scope: str, after: dict[str, Any]) -> None:
        self.ledger = make_ledger()
        _, self.reader = self.ledger.create_key("agent", "t", "blue", "r", 1)
        before = x_row("mem0", "default", before_scope)
        self.ledger.reserve_rows([before])
        self.ledger.activate_rows("mem0", "default", ["x"])
        self.update = Update(self.ledger, before, dataclasses.replace(before, **after))
        self.during: Callable[[], None] = lambda: None
        self.after_answer: Callable[[], None] = lambda: None
        app = create_app(Settings(policies_dir=POLICIES, backend_url="http://mem0:9", backend="mem0",
                                  reconcile_interval_s=0, policy_watch_interval_s=0,
                                  ledger_async=make_ledger.asynchronous),
                         transport=httpx.MockTransport(self.reply), ledger=self.ledger)
        self.client = TestClient(app)

    async def reply(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(EARLY_READ_S)
        self.during()
        u = self.update
        memory = {"id": "x", "memory": u.content, "agent_id": "t/blue/w",
                  "metadata": Mem0Profile._stamp({"topic": "t"}, u.stamped)}
        path = request.url.path
        if path == "/memories/x":
            answer: Any = memory
        elif path in ("/memories", "/search"):
            answer = {"results": [memory]}
        else:
            return httpx.Response(404, json={"detail": "not found"})
        self.after_answer()
        return httpx.Response(200, json=answer)

    def read(self, how: str) -> httpx.Response:
        headers = {"X-API-Key": self.reader}
        if how == "get":
            return self.client.get("/memories/x", headers=headers)
        if how == "list":
            return self.client.get("/memories", params={"agent_id": "blue/w"}, headers=headers)
        return self.client.post("/search", json={"query": "text", "agent_id": "blue/w"}, headers=headers)


MEM0_READS = ["get", "list", "search"]


def served(got: httpx.Response) -> bool:
    if got.status_code == 404:
        return False
    assert got.status_code == 200, got.text
    body = got.json()
    return body.get("id") == "x" if "results" not in body else any(m["id"] == "x" for m in body["results"])


@pytest.mark.parametrize("how", MEM0_READS)
def test_mem0_new_text_before_its_narrowed_ledger_row_is_not_served(make_ledger: Any, how: str) -> None:
    w = Mem0World(make_ledger, "fleet", {"scope": "agent"})
    w.during = w.update.write
    got = w.read(how)
    assert NEW not in got.text and not served(got)
    w.during = lambda: None
    w.update.govern()
    assert not served(w.read(how))


@pytest.mark.parametrize("how", MEM0_READS)
def test_mem0_old_text_under_a_widened_ledger_row_is_not_served(make_ledger: Any, how: str) -> None:
    w = Mem0World(make_ledger, "agent", {"scope": "fleet"})
    w.after_answer = lambda: (w.update.write(), w.update.govern())
    got = w.read(how)
    assert OLD not in got.text
    if how == "get":  # decided on the ledger before Mem0 is asked (not the reader's yet): 404, Mem0 not called
        assert got.status_code == 404 and w.update.content == OLD
        w.update.write()
        w.update.govern()
    w.after_answer = lambda: None
    again = w.read(how)
    assert served(again) and NEW in again.text


@pytest.mark.parametrize("how", MEM0_READS)
def test_mem0_a_consistent_memory_is_served_and_an_early_read_is_read_again(make_ledger: Any, how: str) -> None:
    w = Mem0World(make_ledger, "fleet", {"labels": ("ops",)})
    assert served(w.read(how))
    w.during = lambda: (w.update.write(), w.update.govern())
    got = w.read(how)
    assert served(got) and NEW in got.text


# -- the stamp comparison itself ----------------------------------------------------------------------------------


def test_stamped_as_compares_what_an_update_changes_in_both_stamp_forms() -> None:
    row = Row("chroma", CID, "x", "t", "blue", "t/blue/w", "restricted", "t/blue/w", 1,
              readers=("t/blue/a", "t/red/b"), labels=("ops", "pii"))
    for form in (stamp({}, row), Mem0Profile._stamp({}, row)):
        assert stamped_as(form, row)
        for change in ({"scope": "fleet"}, {"fleet": "red"}, {"readers": ("t/blue/a",)}, {"readers": ()},
                       {"labels": ("ops",)}, {"labels": ()}):
            assert not stamped_as(form, dataclasses.replace(row, **change)), change
    assert stamped_as(None, row) and stamped_as({"topic": "t"}, row)  # never stamped: decided on the ledger
    plain = dataclasses.replace(row, scope="fleet", readers=(), labels=())
    assert stamped_as(stamp({}, plain), plain) and stamped_as(Mem0Profile._stamp({}, plain), plain)
    # an update that empties readers and labels sends them as null (Chroma deletes the keys)
    emptied = stamp({}, plain, previous=row)
    assert emptied["mw_readers"] is None and stamped_as(emptied, plain)
