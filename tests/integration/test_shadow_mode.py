"""Shadow mode through a real `memwarden serve` on Chroma with the default ``PUSHDOWN=scope``: the pushdown
widens to the tenant by itself, so get, query and count return every row of the tenant that enforcement
would hide, each logged as a would-deny with its reason — and tenant isolation stays enforced (Cedar's
cross-tenant denials are not turned into allows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from tests.integration.conftest import POLICIES, Stack
from tests.integration.logutil import decision, file_sink

pytestmark = pytest.mark.integration

SHADOW = {"MEMWARDEN_SHADOW_MODE": "true", "MEMWARDEN_SHADOW_MODE_CONFIRM": "decisions-are-not-enforced"}


@pytest.fixture(scope="module")
def shadow(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[tuple[Stack, Path]]:
    tmp = tmp_path_factory.mktemp("shadow")
    log = tmp / "decisions.jsonl"
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES, extra_env=file_sink(log, **SHADOW))
    yield Stack(chroma_server, side, tmp / "ledger.db"), log
    side.stop()


def call(stack: Stack, log: Path, method: str, path: str, key: str, **kw: Any) -> tuple[httpx.Response, dict[str, Any]]:
    with stack.http(key) as h:
        r = h.request(method, path, **kw)
    return r, decision(log, r.headers["x-request-id"])


def test_get_query_count_return_would_deny_rows_with_reasons(shadow: tuple[Stack, Path]) -> None:
    stack, log = shadow
    t = stack.tenant("sh")
    owner = stack.key(t.name, "red", "owner", 1)
    peer = stack.key(t.name, "blue", "peer", 1)  # another fleet, trust 1: reads neither agent nor red fleet rows
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    with stack.http(owner) as h:
        r = h.post(f"{base}/add", json={"ids": ["a1", "f1", "t1"], "embeddings": [[1.0, 0.0], [0.9, 0.1], [0.8, 0.2]],
                                         "metadatas": [{"mw_scope": "agent"}, {"mw_scope": "fleet"}, {"mw_scope": "tenant"}]})
        assert r.status_code == 200
    assert stack.sidecar.readiness().json()["mode"] == "shadow"
    r, e = call(stack, log, "POST", f"{base}/get", peer, json={})
    assert sorted(r.json()["ids"]) == ["a1", "f1", "t1"]  # enforcement would return only t1
    assert (e["mode"], e["decision"], e["would_deny"], e["would_deny_reasons"]) == ("shadow", "allow", 2, {"no_permit": 2})
    assert sorted(e["would_deny_row_ids"]) == ["a1", "f1"] and "shadow-mode:would-deny" in e["policies"]
    r, e = call(stack, log, "POST", f"{base}/query", peer, json={"query_embeddings": [[1.0, 0.0]], "n_results": 3})
    assert sorted(r.json()["ids"][0]) == ["a1", "f1", "t1"] and e["would_deny"] == 2
    r, e = call(stack, log, "GET", f"{base}/count", peer)
    assert r.json() == 3 and e["would_deny"] == 2 and e["would_deny_reasons"] == {"no_permit": 2}
    # the owner's own reads have nothing to shadow
    r, e = call(stack, log, "POST", f"{base}/get", owner, json={})
    assert sorted(r.json()["ids"]) == ["a1", "f1", "t1"] and e["would_deny"] == 0


def test_tenant_isolation_is_enforced_in_shadow_mode(shadow: tuple[Stack, Path]) -> None:
    stack, log = shadow
    t, u = stack.tenant("shA"), stack.tenant("shB")
    mallory = stack.key(t.name, "red", "mallory", 3)
    # Cedar denies these by forbid-cross-tenant; shadow mode keeps them denied
    r, e = call(stack, log, "GET", f"/api/v2/tenants/{u.name}/databases", mallory)
    assert r.status_code == 403 and (e["decision"], e["reason"], e["would_deny"]) == ("deny", "forbid", 0)
    r, e = call(stack, log, "POST", f"/api/v2/tenants/{u.name}/databases", mallory, json={"name": "stolen"})
    assert r.status_code == 403 and e["deny_policies"] == ["forbid-cross-tenant"]
    r, e = call(stack, log, "DELETE", f"/api/v2/tenants/{u.name}/databases/default_database", mallory)
    assert r.status_code == 403
    with stack.http(u.admin_key) as h:  # the other tenant's database is still there
        assert h.get(f"/api/v2/tenants/{u.name}/databases/default_database").status_code == 200
    r, e = call(stack, log, "POST", f"/api/v2/tenants/{u.name}/databases/default_database/collections/{u.collection_id}/get",
                mallory, json={})
    assert r.status_code == 404 and e["reason"] == "unknown_collection"


def test_shadow_mode_reads_never_destroys_or_overwrites_denied_rows(shadow: tuple[Stack, Path]) -> None:
    """Issue 34 (finding 6): in shadow mode (``true``, i.e. ``reads``) reads are widened and logged as would-deny,
    but a write, update or delete the policies deny is refused as in enforcement: a principal of another fleet
    cannot tombstone or overwrite a row it may not change (on main it tombstoned it for good)."""
    stack, log = shadow
    t = stack.tenant("shdel")
    owner = stack.key(t.name, "red", "owner", 1)
    peer = stack.key(t.name, "blue", "peer", 1)  # another fleet, trust 1: may neither delete nor update red's rows
    base = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}"
    with stack.http(owner) as h:
        r = h.post(f"{base}/add", json={"ids": ["keep", "keep2"], "embeddings": [[1.0, 0.0], [0.0, 1.0]],
                                         "documents": ["red fleet runbook", "red fleet notes"],
                                         "metadatas": [{"mw_scope": "fleet"}, {"mw_scope": "agent"}]})
        assert r.status_code == 200
    # the read is widened: the peer sees the red fleet's row, logged as a would-deny
    r, e = call(stack, log, "POST", f"{base}/get", peer, json={"ids": ["keep"]})
    assert r.json()["ids"] == ["keep"] and e["would_deny"] == 1 and e["mode"] == "shadow"
    # ... but its delete by id is refused (403: it can read the row in shadow mode), and logged with the id
    r, e = call(stack, log, "POST", f"{base}/delete", peer, json={"ids": ["keep"]})
    assert r.status_code == 403
    assert (e["decision"], e["action"], e["deny_action"], e["denied_row_ids"]) == ("deny", "delete", "delete", ["keep"])
    assert e["rows_denied"] == 1 and e["rows_allowed"] == 0
    # a delete by filter deletes nothing it may not delete
    r, e = call(stack, log, "POST", f"{base}/delete", peer, json={"where": {"mw_scope": "fleet"}})
    assert r.status_code == 200 and r.json() == {"deleted": 0}
    assert e["decision"] == "deny" and e["denied_row_ids"] == ["keep"]
    # an update (overwrite) and an upsert are refused too
    r, e = call(stack, log, "POST", f"{base}/update", peer, json={"ids": ["keep"], "documents": ["overwritten"]})
    assert r.status_code == 403 and (e["deny_action"], e["denied_row_ids"]) == ("update", ["keep"])
    r, e = call(stack, log, "POST", f"{base}/upsert", peer, json={"ids": ["keep2"], "embeddings": [[0.5, 0.5]],
                                                                    "documents": ["overwritten"]})
    assert r.status_code == 403
    # the rows are intact: active in the ledger, unchanged in Chroma
    with stack.http(owner) as h:
        got = h.post(f"{base}/get", json={"ids": ["keep", "keep2"], "include": ["documents"]}).json()
    assert dict(zip(got["ids"], got["documents"])) == {"keep": "red fleet runbook", "keep2": "red fleet notes"}
    ledger = stack.ledger()
    try:
        rows = ledger.get_rows("chroma", t.collection_id, ["keep", "keep2"])
        assert {i: r.status for i, r in rows.items()} == {"keep": "active", "keep2": "active"}
    finally:
        ledger.close()
