"""An update killed between its two writes, through real Chroma and the real sidecar.

An update of a row's content and governance writes Chroma first (the new content, stamped with the new governance)
and the ledger second. Killed in between (``MEMWARDEN_FAILPOINTS=update-governance``, SIGKILL), Chroma holds the
new content and the ledger the old governance for good: before the stamp check every read served the new content on
the old governance. Now no read serves it, on any path, until the owner writes the row again; then each reader
gets what the new governance gives it. `memwarden adopt` run in between reports the row and leaves it as it is."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from memwarden_eval.harness import start_chroma, start_sidecar
from tests.integration.conftest import POLICIES, Stack, unit_vectors
from tests.integration.test_adopt import adopt

pytestmark = pytest.mark.integration
V = unit_vectors(4, seed=5)
SECRET = "the owner's private plan"


def data(tenant: str, cid: str, op: str) -> str:
    return f"/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}/{op}"


def reads(http: httpx.Client, tenant: str, cid: str) -> list[str]:
    """What every read path answers a reader: get by id (with and without metadata), get all, query, count."""
    return [
        http.post(data(tenant, cid, "get"), json={"ids": ["u"]}).text,
        http.post(data(tenant, cid, "get"), json={"ids": ["u"], "include": ["documents"]}).text,
        http.post(data(tenant, cid, "get"), json={}).text,
        http.post(data(tenant, cid, "get"), json={"where": {"topic": "plans"}, "include": ["documents"]}).text,
        http.post(data(tenant, cid, "query"), json={"query_embeddings": [V[0]], "n_results": 2}).text,
        http.post(data(tenant, cid, "query"), json={"query_embeddings": [V[0]], "n_results": 2,
                                                    "include": ["documents", "distances"]}).text,
    ]


def test_an_update_killed_between_chroma_and_the_ledger_never_serves_its_content(tmp_path: Path) -> None:
    chroma = start_chroma(tmp_path / "chroma")
    try:
        side = start_sidecar(chroma.url, tmp_path / "ledger.db", POLICIES,
                             extra_env={"MEMWARDEN_FAILPOINTS": "update-governance"})
        stack = Stack(chroma, side, tmp_path / "ledger.db")
        t = stack.tenant("upd")
        owner, peer = stack.key(t.name, "red", "w", 1), stack.key(t.name, "red", "p", 1)
        with stack.http(owner) as http:
            r = http.post(data(t.name, t.collection_id, "add"), json={
                "ids": ["u"], "embeddings": [V[0]], "documents": ["a note for the fleet"],
                "metadatas": [{"mw_scope": "fleet", "topic": "plans"}]})
            assert r.status_code == 200, r.text
        with stack.http(peer) as http:
            assert all("a note for the fleet" in text for text in reads(http, t.name, t.collection_id))
            assert http.get(data(t.name, t.collection_id, "count")).json() == 1
        with stack.http(owner) as http, pytest.raises(httpx.TransportError):
            # new content for the owner alone: the sidecar dies after Chroma took it, before the ledger did
            http.post(data(t.name, t.collection_id, "update"), json={
                "ids": ["u"], "embeddings": [V[0]], "documents": [SECRET], "metadatas": [{"mw_scope": "agent"}]})
        side.proc.wait(timeout=30)
        assert side.proc.returncode == -signal.SIGKILL
        direct = stack.direct(t.name).get_collection(t.collection).get(ids=["u"])
        assert direct["documents"] == [SECRET] and direct["metadatas"][0]["mw_scope"] == "agent"  # the crash window
        ledger = stack.ledger()
        try:
            assert ledger.get_rows("chroma", t.collection_id, ["u"])["u"].scope == "fleet"
            # the dead update's marker is still there: another update of the row is refused until it is older than
            # UPDATE_LEASE_S (1 s in the restarted sidecar, so the owner's update below takes it over)
            assert ledger.begin_update("chroma", t.collection_id, ["u"], "probe", lease_s=3600) == ["u"]
        finally:
            ledger.close()

        side = start_sidecar(chroma.url, tmp_path / "ledger.db", POLICIES,  # restarted, no failpoint
                             extra_env={"MEMWARDEN_UPDATE_LEASE_S": "1"})
        stack = Stack(chroma, side, tmp_path / "ledger.db")
        for key in (peer, owner):  # the ledger says fleet (the peer's), the content is the owner's alone
            with stack.http(key) as http:
                for text in reads(http, t.name, t.collection_id):
                    assert SECRET not in text and '"u"' not in text, text
        # `memwarden adopt` over the collection does not stamp the ledger's governance over that content
        rules = tmp_path / "rules.toml"
        rules.write_text(f'tenant = "{t.name}"\n[[collection]]\nname = "{t.collection}"\nowner = "red/w"\nscope = "fleet"\n')
        report = adopt(stack, rules)
        assert report["changing"] == ["u"] and report["restamped"] == 0 and report["adopted"] == 0, report
        with stack.http(peer) as http:
            assert all(SECRET not in text for text in reads(http, t.name, t.collection_id))
        with stack.http(owner) as http:  # the owner writes the row again: ledger and Chroma agree
            r = http.post(data(t.name, t.collection_id, "update"), json={
                "ids": ["u"], "embeddings": [V[0]], "documents": [SECRET], "metadatas": [{"mw_scope": "agent"}]})
            assert r.status_code == 200, r.text
            assert all(SECRET in text for text in reads(http, t.name, t.collection_id))
        with stack.http(peer) as http:
            assert all(SECRET not in text for text in reads(http, t.name, t.collection_id))
            assert http.get(data(t.name, t.collection_id, "count")).json() == 0
        side.stop()
    finally:
        chroma.stop()
