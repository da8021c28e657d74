"""One update of a row at a time, and Mem0 history under the governance each entry was written under — through real
Chroma and the real Mem0 REST server (issue 34, finding 11).

A `HoldingProxy` between the sidecar and the backend keeps a first update inside its backend call while a second
update of the same row is sent: before the per-row update marker both went through, and the one whose ledger write
landed last decided the row's scope and content digest whatever the backend held (a re-scope without new content
put back the old digest, or a content update the old scope). Now the second is 409 and reaches nothing.

Mem0's history keeps every past text of a memory; it was served under the memory's governance now, so widening a
memory opened every text it had held while it was narrower."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from memwarden_eval.harness import start_sidecar
from sidecar.provenance import content_digest
from tests.integration.conftest import POLICIES, Stack, unit_vectors
from tests.integration.holding_proxy import HoldingProxy
from tests.integration.mem0.conftest import Mem0Stack, sidecar_env

pytestmark = pytest.mark.integration
V = unit_vectors(2, seed=11)
OLD, NEW = "the launch plan, draft one", "the launch plan, final: friday 9am"


@pytest.fixture
def chroma_held(stack: Stack, tmp_path: Path) -> Iterator[tuple[Stack, HoldingProxy]]:
    proxy = HoldingProxy(stack.chroma.url).start()
    side = start_sidecar(proxy.url, tmp_path / "ledger.db", POLICIES)
    yield Stack(stack.chroma, side, tmp_path / "ledger.db"), proxy
    side.stop()
    proxy.stop()


@pytest.fixture
def mem0_held(mem0_stack: Mem0Stack, tmp_path: Path) -> Iterator[tuple[Mem0Stack, HoldingProxy]]:
    proxy = HoldingProxy(mem0_stack.mem0.url).start()
    side = start_sidecar(proxy.url, tmp_path / "ledger.db", POLICIES, extra_env=sidecar_env())
    yield Mem0Stack(mem0_stack.mem0, side, tmp_path / "ledger.db"), proxy
    side.stop()
    proxy.stop()


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, httpx.Response]]:
    out: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: out.__setitem__("r", fn()))
    thread.start()
    return thread, out


def refused(r: httpx.Response) -> bool:
    return r.status_code == 409 and r.json()["error"] == "conflict" and "in progress" in r.json()["message"]


def test_chroma_a_second_update_of_a_row_in_flight_is_409_and_changes_nothing(chroma_held: tuple[Stack, HoldingProxy]) -> None:
    s, proxy = chroma_held
    t = s.tenant("upd")
    owner, peer = s.key(t.name, "red", "w", 1), s.key(t.name, "red", "p", 1)
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    with s.http(owner) as h:
        r = h.post(f"{base}/add", json={"ids": ["u"], "embeddings": [V[0]], "documents": [OLD], "metadatas": [{"mw_scope": "fleet"}]})
        assert r.status_code == 200, r.text
    proxy.hold("POST", "/update")

    def first() -> httpx.Response:  # new content for the owner alone
        with s.http(owner) as h:
            return h.post(f"{base}/update", json={"ids": ["u"], "embeddings": [V[0]], "documents": [NEW],
                                                  "metadatas": [{"mw_scope": "agent"}]})
    thread, got = in_thread(first)
    try:
        assert proxy.arrived.wait(60)  # the first update is inside Chroma's update call
        with s.http(owner) as h:
            rescope = h.post(f"{base}/update", json={"ids": ["u"], "metadatas": [{"mw_scope": "tenant"}]})
            retext = h.post(f"{base}/update", json={"ids": ["u"], "documents": ["another text"]})
            upsert = h.post(f"{base}/upsert", json={"ids": ["u"], "embeddings": [V[1]], "documents": ["upserted"]})
    finally:
        proxy.release()
        thread.join(60)
    assert got["r"].status_code == 200, got["r"].text
    for r in (rescope, retext, upsert):
        assert refused(r), r.text
    assert [p for m, p in proxy.forwarded if p.endswith(("/update", "/upsert"))] == [f"{base}/update"]  # reached nothing
    # ledger and Chroma agree on the update that was applied: its scope, its content digest
    ledger = s.ledger()
    try:
        row = ledger.get_rows("chroma", t.collection_id, ["u"])["u"]
        assert (row.scope, row.content_hmac) == ("agent", content_digest(ledger.content_key(), NEW))
    finally:
        ledger.close()
    held = s.direct(t.name).get_collection("mem").get(ids=["u"], include=["documents", "metadatas"])
    assert held["documents"] == [NEW] and held["metadatas"][0]["mw_scope"] == "agent"
    with s.http(peer) as h:
        assert h.post(f"{base}/get", json={"ids": ["u"]}).json()["ids"] == []
    with s.http(owner) as h:  # the marker is released: the next update goes through
        assert h.post(f"{base}/update", json={"ids": ["u"], "metadatas": [{"mw_scope": "fleet"}]}).status_code == 200
    with s.http(peer) as h:
        assert h.post(f"{base}/get", json={"ids": ["u"], "include": ["documents"]}).json()["documents"] == [NEW]


def test_mem0_a_second_update_of_a_memory_in_flight_is_409_and_changes_nothing(mem0_held: tuple[Mem0Stack, HoldingProxy]) -> None:
    s, proxy = mem0_held
    world = s.world([("red", "w", 1), ("red", "p", 1)])
    user = "u-" + uuid.uuid4().hex[:8]
    mid = s.add(world.keys["w"], OLD, user_id=user, metadata={"mw_scope": "fleet"})
    proxy.hold("PUT", f"/memories/{mid}")

    def first() -> httpx.Response:  # a re-scope without new content
        with s.http(world.keys["w"]) as h:
            return h.put(f"/memories/{mid}", json={"metadata": {"mw_scope": "agent"}})
    thread, got = in_thread(first)
    try:
        assert proxy.arrived.wait(60)
        with s.http(world.keys["w"]) as h:
            retext = h.put(f"/memories/{mid}", json={"text": NEW})
            widen = h.put(f"/memories/{mid}", json={"metadata": {"mw_scope": "tenant"}})
    finally:
        proxy.release()
        thread.join(60)
    assert got["r"].status_code == 200, got["r"].text
    for r in (retext, widen):
        assert refused(r), r.text
    assert [m for m, p in proxy.forwarded if m == "PUT"] == ["PUT"]
    ledger = s_ledger(s)
    try:
        row = ledger.get_rows("mem0", "default", [mid])[mid]
        assert (row.scope, row.content_hmac) == ("agent", content_digest(ledger.content_key(), OLD))
    finally:
        ledger.close()
    with s.direct() as d:
        held = d.get(f"/memories/{mid}").json()
    assert held["memory"] == OLD and held["metadata"]["mw_scope"] == "agent"
    with s.http(world.keys["p"]) as h:
        assert h.get(f"/memories/{mid}").status_code == 404
    with s.http(world.keys["w"]) as h:  # released: the next update goes through, content digest follows it
        assert h.put(f"/memories/{mid}", json={"text": NEW}).status_code == 200
    ledger = s_ledger(s)
    try:
        assert ledger.get_rows("mem0", "default", [mid])[mid].content_hmac == content_digest(ledger.content_key(), NEW)
    finally:
        ledger.close()


def s_ledger(s: Mem0Stack) -> Any:
    from sidecar.ledger import SQLiteLedger

    return SQLiteLedger(s.ledger_path)


def test_mem0_history_after_a_widening_hides_what_was_written_narrower(mem0_stack: Mem0Stack) -> None:
    """The owner writes a private text, then replaces it with a team note and widens the memory to its fleet.
    The fleet reader and a trust-2 agent of another fleet (which reads every fleet's fleet rows) could not read the
    private text then; its history entry stays hidden from them, and the widening entry's ``old_memory`` (the private
    text) is null. Before, both entries were served under the memory's governance now."""
    world = mem0_stack.world([("red", "w", 1), ("red", "p", 1), ("blue", "b", 2), ("blue", "c", 1)])
    user = "u-" + uuid.uuid4().hex[:8]
    private = f"my private draft {uuid.uuid4().hex[:6]}: the merger closes on friday"
    note = "team note: the offsite is in lisbon"
    mid = mem0_stack.add(world.keys["w"], private, user_id=user, metadata={"mw_scope": "agent"})
    with mem0_stack.http(world.keys["w"]) as h:
        r = h.put(f"/memories/{mid}", json={"text": note, "metadata": {"mw_scope": "fleet"}})
        assert r.status_code == 200, r.text
        mine = h.get(f"/memories/{mid}/history").json()
    assert [e["event"] for e in mine] == ["ADD", "UPDATE"] and mine[1]["old_memory"] == private  # the owner's own past
    for reader in ("p", "b"):
        with mem0_stack.http(world.keys[reader]) as h:
            r = h.get(f"/memories/{mid}/history")
        assert r.status_code == 200, r.text
        assert private not in r.text, (reader, r.text)
        assert [(e["event"], e["old_memory"], e["new_memory"]) for e in r.json()] == [("UPDATE", None, note)]
    with mem0_stack.http(world.keys["c"]) as h:  # never could read it, cannot now: the memory does not exist for it
        assert h.get(f"/memories/{mid}/history").status_code == 404
    # a re-scope without new content to the whole tenant: c now reads the memory, and of its history only the entry
    # written under the tenant scope (c, of another fleet with trust 1, could not read red's fleet rows)
    with mem0_stack.http(world.keys["w"]) as h:
        assert h.put(f"/memories/{mid}", json={"metadata": {"mw_scope": "tenant"}}).status_code == 200
    with mem0_stack.http(world.keys["c"]) as h:
        r = h.get(f"/memories/{mid}/history")
    assert r.status_code == 200 and private not in r.text, r.text
    assert [(e["event"], e["old_memory"], e["new_memory"]) for e in r.json()] == [("UPDATE", note, note)]
    with mem0_stack.http(world.keys["p"]) as h:  # the fleet reader: both entries written since the private one
        assert [(e["old_memory"], e["new_memory"]) for e in h.get(f"/memories/{mid}/history").json()] == \
            [(None, note), (note, note)]
