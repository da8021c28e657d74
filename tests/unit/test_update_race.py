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
from sidecar.adopt.engine import may_restamp
from sidecar.adopt.targets import Found
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
        # the backend answered this read: the race was run — unless the ledger denied the row first
        assert len(self.sent) > asked or (decided_first(op, body) and not served_x(got))
        return got


def decided_first(op: str, body: dict[str, Any]) -> bool:
    """A get naming its ids whose include holds content is decided on the ledger before Chroma is asked
    (`ChromaProfile._scan_named`): a row the reader may not read then is never fetched."""
    include = body.get("include", ["metadatas", "documents"])
    return op == "get" and bool(body.get("ids")) and any(c in include for c in ("documents", "embeddings", "uris"))


GET_BY_ID = ("get", {"ids": ["x"]})
GET_ALL = ("get", {})
QUERY = ("query", {"query_embeddings": [[0.1, 0.2]], "n_results": 1})
DOCUMENTS_ONLY = ("get", {"ids": ["x"], "include": ["documents"]})
# ids alone, but chosen by content (a filter Chroma evaluates on it, a ranking by it): an oracle for the content
MATCHED_IDS = ("get", {"ids": ["x"], "include": [], "where_document": {"$contains": "text"}})
FILTERED_IDS = ("get", {"where": {"topic": "t"}, "include": []})
RANKED_IDS = ("query", {"query_embeddings": [[0.1, 0.2]], "n_results": 1, "include": []})
READS = [GET_BY_ID, GET_ALL, QUERY, DOCUMENTS_ONLY, MATCHED_IDS, FILTERED_IDS, RANKED_IDS]
READ_IDS = ["get-by-id", "get-all", "query", "get-documents-only", "matched-ids", "filtered-ids", "ranked-ids"]


def served_x(got: httpx.Response) -> bool:
    return "x" in json.dumps(got.json()["ids"])


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_new_content_before_its_narrowed_ledger_row_is_not_served(make_ledger: Any, read: Any) -> None:
    """W lands while the backend answers and A has not landed when the read decides: the ledger still says fleet
    (the reader's), the content is the one written for the owner alone."""
    w = ChromaWorld(make_ledger, "fleet", {"scope": "agent"})
    w.during = w.update.write
    got = w.post(*read)
    assert NEW not in got.text and not served_x(got)
    w.update.govern()  # A lands: the row is the owner's alone, and the reader still sees nothing of it
    assert not served_x(w.post(*read))


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_new_content_with_its_narrowed_ledger_row_landing_meanwhile_is_not_served(make_ledger: Any,
                                                                                        read: Any) -> None:
    """W and A both land while the backend answers: a ledger read made before (early) is of the old governance."""
    w = ChromaWorld(make_ledger, "fleet", {"scope": "agent"})
    w.during = lambda: (w.update.write(), w.update.govern())
    got = w.post(*read)
    assert NEW not in got.text and not served_x(got)


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_old_content_under_a_widened_ledger_row_is_not_served(make_ledger: Any, read: Any) -> None:
    """The backend answers the old content (the owner's alone), then W and A land before the read decides: a
    ledger read made after the answer is of the new, wider governance, which the old content was never under."""
    w = ChromaWorld(make_ledger, "agent", {"scope": "fleet"})
    w.after_answer = lambda: (w.update.write(), w.update.govern())
    got = w.post(*read)
    # a ledger read before the answer: not the reader's (Cedar); after it: withheld, never decided on the wider row
    assert OLD not in got.text and not served_x(got)
    if decided_first(*read) and w.update.content == OLD:  # denied before Chroma was asked: the update lands now
        w.update.write()
        w.update.govern()
    again = w.post(*read)  # the next read pairs the new content with the new governance
    assert served_x(again) and OLD not in again.text


@pytest.mark.parametrize("read", READS, ids=READ_IDS)
def test_chroma_a_consistent_row_is_served_and_an_early_read_is_read_again(make_ledger: Any, read: Any) -> None:
    """The control: a label added with new content keeps the row the reader's. Landing during the answer, the
    early read (old labels) disagrees with the stamp, is read again and then served with the new content."""
    w = ChromaWorld(make_ledger, "fleet", {"labels": ("ops",)})
    first = w.post(*read)  # nothing racing: served
    assert served_x(first) and NEW not in first.text
    w.during = lambda: (w.update.write(), w.update.govern())
    got = w.post(*read)
    assert served_x(got) and OLD not in got.text


