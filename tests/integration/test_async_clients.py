"""Issue 34 (finding 13): two agents in one process and one event loop, through a real `memwarden serve` and
`chroma run`, each with its own key.

``chromadb.AsyncHttpClient`` keeps its httpx clients in a class-level dict keyed by the event loop
(``AsyncFastAPI._clients``, chroma-core/chroma#6869): in one loop the second client reuses the first one's
httpx client, headers included, so it sends the first agent's key. memwarden cannot tell on the wire. The
README's workaround — one ``chromadb.HttpClient`` per agent (each owns its own httpx session and headers),
called from the event loop with ``asyncio.to_thread`` — keeps one identity per client; the decision log's
``key_id`` on every event is how an auditor checks it.

`test_hazard_of_async_http_client_without_the_workaround` documents the hazard with the installed chromadb: it
runs in a fresh interpreter (the class-level dict starts empty, so the outcome does not depend on other
tests), and fails — by design — once chromadb keeps one identity per client; then update the README.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import chromadb
import pytest

from memwarden_eval.harness import Server, start_sidecar
from tests.integration.conftest import POLICIES, Stack
from tests.integration.logutil import decision, decisions, file_sink

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[tuple[Stack, Path]]:
    tmp = tmp_path_factory.mktemp("asyncclients")
    log = tmp / "decisions.jsonl"
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES, extra_env=file_sink(log))
    yield Stack(chroma_server, side, tmp / "ledger.db"), log
    side.stop()


def settled(log: Path, keep: Any, n: int, timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """The decision events `keep` selects once there are `n` of them (an event is written just after its
    answer is sent, so the last ones may trail the client by a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = [e for e in decisions(log) if keep(e)]
        if len(events) >= n or time.monotonic() > deadline:
            return events
        time.sleep(0.05)


def key_id(key: str) -> str:
    return key.removeprefix("mwk_").split(".")[0]


def agent_client(port: int, tenant: str, key: str) -> chromadb.api.ClientAPI:
    """The README's workaround: one synchronous ``chromadb.HttpClient`` per agent (its own httpx session and
    headers), to be called from async code with ``asyncio.to_thread``."""
    return chromadb.HttpClient(host="127.0.0.1", port=port, tenant=tenant, database="default_database",
                               headers={"X-API-Key": key}, settings=chromadb.config.Settings(anonymized_telemetry=False))


def test_two_agents_in_one_event_loop_keep_their_identities(logged: tuple[Stack, Path]) -> None:
    stack, log = logged
    t = stack.tenant("aio")
    one, two = stack.key(t.name, "red", "one", 1), stack.key(t.name, "red", "two", 1)

    async def main() -> dict[str, Any]:
        c1 = await asyncio.to_thread(agent_client, stack.sidecar.port, t.name, one)
        c2 = await asyncio.to_thread(agent_client, stack.sidecar.port, t.name, two)
        m1, m2 = await asyncio.gather(asyncio.to_thread(c1.get_collection, "mem"),
                                      asyncio.to_thread(c2.get_collection, "mem"))
        # both agents write at once, each an agent-scoped row only it may read
        await asyncio.gather(
            asyncio.to_thread(m1.add, ids=["one-private"], embeddings=[[1.0, 0.0]], documents=["one's secret"],
                              metadatas=[{"mw_scope": "agent"}]),
            asyncio.to_thread(m2.add, ids=["two-private"], embeddings=[[0.0, 1.0]], documents=["two's secret"],
                              metadatas=[{"mw_scope": "agent"}]))
        # then each asks for both rows, interleaved in the same loop
        got = await asyncio.gather(*[asyncio.to_thread(m.get, ids=["one-private", "two-private"])
                                     for m in (m1, m2, m1, m2)])
        q2 = await asyncio.to_thread(m2.query, query_embeddings=[[1.0, 0.0]], n_results=2)
        return {"gets": [sorted(g["ids"]) for g in got], "query2": q2["ids"][0]}

    out = asyncio.run(main())
    assert out["gets"] == [["one-private"], ["two-private"], ["one-private"], ["two-private"]]
    assert out["query2"] == ["two-private"]  # agent 2 cannot read agent 1's agent-scoped row
    # the decision log names each request's own key: every data request of this collection is one agent's,
    # and each agent's add carries its key id and principal
    events = settled(log, lambda e: t.collection_id in (e["path"] or "") and e["operation"] in ("add", "get", "query"), 7)
    assert len(events) == 7 and {e["key_id"] for e in events} == {key_id(one), key_id(two)}
    adds = {e["key_id"]: e for e in events if e["operation"] == "add"}
    assert adds[key_id(one)]["row_ids"] == ["one-private"] and adds[key_id(one)]["principal"] == f"Agent::{t.name}/red/one"
    assert adds[key_id(two)]["row_ids"] == ["two-private"] and adds[key_id(two)]["principal"] == f"Agent::{t.name}/red/two"
    for e in events:
        if e["operation"] == "get":
            assert e["row_ids"] == (["one-private"] if e["key_id"] == key_id(one) else ["two-private"])


HAZARD = """
import asyncio, json, sys
import chromadb

port, tenant, one, two = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
settings = lambda: chromadb.config.Settings(anonymized_telemetry=False)

async def main():
    c1 = await chromadb.AsyncHttpClient(host="127.0.0.1", port=int(port), tenant=tenant, headers={"X-API-Key": one},
                                        settings=settings())
    m1 = await c1.get_collection("mem")
    await m1.add(ids=["one-secret"], embeddings=[[1.0, 0.0]], documents=["one's secret"], metadatas=[{"mw_scope": "agent"}])
    c2 = await chromadb.AsyncHttpClient(host="127.0.0.1", port=int(port), tenant=tenant, headers={"X-API-Key": two},
                                        settings=settings())
    m2 = await c2.get_collection("mem")
    got = await m2.get(ids=["one-secret"])
    print(json.dumps({"ids": got["ids"]}))

asyncio.run(main())
"""


def test_hazard_of_async_http_client_without_the_workaround(logged: tuple[Stack, Path], tmp_path: Path) -> None:
    """chroma-core/chroma#6869 with the installed chromadb: agent 2's ``AsyncHttpClient``, made in the same event
    loop after agent 1's, sends agent 1's key — it reads agent 1's agent-scoped row and the decision log names
    agent 1 for agent 2's request. Deterministic: a fresh interpreter, one loop, clients made in order."""
    stack, log = logged
    t = stack.tenant("aioh")
    one, two = stack.key(t.name, "red", "one", 1), stack.key(t.name, "red", "two", 1)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MEMWARDEN_")}
    out = subprocess.run([sys.executable, "-c", HAZARD, str(stack.sidecar.port), t.name, one, two],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ids"] == ["one-secret"], (
        f"chromadb {chromadb.__version__} no longer shares AsyncHttpClient's httpx client across instances: "
        "update README 'Clients that work unchanged' (chroma-core/chroma#6869)")
    events = settled(log, lambda e: t.collection_id in (e["path"] or ""), 2)  # agent 1's add, agent 2's get
    assert len(events) == 2 and {e["key_id"] for e in events} == {key_id(one)}  # agent 2 never appeared: it acted as agent 1
    assert all(e["principal"] == f"Agent::{t.name}/red/one" for e in events)


def test_the_workaround_client_logs_its_key_on_every_event(logged: tuple[Stack, Path]) -> None:
    """`decision` asserts the schema-1 fields on each event: the key id is among them, for an auditor to match
    requests to clients."""
    stack, log = logged
    t = stack.tenant("aiok")
    k = stack.key(t.name, "red", "solo", 1)
    c = agent_client(stack.sidecar.port, t.name, k)
    c.heartbeat()
    m = c.get_collection("mem")
    m.count()
    counted = settled(log, lambda e: e["operation"] == "count" and t.collection_id in (e["path"] or ""), 1)
    assert counted and decision(log, counted[-1]["request_id"])["key_id"] == key_id(k)
