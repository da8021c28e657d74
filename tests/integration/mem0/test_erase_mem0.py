"""Erasure on Mem0's disk (issue 34, finding 7), with our Mem0 REST test server (real `mem0ai` `Memory`) and a
real sidecar.

After a governed delete the memory's text is still in Mem0's history database (its ADD event, and the DELETE
event's ``old_memory``). Mem0 offers no way to erase one memory's history (no library method, no REST route;
only ``POST /reset``, which drops everything: `sidecar.erase.mem0`), so `memwarden erase` runs nothing and
`--verify` reports the text where it is. With Mem0's history kept off the disk (``history_db_path: ":memory:"``,
the real server's ``HISTORY_DB_PATH``) the same delete leaves nothing the scan finds: the vector store's point
is removed by Mem0's delete. Fails on main: there is no ``erase`` command (exit 2).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest

from memwarden_eval.harness import Server, start_mem0, start_sidecar
from tests.integration.conftest import POLICIES
from tests.integration.mem0.conftest import MEM0_KEY, Mem0Stack, sidecar_env
from tests.integration.test_erase import erase, on_disk

pytestmark = pytest.mark.integration


def delete_through_sidecar(stack: Mem0Stack, text: str) -> None:
    w = stack.world([("f1", "a1", 1)], prefix="erase")
    memory = stack.add(w.keys["a1"], text, user_id="u1")
    with stack.http(w.keys["a1"]) as h:
        assert h.delete(f"/memories/{memory}").status_code == 200
        assert h.get(f"/memories/{memory}").status_code == 404


def test_erase_reports_the_history_mem0_cannot_purge(mem0_stack: Mem0Stack, tmp_path: Path) -> None:
    data = mem0_stack.mem0.data_dir
    assert data is not None
    text = f"erase-marker {uuid.uuid4().hex} Carol's bank PIN is written under her desk"
    delete_through_sidecar(mem0_stack, text)
    # Today's state: the deleted text is in Mem0's history database (the ADD and the DELETE event).
    assert on_disk(data, text) == {"history.db": 2}
    texts = tmp_path / "deleted.txt"
    texts.write_text(text + "\n", encoding="utf-8")

    rc, doc = erase(mem0_stack.ledger_path, "--verify", "--data-path", str(data), "--text-file", str(texts), backend="mem0")
    assert rc == 1 and not doc["ok"]
    assert doc["purge"]["ran"] is False and "no erasure" in doc["purge"]["what"] and doc["purge_error"] is None
    [report] = doc["verify"]["texts"]
    assert report["deleted_count"] == 1 and report["live_count"] == 0 and report["remains"]
    assert [(f["file"], f["places"], f["where"]) for f in report["found"]] == [("history.db", 2, {"page in use": 2})]
    assert on_disk(data, text) == {"history.db": 2}  # nothing memwarden could run removed it


@pytest.fixture
def memory_history_stack(tmp_path: Path) -> Iterator[Mem0Stack]:
    """A Mem0 server whose history is not on disk (``history_db_path: ":memory:"``) and a sidecar in front."""
    mem0: Server = start_mem0(tmp_path / "mem0" / "data", MEM0_KEY, history_db=":memory:")
    try:
        sidecar = start_sidecar(mem0.url, tmp_path / "ledger.db", POLICIES, extra_env=sidecar_env())
        try:
            yield Mem0Stack(mem0, sidecar, tmp_path / "ledger.db")
        finally:
            sidecar.stop()
    finally:
        mem0.stop()


def test_with_history_off_the_disk_nothing_remains(memory_history_stack: Mem0Stack, tmp_path: Path) -> None:
    stack = memory_history_stack
    data = stack.mem0.data_dir
    assert data is not None
    text = f"erase-marker {uuid.uuid4().hex} Dave's new address is 12 Rue des Lilas"
    delete_through_sidecar(stack, text)
    texts = tmp_path / "deleted.txt"
    texts.write_text(text + "\n", encoding="utf-8")

    rc, doc = erase(stack.ledger_path, "--verify", "--data-path", str(data), "--text-file", str(texts), backend="mem0")
    assert rc == 0 and doc["ok"] and doc["verify"]["clean"]
    assert doc["verify"]["texts"][0]["deleted_count"] == 1 and doc["verify"]["files"] >= 1
    assert on_disk(data, text) == {}
