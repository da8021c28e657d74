"""The operator principal on Chroma: deployment-wide routes (reset, any tenant's namespace, server
status) are decided as deployment actions, permitted to `memwarden keys create --operator` keys only;
tenant admins never reach them, and operators never reach tenant data."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import chromadb
import pytest
from typer.testing import CliRunner

from sidecar.cli import app as cli
from memwarden_eval.harness import start_chroma
from tests.integration.conftest import Stack, _start_stack, admin_client, unit_vectors

pytestmark = pytest.mark.integration


def operator_key(stack: Stack) -> str:
    out = CliRunner().invoke(cli, ["keys", "create", "--operator", "--ledger", str(stack.ledger_path)])
    assert out.exit_code == 0, out.output
    return out.stdout.strip().splitlines()[0]


def test_operator_manages_tenants_but_not_their_data(stack: Stack) -> None:
    op = operator_key(stack)
    t = stack.tenant("opx")
    agent = stack.key(t.name, "f1", "a1", 1)
    stack.client(agent, t.name).get_collection(t.collection).add(ids=["r1"], embeddings=unit_vectors(1), documents=["secret"])
    # any tenant's namespace, through the official AdminClient
    fresh = f"opnew{uuid.uuid4().hex[:8]}"
    adm = admin_client(stack.sidecar.port, {"X-API-Key": op})
    adm.create_tenant(fresh)
    adm.create_database("default_database", tenant=fresh)
    assert adm.get_tenant(fresh)["name"] == fresh
    with stack.http(op) as h:
        assert h.get("/api/v2/heartbeat").status_code == 200
        base = f"/api/v2/tenants/{t.name}/databases/default_database/collections"
        # no tenant data: collections, rows, counts, queries — and no tenant admin routes
        assert h.get(base).status_code == 403
        assert h.post(f"{base}/{t.collection_id}/get", json={"ids": ["r1"]}).status_code in (403, 404)
        assert h.get(f"{base}/{t.collection_id}/count").status_code in (403, 404)
        assert h.post(f"{base}/{t.collection_id}/add", json={"ids": ["x"], "embeddings": [[0.1] * 8]}).status_code in (403, 404)
        assert h.delete(f"/api/v2/tenants/{t.name}/databases/default_database").status_code == 403
    # a tenant admin creates its own tenant only, never another, and never resets the deployment
    admin = stack.key(t.name)
    with stack.http(admin) as h:
        assert h.post("/api/v2/tenants", json={"name": f"other{uuid.uuid4().hex[:6]}"}).status_code == 403
        assert h.post("/api/v2/reset").status_code == 403
    trust3 = stack.key(t.name, "f1", "boss", 3)
    with stack.http(trust3) as h:
        assert h.post("/api/v2/reset").status_code == 403
    assert stack.direct(t.name).get_collection(t.collection).count() == 1


@pytest.fixture
def resettable(tmp_path: Path) -> Iterator[Stack]:
    s, _ = _start_stack(tmp_path, start_chroma(tmp_path / "chroma", allow_reset=True))
    yield s
    s.sidecar.stop()
    s.chroma.stop()


def test_operator_reset_wipes_governance_once_chroma_reset(resettable: Stack) -> None:
    stack = resettable
    a, b = stack.tenant("ra"), stack.tenant("rb")
    for t in (a, b):
        key = stack.key(t.name, "f1", "w", 1)
        stack.client(key, t.name).get_collection(t.collection).add(ids=["r1", "r2"], embeddings=unit_vectors(2), documents=["x", "y"])
    op = operator_key(stack)
    with stack.http(op) as h:
        r = h.post("/api/v2/reset")
    assert r.status_code == 200, r.text
    ledger = stack.ledger()
    try:
        for t in (a, b):
            rows = ledger.get_rows("chroma", t.collection_id, ["r1", "r2"])
            assert {r.status for r in rows.values()} == {"deleted"}
            assert ledger.get_collection("chroma", t.collection_id) is None
        assert ledger.pending_tombstones("chroma") == []
    finally:
        ledger.close()
    with pytest.raises(chromadb.errors.NotFoundError):  # Chroma itself was reset: tenants are gone too
        stack.direct(a.name).list_collections()


@pytest.fixture
def unresettable(tmp_path: Path) -> Iterator[Stack]:
    """A private Chroma started as `chroma run` starts by default: ``allow_reset`` off, so it refuses its reset (403)."""
    s, _ = _start_stack(tmp_path, start_chroma(tmp_path / "chroma"))
    yield s
    s.sidecar.stop()
    s.chroma.stop()


def test_a_reset_chroma_refuses_changes_no_governance(unresettable: Stack) -> None:
    """Issue 34, finding 8: a ``POST /api/v2/reset`` that Chroma refused tombstoned every row of every tenant and
    unregistered every collection, so nothing could be served or adopted again. The ledger changes only after
    Chroma's reset succeeded: after a refused one every row is still served and every collection registered."""
    stack = unresettable
    tenants = [stack.tenant("na"), stack.tenant("nb")]
    keys = []
    for t in tenants:
        key = stack.key(t.name, "f1", "w", 1)
        keys.append(key)
        stack.client(key, t.name).get_collection(t.collection).add(
            ids=["r1", "r2"], embeddings=unit_vectors(2), documents=["kept one", "kept two"])
    with stack.http(operator_key(stack)) as h:
        r = h.post("/api/v2/reset")
    assert r.status_code == 403 and r.json()["error"] == "backend_rejected", r.text  # Chroma's own refusal
    ledger = stack.ledger()
    try:
        for t in tenants:
            assert ledger.get_collection("chroma", t.collection_id) is not None
            assert {r.status for r in ledger.get_rows("chroma", t.collection_id, ["r1", "r2"]).values()} == {"active"}
        assert ledger.pending_tombstones("chroma") == []
    finally:
        ledger.close()
    for t, key in zip(tenants, keys):
        got = stack.client(key, t.name).get_collection(t.collection).get(ids=["r1", "r2"], include=["documents"])
        assert sorted(zip(got["ids"], got["documents"] or [])) == [("r1", "kept one"), ("r2", "kept two")]
        assert stack.client(t.admin_key, t.name).get_collection(t.collection).count() == 2
