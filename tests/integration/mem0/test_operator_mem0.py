"""The operator principal on Mem0: the shared deployment's configuration and Mem0's own reset are
deployment actions, permitted to operator keys only. Before, any tenant's admin could read the
deployment's configuration and re-point its vector store and LLM (``GET|POST /configure``)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from memwarden_eval.harness import start_mem0, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES
from tests.integration.mem0.conftest import MEM0_KEY, Mem0Stack, sidecar_env

pytestmark = pytest.mark.integration


def operator(stack: Mem0Stack) -> str:
    ledger = SQLiteLedger(stack.ledger_path)
    try:
        return ledger.create_key("operator", None, None, None, 0)[1]
    finally:
        ledger.close()


def test_configure_is_for_operators_only(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("f1", "boss", 3)], prefix="cfg")
    with mem0_stack.direct() as d:
        before = d.get("/configure").json()
    for key in (w.admin, w.keys["boss"]):
        with mem0_stack.http(key) as h:
            assert h.get("/configure").status_code == 403
            r = h.post("/configure", json={"vector_store": {"provider": "qdrant", "config": {"path": "/tmp/elsewhere"}}})
            assert r.status_code == 403, r.text
            assert h.get("/configure/providers").status_code == 200  # the static list of providers stays readable
    with mem0_stack.direct() as d:
        assert d.get("/configure").json() == before  # nothing was forwarded
    op = operator(mem0_stack)
    with mem0_stack.http(op) as h:
        assert h.get("/configure").status_code == 200
        assert h.get("/configure/providers").status_code == 200
        # an operator reads no tenant data
        memory = mem0_stack.add(w.keys["boss"], "the boss's note", metadata={"mw_scope": "tenant"})
        assert h.get("/memories").status_code == 403
        assert h.get(f"/memories/{memory}").status_code == 403
        assert h.get(f"/memories/{memory}/history").status_code == 403
        assert h.post("/search", json={"query": "note"}).status_code == 403
        assert h.post("/memories", json={"messages": [{"role": "user", "content": "x"}], "infer": False}).status_code == 403
        assert h.post("/generate-instructions", json={"use_case": "x"}).status_code == 403


@pytest.fixture
def private_mem0(tmp_path: Path) -> Iterator[Mem0Stack]:
    mem0 = start_mem0(tmp_path / "mem0", MEM0_KEY)
    side = start_sidecar(mem0.url, tmp_path / "ledger.db", POLICIES, extra_env=sidecar_env({"MEMWARDEN_METRICS_PORT": "0"}))
    yield Mem0Stack(mem0, side, tmp_path / "ledger.db")
    side.stop()
    mem0.stop()


def test_operator_reset_is_mem0s_reset_after_every_tombstone(private_mem0: Mem0Stack) -> None:
    stack = private_mem0
    a = stack.world([("f1", "a", 1)], prefix="ra")
    b = stack.world([("f1", "b", 1)], prefix="rb")
    ids = [stack.add(a.keys["a"], "alpha memory"), stack.add(b.keys["b"], "beta memory")]
    with stack.http(a.admin) as h:  # a tenant admin's reset is its tenant's, per id
        assert h.post("/reset").json()["deleted"] == 1
    ids.append(stack.add(b.keys["b"], "gamma memory"))
    op = operator(stack)
    with stack.http(op) as h:
        r = h.post("/reset")
    assert r.status_code == 200, r.text
    ledger = SQLiteLedger(stack.ledger_path)
    try:
        assert {r.status for r in ledger.get_rows("mem0", "default", ids).values()} == {"deleted"}
        assert ledger.pending_tombstones("mem0") == []
    finally:
        ledger.close()
    with stack.direct() as d:
        assert d.get("/memories", params={"agent_id": b.uid("b")}).json()["results"] == []
    with stack.http(b.keys["b"]) as h:
        assert h.get("/memories").json()["results"] == []