def test_chroma_the_stamp_is_fetched_and_not_shown_when_the_client_did_not_ask_for_metadata(make_ledger: Any) -> None:
    w = ChromaWorld(make_ledger, "fleet", {"scope": "agent"})
    got = w.post("get", {"ids": ["x"], "include": ["documents"]}).json()
    assert w.sent[-1]["include"] == ["documents", "metadatas"]
    assert got["ids"] == ["x"] and got["documents"] == [OLD] and got["metadatas"] is None
    assert got["included"] == ["documents"]
    q = w.post("query", {"query_embeddings": [[0.1]], "n_results": 1, "include": ["distances"]}).json()
    assert w.sent[-1]["include"] == ["distances", "metadatas"]
    assert q["ids"] == [["x"]] and q["metadatas"] is None and q["included"] == ["distances"]
    for columns in (["uris"], ["data"], ["embeddings", "uris"]):  # every column but none at all is content
        w.post("get", {"ids": ["x"], "include": columns})
        assert w.sent[-1]["include"] == [*columns, "metadatas"]
    ids_only = w.post("get", {"ids": ["x"], "include": []}).json()
    assert w.sent[-1]["include"] == [] and ids_only["ids"] == ["x"]  # no content, not chosen by it: no stamp needed
    ranked = w.post("query", {"query_embeddings": [[0.1]], "n_results": 1, "include": []}).json()
    assert w.sent[-1]["include"] == ["metadatas"] and ranked["metadatas"] is None and ranked["included"] == []
    matched = w.post("get", {"ids": ["x"], "include": [], "where_document": {"$contains": "t"}}).json()
    assert w.sent[-1]["include"] == ["metadatas"] and matched["metadatas"] is None and matched["ids"] == ["x"]


class MergingStore:
    """Chroma's get and update over one dict of records: an update merges its metadata into the record's (a null
    value deletes the key), as Chroma 1.x does. `on_update(body)` runs instead of applying an update itself."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.on_update: Callable[[dict[str, Any]], Any] | None = None

    def apply(self, body: dict[str, Any]) -> None:
        for n, i in enumerate(body["ids"]):
            r = self.rows[i]
            if body.get("documents") is not None:
                r["documents"] = body["documents"][n]
            for k, v in ((body.get("metadatas") or [None] * len(body["ids"]))[n] or {}).items():
                if v is None:
                    r["metadatas"].pop(k, None)
                else:
                    r["metadatas"][k] = v

    async def reply(self, request: httpx.Request) -> httpx.Response:
        op = request.url.path.rsplit("/", 1)[1]
        body = json.loads(request.content)
        if op == "get":
            ids = [i for i in (body.get("ids") or list(self.rows)) if i in self.rows]
            include = body.get("include") or ["metadatas", "documents"]
            return httpx.Response(200, json={"ids": ids, "included": include, **{
                k: [self.rows[i][k] for i in ids] for k in ("documents", "metadatas") if k in include}})
        if op == "update":
            if self.on_update is not None:
                await self.on_update(body)
            else:
                self.apply(body)
            return httpx.Response(200, json=True)
        return httpx.Response(404, json={"error": "NotFound"})


@pytest.mark.parametrize("second", [{"metadatas": [{"topic": "u2"}]}, {"documents": ["third text"]}],
                         ids=["metadata-only", "content-only"])
def test_chroma_an_update_keeping_governance_leaves_another_updates_stamp(make_ledger: Any, second: Any) -> None:
    """U1 rewrites x's text and narrows it to its owner; between U1's Chroma write and its ledger write, U2 (plain
    metadata or text only, decided on the ledger's fleet scope) runs whole. U2 must not stamp the fleet scope over
    U1's stamp: the fleet reader would be served U1's text meanwhile, and after U1's ledger write x would be withheld
    from everyone. U2 now finds U1's update marker and is 409, changing nothing (issue 34, finding 11; before the
    marker it left the stamp alone, so its write commuted with U1's)."""
    ledger = make_ledger()
    ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    _, owner = ledger.create_key("agent", "t", "blue", "w", 1)
    _, reader = ledger.create_key("agent", "t", "blue", "r", 1)
    x = x_row("chroma", CID, "fleet")
    ledger.reserve_rows([x])
    ledger.activate_rows("chroma", CID, ["x"])
    store = MergingStore()
    store.rows["x"] = {"documents": OLD, "metadatas": stamp({}, x)}
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", reconcile_interval_s=0,
                              policy_watch_interval_s=0, ledger_async=make_ledger.asynchronous, id_pushdown_max=0),
                     transport=httpx.MockTransport(store.reply), ledger=ledger)
    seen: dict[str, httpx.Response] = {}

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sidecar") as c:
            def get(key: str) -> Any:
                return c.post(f"{BASE}/get", json={"ids": ["x"]}, headers={"X-API-Key": key})

            async def on_update(body: dict[str, Any]) -> None:
                store.apply(body)
                if len(seen) == 0:  # U1 reached Chroma: U2 runs whole, and the reader reads, before U1's ledger write
                    seen["u2"] = await c.post(f"{BASE}/update", json={"ids": ["x"], **second},
                                              headers={"X-API-Key": owner})
                    seen["meanwhile"] = await get(reader)
            store.on_update = on_update
            u1 = await c.post(f"{BASE}/update", json={"ids": ["x"], "documents": [NEW],
                                                      "metadatas": [{"mw_scope": "agent"}]}, headers={"X-API-Key": owner})
            assert u1.status_code == 200, u1.text
            seen["reader"], seen["owner"] = await get(reader), await get(owner)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            await run()
    asyncio.run(main())
    assert seen["u2"].status_code == 409 and "in progress" in seen["u2"].text, seen["u2"].text
    assert store.rows["x"]["metadatas"]["mw_scope"] == "agent"  # U1's stamp stands
    assert store.rows["x"]["documents"] == NEW and "u2" not in str(store.rows["x"])  # U2 changed nothing
    assert seen["meanwhile"].json()["ids"] == [] and NEW not in seen["meanwhile"].text
    assert seen["reader"].json()["ids"] == []  # the owner's alone now
    assert seen["owner"].json()["ids"] == ["x"]  # and not withheld from its owner
    assert seen["owner"].json()["documents"] == [store.rows["x"]["documents"]]


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
        self.searches = 0
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
        elif path == "/memories/x/history":
            answer = [{"id": "h1", "memory_id": "x", "old_memory": None, "new_memory": OLD, "event": "ADD"}]
            if u.content == NEW:
                answer.append({"id": "h2", "memory_id": "x", "old_memory": OLD, "new_memory": NEW, "event": "UPDATE"})
        elif path == "/memories":
            answer = {"results": [memory]}
        elif path == "/search":
            self.searches += 1
            # x, then on the first search memories the ledger does not know (never served) up to top_k: a full
            # answer short of readable memories, so the search asks again (a refill), which ends the search
            top_k = json.loads(request.content)["top_k"] if self.searches == 1 else 1
            answer = {"results": [memory] + [{"id": f"u{i}", "memory": "?", "agent_id": "t/blue/w", "metadata": {}}
                                             for i in range(top_k - 1)]}
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
        if how == "history":
            return self.client.get("/memories/x/history", headers=headers)
        return self.client.post("/search", json={"query": "text", "agent_id": "blue/w"}, headers=headers)


