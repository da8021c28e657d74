"""A Mem0 update killed between its two writes (``MEMWARDEN_FAILPOINTS=update-governance``): Mem0 holds the new
text, stamped with the new governance, and the ledger the old governance. No read serves the new text on the old
governance (the stamp disagrees: `sidecar.governance.stamped_as`) until the owner updates the memory again. Real
Mem0 REST server (`mem0ai` `Memory`), real sidecar subprocesses."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES
from tests.integration.mem0.conftest import Mem0Stack, sidecar_env

pytestmark = pytest.mark.integration
SECRET = "the owner's private release plan"


def reads(http: httpx.Client, mid: str) -> list[str]:
    return [http.get(f"/memories/{mid}").text, http.get("/memories").text,
            http.post("/search", json={"query": SECRET, "top_k": 10, "threshold": 0.0}).text]


def test_a_mem0_update_killed_between_mem0_and_the_ledger_never_serves_its_text(tmp_path: Path, mem0_server: Server) -> None:
    ledger = tmp_path / "ledger.db"
    side = start_sidecar(mem0_server.url, ledger, POLICIES, extra_env=sidecar_env({"MEMWARDEN_FAILPOINTS": "update-governance"}))
    stack = Mem0Stack(mem0_server, side, ledger)
    w = stack.world([("red", "w", 1), ("red", "p", 1)], prefix="uc")
    owner, peer = w.keys["w"], w.keys["p"]
    mid = stack.add(owner, "a release note for the fleet", metadata={"mw_scope": "fleet"})
    with stack.http(peer) as http:
        assert all("a release note for the fleet" in text for text in reads(http, mid))
    with stack.http(owner) as http, pytest.raises(httpx.TransportError):
        http.put(f"/memories/{mid}", json={"text": SECRET, "metadata": {"mw_scope": "agent"}})
    side.proc.wait(timeout=30)
    assert side.proc.returncode == -signal.SIGKILL
    with stack.direct() as d:
        held = d.get(f"/memories/{mid}").json()
        assert held["memory"] == SECRET and held["metadata"]["mw_scope"] == "agent"  # the crash window
    # the dead update's marker is still there: another update of the memory is refused until it is older than
    # UPDATE_LEASE_S (the restarted sidecar's lease is 1 s, so the owner's update below takes it over)
    led = SQLiteLedger(ledger)
    try:
        assert led.begin_update("mem0", "default", [mid], "probe", lease_s=3600) == [mid]
    finally:
        led.close()

    side = start_sidecar(mem0_server.url, ledger, POLICIES, extra_env=sidecar_env({"MEMWARDEN_UPDATE_LEASE_S": "1"}))
    stack = Mem0Stack(mem0_server, side, ledger)
    try:
        for key in (peer, owner):
            with stack.http(key) as http:
                for text in reads(http, mid):
                    assert SECRET not in text, text
        with stack.http(owner) as http:
            r = http.put(f"/memories/{mid}", json={"text": SECRET, "metadata": {"mw_scope": "agent"}})
            assert r.status_code == 200, r.text
            assert all(SECRET in text for text in reads(http, mid))
        with stack.http(peer) as http:
            assert all(SECRET not in text for text in reads(http, mid))
            assert http.get(f"/memories/{mid}/history").status_code == 404  # the memory is the owner's alone now
        with stack.http(owner) as http:  # the killed update's entry (recorded under no version) too: the owner may
            # read the memory under every governance it had
            assert [e["new_memory"] for e in http.get(f"/memories/{mid}/history").json()] == [
                "a release note for the fleet", SECRET, SECRET]
    finally:
        side.stop()