MEM0_READS = ["get", "list", "search", "history"]


def served(got: httpx.Response) -> bool:
    if got.status_code == 404:
        return False
    assert got.status_code == 200, got.text
    body = got.json()
    if isinstance(body, list):  # a history
        return any(e["memory_id"] == "x" for e in body)
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
    if how in ("get", "history"):  # decided on the ledger before Mem0 is asked (not the reader's yet): 404
        assert got.status_code == 404 and w.update.content == OLD
    if how in ("get", "history", "list"):  # the list asks Mem0 only under agents owning a row the reader may see
        assert w.update.content == OLD
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


def test_mem0_a_search_refill_decides_again_a_memory_whose_stamp_changed(make_ledger: Any) -> None:
    """The first answer holds x under its old governance (allowed) and too few readable memories; before the refill
    is answered, the update writes Mem0 (new text, narrowed) and not yet the ledger. The refill's x is not the one
    the first decision was made on: decided again, and withheld."""
    w = Mem0World(make_ledger, "fleet", {"scope": "agent"})
    w.after_answer = lambda: setattr(w, "during", w.update.write)  # lands while the refill is answered
    got = w.read("search")
    assert w.searches == 2 and NEW not in got.text and not served(got)


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


def test_adopt_never_restamps_content_an_update_stamped_with_other_governance() -> None:
    """`memwarden adopt` over a governed row whose stamp differs from its ledger row: re-stamped when this ledger
    never wrote that stamp (keys missing, or another source's stamp from before adoption), not when it carries
    the row's own source and other governance (an update's content, written before its ledger write)."""
    row = dataclasses.replace(x_row("chroma", CID, "fleet"), source="chroma:add:r1")
    narrowed = dataclasses.replace(row, scope="agent")
    assert not may_restamp(Found("x", stamp({"k": 1}, narrowed), NEW), row)
    assert not may_restamp(Found("x", Mem0Profile._stamp({}, narrowed), NEW), row)
    partial = {k: v for k, v in stamp({}, row).items() if k != "mw_writer"}
    assert may_restamp(Found("x", partial, OLD), row)  # same governance, a key missing
    foreign = stamp({}, dataclasses.replace(narrowed, source="chroma:add:elsewhere"))
    assert may_restamp(Found("x", foreign, OLD), row)  # stamped before this ledger governed it
    assert may_restamp(Found("x", {"k": 1}, OLD), row)  # never stamped
