"""Every route of both profiles decides the Cedar actions policy-check's invariants speak about (issue 12).

An invariant on ``read`` (Inv-Scope) is worth what the sidecar makes of it: if a route served rows after
deciding ``search`` or ``list`` alone, or wrote after deciding something other than ``write``, the proof
would be about requests the sidecar never asks. So this test walks the route table of each profile
(``sidecar.backends.chroma.ROUTES``, ``sidecar.backends.mem0.ROUTES``, plus the sidecar's own lineage
route) — read from the modules, so a new route without an entry here fails — sends each route once per
principal kind (an agent of trust 3 that owns some rows, a tenant admin, an operator) through the real
pipeline and policies/ (the backend is an `httpx.MockTransport`), records every decision the authorizer
hands back to a route (``Authorizer._record``: per row, whether Cedar was asked for this row or for its
governance class), and asserts

* the exact set of ``action:ResourceType`` decisions each route makes for each principal (``EXPECTED``);
* that every row a response carries was decided ``read`` — and allowed — for the caller in that request
  (no route serves a row on a collection-level decision);
* that rows are decided only with row actions, collections and namespaces only with request-level
  actions, and the deployment only with deployment actions (the schema's split, which the invariants'
  scopes rely on).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from sidecar import Settings, create_app
from sidecar.backends import chroma, mem0
from sidecar.backends.base import match_routes
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger
from sidecar.stages.authorize import Authorizer

POLICIES = Path(__file__).resolve().parents[2] / "policies"
CID = "11111111-1111-1111-1111-111111111111"
ME, OTHER = "t/red/a", "t/blue/b"  # the agent key (trust 3) and another agent of the tenant
ROW_ACTIONS = {"read", "write", "update", "delete", "supersede", "redistribute"}
REQUEST_ACTIONS = {"search", "list", "delete_bulk", "admin", "create_collection"}
DEPLOYMENT_ACTIONS = {"configure", "reset", "manage_tenants"}


def _row(backend: str, coll: str, rid: str, owner: str, scope: str) -> Row:
    row = Row(backend, coll, rid, "t", owner.split("/")[1], owner, scope, owner, 1)
    if owner == ME:  # my row is also the current fact "svc status up" (status is single-valued)
        row.subject, row.predicate, row.object, row.single_valued = "svc", "status", "up", True
    return row


# ---------------------------------------------------------------- fake backends (answers shaped like the real)
# Rows in the ledger: mine (fleet scope) and another agent's private one (agent scope, not readable by me).
CHROMA_ROWS = {"r1": ME, "r2": OTHER}
MEM0_ROWS = {"m1": ME, "m2": OTHER}


def chroma_backend(request: httpx.Request) -> httpx.Response:
    path, method = request.url.path, request.method
    body = json.loads(request.content) if request.content else {}
    coll = {"id": CID, "name": "mem", "metadata": None, "log_position": 0}
    if path.endswith("/get"):
        ids = [i for i in (body.get("ids") or list(CHROMA_ROWS)) if i in CHROMA_ROWS]
        return httpx.Response(200, json={"ids": ids, "metadatas": [{} for _ in ids], "documents": ["d" for _ in ids],
                                         "included": ["metadatas", "documents"]})
    if path.endswith("/query"):
        ids = list(CHROMA_ROWS)
        n = len(body.get("query_embeddings") or [1])
        return httpx.Response(200, json={"ids": [ids] * n, "metadatas": [[{} for _ in ids]] * n,
                                         "documents": [["d" for _ in ids]] * n,
                                         "distances": [[0.1 * (k + 1) for k in range(len(ids))]] * n,
                                         "included": ["metadatas", "documents", "distances"]})
    if path.endswith("/count"):
        return httpx.Response(200, json=len(CHROMA_ROWS))
    if path.endswith("/collections") and method == "GET":
        return httpx.Response(200, json=[coll])
    if path.endswith("/collections") and method == "POST":
        return httpx.Response(200, json={**coll, "id": "22222222-2222-2222-2222-222222222222", "name": body.get("name")})
    if "/collections/" in path and method == "GET" and not path.endswith("indexing_status"):
        return httpx.Response(200, json=coll)
    return httpx.Response(200, json={} if method == "GET" else True)


def mem0_backend(request: httpx.Request) -> httpx.Response:
    path, method = request.url.path, request.method

    def memory(mid: str) -> dict[str, Any]:
        return {"id": mid, "memory": "text", "agent_id": MEM0_ROWS[mid], "metadata": {}}

    if path == "/memories" and method == "GET":
        agent = request.url.params.get("agent_id")
        return httpx.Response(200, json={"results": [memory(m) for m, o in MEM0_ROWS.items() if o == agent]})
    if path == "/memories" and method == "POST":
        return httpx.Response(200, json={"results": [{"id": "m9", "memory": "new", "event": "ADD"}]})
    if path == "/search":
        return httpx.Response(200, json={"results": [memory(m) for m in MEM0_ROWS]})
    if path.startswith("/memories/") and path.endswith("/history"):
        mid = path.split("/")[2]
        return httpx.Response(200, json=[{"memory_id": mid, "event": "ADD", "old_memory": None, "new_memory": "text"}])
    if path.startswith("/memories/") and method == "GET":
        mid = path.split("/")[2]
        return httpx.Response(200, json=memory(mid) if mid in MEM0_ROWS else None)
    return httpx.Response(200, json={"message": "ok"})


# ---------------------------------------------------------------- one request per route (more where the body decides)
# op -> [(label, query, body)]; the path comes from the route table.
CHROMA_REQUESTS: dict[str, list[tuple[str, dict[str, str], Any]]] = {
    "system": [("system", {}, None)],
    "identity": [("identity", {}, None)],
    "reset": [("reset", {}, None)],
    "create_tenant": [("create_tenant", {}, {"name": "t"})],
    "get_tenant": [("get_tenant", {}, None)],
    "admin_tenant": [("admin_tenant", {}, {"resource_name": "x"})],
    "create_database": [("create_database", {}, {"name": "db2"})],
    "list_databases": [("list_databases", {}, None)],
    "get_database": [("get_database", {}, None)],
    "delete_database": [("delete_database", {}, None)],
    "list_collections": [("list_collections", {}, None)],
    "create_collection": [("create_collection", {}, {"name": "new"})],
    "count_collections": [("count_collections", {}, None)],
    "get_collection_by_id": [("get_collection_by_id", {}, None)],
    "get_collection_by_name": [("get_collection_by_name", {}, None)],
    "modify_collection": [("modify_collection", {}, {"new_name": "renamed"})],
    "delete_collection": [("delete_collection", {}, None)],
    "add": [("add", {}, {"ids": ["n1"], "embeddings": [[1.0]], "metadatas": [{"k": 1}], "documents": ["new"]}),
            ("add-superseding", {}, {"ids": ["n1"], "embeddings": [[1.0]], "documents": ["new"], "metadatas": [
                {"mw_scope": "fleet", "mw_subject": "svc", "mw_predicate": "status", "mw_object": "down"}]})],
    "upsert": [("upsert", {}, {"ids": ["r1", "n2"], "embeddings": [[1.0], [2.0]], "documents": ["x", "y"]})],
    "update": [("update", {}, {"ids": ["r1"], "metadatas": [{"k": 2}]}),
               ("update+redistribute", {}, {"ids": ["r1"], "metadatas": [{"mw_scope": "tenant"}]})],
    "get": [("get", {}, {}), ("get-by-ids", {}, {"ids": ["r1", "r2"]})],
    "query": [("query", {}, {"query_embeddings": [[1.0]], "n_results": 2})],
    "delete": [("delete-by-ids", {}, {"ids": ["r1", "r2"]}), ("delete-where", {}, {"where": {"k": 1}})],
    "count": [("count", {}, None)],
    "collection_info": [("collection_info", {}, None)],
}
MEM0_REQUESTS: dict[str, list[tuple[str, dict[str, str], Any]]] = {
    "add": [("add", {}, {"messages": [{"role": "user", "content": "hi"}], "user_id": "u", "infer": False}),
            ("add-superseding", {}, {"messages": [{"role": "user", "content": "down"}], "user_id": "u", "infer": False,
                                     "metadata": {"mw_scope": "fleet", "mw_subject": "svc", "mw_predicate": "status",
                                                  "mw_object": "down"}})],
    "list": [("list", {}, None)],
    "delete_all": [("delete_all", {"agent_id": ME}, None)],
    "get": [("get", {}, None)],
    "update": [("update", {}, {"text": "changed"}),
               ("update+redistribute", {}, {"metadata": {"mw_scope": "tenant"}})],
    "delete": [("delete", {}, None)],
    "history": [("history", {}, None)],
    "search": [("search", {}, {"query": "q", "top_k": 5})],
    "reset": [("reset", {}, None)],
    "configure_get": [("configure_get", {}, None)],
    "configure_set": [("configure_set", {}, {"llm": {}})],
    "providers": [("providers", {}, None)],
    "generate_instructions": [("generate_instructions", {}, {"use_case": "x"})],
    "blocked": [("blocked", {}, None)],
}
LINEAGE = {"chroma": ({"collection": CID}, "r1"), "mem0": ({}, "m1")}


def _path(pattern: tuple[str, ...], profile: str) -> str:
    values = {"tenant": "t", "database": "db", "collection": CID, "memory_id": "m1", "key_id": "k",
              "entity_type": "user", "entity_id": "u"}
    return "/" + "/".join(values[p[1:-1]] if p.startswith("{") else p for p in pattern)


def _cases(profile: str) -> list[tuple[str, str, str, dict[str, str], Any]]:
    """(label, method, path, query, body) for every route of the profile's table, and the lineage route."""
    table, requests = (chroma.ROUTES, CHROMA_REQUESTS) if profile == "chroma" else (mem0.ROUTES, MEM0_REQUESTS)
    out = []
    seen: dict[str, int] = {}
    for method, pattern, op in table:
        assert op in requests, f"{profile} route {method} /{'/'.join(pattern)} ({op}) has no request in this test"
        for label, query, body in requests[op]:
            n = seen.get(label, 0)
            seen[label] = n + 1
            name = label if n == 0 else f"{label}#{n + 1}"  # one op, several routes (Chroma system, Mem0 blocked)
            out.append((name, method, _path(pattern, profile), query, body))
    query, rid = LINEAGE[profile]
    out.append(("lineage", "GET", f"/_memwarden/memories/{rid}/lineage", query, None))
    return out


# ---------------------------------------------------------------- the walk
Observed = dict[str, dict[str, tuple[int, frozenset[str], set[str]]]]


def _app(profile: str, db: Path) -> tuple[TestClient, dict[str, str]]:
    """A sidecar on policies/ with a fresh ledger: the keys, the collection (Chroma) and the seeded rows —
    mine (fleet scope) and another agent's private one (agent scope)."""
    ledger = SQLiteLedger(db)
    backend, coll, rows = ((chroma_backend, CID, CHROMA_ROWS) if profile == "chroma"
                           else (mem0_backend, "default", MEM0_ROWS))
    if profile == "chroma":
        ledger.register_collection(CollectionRecord("chroma", CID, "t", "db", "mem", "x", 1))
    keys = {"agent": ledger.create_key("agent", "t", "red", "a", 3)[1],
            "admin": ledger.create_key("admin", "t", None, None, 0)[1],
            "operator": ledger.create_key("operator", None, None, None, 0)[1]}
    ledger.create_key("agent", "t", "blue", "b", 1)
    for rid, owner in rows.items():
        ledger.reserve_rows([_row(profile, coll, rid, owner, "fleet" if owner == ME else "agent")])
        ledger.activate_rows(profile, coll, [rid])
    app = create_app(Settings(policies_dir=POLICIES, backend_url="http://backend:9", backend=profile),
                     transport=httpx.MockTransport(backend), ledger=ledger)
    return TestClient(app), keys


def _walk(profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Observed:
    rows = CHROMA_ROWS if profile == "chroma" else MEM0_ROWS
    calls: list[tuple[str, str, str, str, bool]] = []
    real = Authorizer._record  # every decision a route acts on is recorded here (per row, also class answers)

    def spy(self: Authorizer, ex: Any, requests: list[Any], decisions: list[Any]) -> Any:
        calls.extend((r.principal[0], r.action, r.resource[0], r.resource[1], d.allowed)
                     for r, d in zip(requests, decisions))
        return real(self, ex, requests, decisions)

    real_rows = Authorizer._record_rows  # class answers recorded without building per-row requests

    def spy_rows(self: Authorizer, ex: Any, p: Any, action: str, rows: list[Any], decisions: list[Any], *rest: Any) -> Any:
        calls.extend((p.uid[0], action, r.uid[0], r.uid[1], d.allowed) for r, d in zip(rows, decisions))
        return real_rows(self, ex, p, action, rows, decisions, *rest)

    real_request = Authorizer._record_request  # request-level answers recorded without a request object

    def spy_request(ex: Any, p: Any, action: str, uid: tuple[str, str], decision: Any) -> Any:
        calls.append((p.uid[0], action, uid[0], uid[1], decision.allowed))
        return real_request(ex, p, action, uid, decision)

    monkeypatch.setattr(Authorizer, "_record", spy)
    monkeypatch.setattr(Authorizer, "_record_rows", spy_rows)
    monkeypatch.setattr(Authorizer, "_record_request", staticmethod(spy_request))
    observed: Observed = {}
    n = 0
    for label, method, path, query, body in _cases(profile):
        for kind in ("agent", "admin", "operator"):
            n += 1
            client, keys = _app(profile, tmp_path / f"{profile}-{n}.db")  # every request from the same state
            calls.clear()
            r = client.request(method, path, params=query, headers={"X-API-Key": keys[kind]},
                               **({"json": body} if body is not None else {}))
            decided = list(calls)
            _check_rows_served(profile, label, kind, r, decided, rows)
            _check_split(profile, label, kind, decided)
            observed.setdefault(label, {})[kind] = (
                r.status_code, frozenset(f"{a}:{t}" for _, a, t, _, _ in decided), _served(r, rows))
    return observed


def _served_ids(body: Any) -> set[str]:
    """Row ids a response carries (Chroma columns, Mem0 results/memory/history, lineage nodes)."""
    out: set[str] = set()

    def walk(v: Any, key: str | None = None) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, k)
        elif isinstance(v, list):
            for x in v:
                walk(x, key)
        elif isinstance(v, str) and key in ("ids", "id", "memory_id", "row_id"):
            out.add(v)

    walk(body)
    return out


def _served(r: httpx.Response, rows: dict[str, str]) -> set[str]:
    if r.status_code != 200:
        return set()
    try:
        return _served_ids(r.json()) & set(rows)
    except ValueError:
        return set()


def _check_rows_served(profile: str, label: str, kind: str, r: httpx.Response, decided: list[Any],
                       rows: dict[str, str]) -> None:
    served = _served(r, rows)
    read_ok = {rid.rsplit(":", 1)[-1] for _, a, t, rid, ok in decided if a == "read" and t == "Memory" and ok}
    assert served <= read_ok, f"{profile} {label} as {kind} served {sorted(served - read_ok)} without a read"


def _check_split(profile: str, label: str, kind: str, decided: list[Any]) -> None:
    for _, action, rtype, _, _ in decided:
        allowed = ROW_ACTIONS if rtype == "Memory" else DEPLOYMENT_ACTIONS if rtype == "Deployment" \
            else REQUEST_ACTIONS
        assert action in allowed, f"{profile} {label} as {kind} decided {action} on a {rtype}"



# The decisions each route makes: (agent of trust 3, tenant admin, operator), as sorted "action:ResourceType".
# Operators are asked tenant actions on some routes and denied (no tenant action applies to Operator: Cedar
# refuses the request, which denies); tenant admins never own rows (403 before a write decision).
CHROMA_EXPECTED: dict[str, tuple[str, str, str]] = {
    "system": ("list:Namespace", "list:Namespace", "configure:Deployment"),
    "identity": ("list:Namespace", "list:Namespace", "configure:Deployment"),
    "reset": ("reset:Deployment", "reset:Deployment", "reset:Deployment"),
    "create_tenant": ("admin:Namespace", "admin:Namespace", "manage_tenants:Deployment"),
    "get_tenant": ("list:Namespace", "list:Namespace", "manage_tenants:Deployment"),
    "admin_tenant": ("admin:Namespace", "admin:Namespace", "admin:Namespace"),
    "create_database": ("admin:Namespace", "admin:Namespace", "manage_tenants:Deployment"),
    "list_databases": ("list:Namespace", "list:Namespace", "manage_tenants:Deployment"),
    "get_database": ("list:Namespace", "list:Namespace", "manage_tenants:Deployment"),
    "delete_database": ("admin:Namespace", "admin:Namespace", "admin:Namespace"),
    "list_collections": ("list:Namespace", "list:Namespace", "list:Namespace"),
    "create_collection": ("create_collection:Namespace list:Namespace", "create_collection:Namespace list:Namespace",
                          "list:Namespace"),
    "count_collections": ("list:Namespace", "list:Namespace", "list:Namespace"),
    "get_collection_by_id": ("list:Collection", "list:Collection", ""),
    "get_collection_by_name": ("list:Collection list:Namespace", "list:Collection list:Namespace", "list:Namespace"),
    "modify_collection": ("admin:Collection", "admin:Collection", ""),
    "delete_collection": ("admin:Collection list:Namespace", "admin:Collection list:Namespace", "list:Namespace"),
    "add": ("list:Collection write:Memory", "list:Collection", ""),
    "add-superseding": ("list:Collection supersede:Memory write:Memory", "list:Collection", ""),
    "upsert": ("list:Collection read:Memory update:Memory write:Memory", "list:Collection", ""),
    "update": ("list:Collection read:Memory update:Memory", "list:Collection read:Memory update:Memory", ""),
    "update+redistribute": ("list:Collection read:Memory redistribute:Memory update:Memory",
                            "list:Collection read:Memory redistribute:Memory update:Memory", ""),
    "get": ("list:Collection read:Memory", "list:Collection read:Memory", ""),
    "get-by-ids": ("list:Collection read:Memory", "list:Collection read:Memory", ""),
    "query": ("read:Memory search:Collection", "read:Memory search:Collection", ""),
    # An agent's delete by ids is all-or-nothing: a named row it may read but not delete refuses the whole
    # request (403), so the rows it cannot delete are decided for read:Memory to tell 403 from "not found".
    "delete-by-ids": ("delete:Memory list:Collection read:Memory", "delete:Memory list:Collection", ""),
    "delete-where": ("delete:Memory delete_bulk:Collection", "delete:Memory delete_bulk:Collection", ""),
    "count": ("list:Collection read:Memory", "list:Collection read:Memory", ""),
    "collection_info": ("list:Collection", "list:Collection", ""),
    "lineage": ("list:Collection read:Memory", "list:Collection read:Memory", ""),
}
MEM0_EXPECTED: dict[str, tuple[str, str, str]] = {
    "add": ("write:Memory", "", ""),
    "add-superseding": ("supersede:Memory write:Memory", "", ""),
    "list": ("list:Collection read:Memory", "list:Collection read:Memory", "list:Collection"),
    "delete_all": ("delete:Memory delete_bulk:Collection", "delete:Memory delete_bulk:Collection",
                   "delete_bulk:Collection"),
    "get": ("list:Collection read:Memory", "list:Collection read:Memory", "list:Collection"),
    "update": ("read:Memory update:Memory", "read:Memory update:Memory", "read:Memory"),
    "update+redistribute": ("read:Memory redistribute:Memory update:Memory",
                            "read:Memory redistribute:Memory update:Memory", "read:Memory"),
    "delete": ("delete:Memory", "delete:Memory", "delete:Memory read:Memory"),
    "history": ("list:Collection read:Memory", "list:Collection read:Memory", "list:Collection"),
    "search": ("read:Memory search:Collection", "read:Memory search:Collection", "search:Collection"),
    "reset": ("admin:Collection", "admin:Collection delete:Memory", "reset:Deployment"),
    "configure_get": ("configure:Deployment", "configure:Deployment", "configure:Deployment"),
    "configure_set": ("configure:Deployment", "configure:Deployment", "configure:Deployment"),
    "providers": ("list:Collection", "list:Collection", "configure:Deployment"),
    "generate_instructions": ("admin:Collection", "admin:Collection", "admin:Collection"),
    "blocked": ("", "", ""),
    "lineage": ("list:Collection read:Memory", "list:Collection read:Memory", "list:Collection"),
}
# Responses that must carry my row (the served-rows check is not vacuous).
SERVES = {"chroma": {"get", "get-by-ids", "query", "lineage"}, "mem0": {"get", "list", "search", "history", "lineage"}}


@pytest.mark.parametrize("profile", ["chroma", "mem0"])
def test_every_route_decides_the_expected_actions(profile: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    expected = CHROMA_EXPECTED if profile == "chroma" else MEM0_EXPECTED
    observed = _walk(profile, tmp_path, monkeypatch)
    bases = {label.split("#")[0] for label in observed}
    assert bases == set(expected), f"labels without an expectation: {sorted(bases ^ set(expected))}"
    for label, by_kind in observed.items():
        want = dict(zip(("agent", "admin", "operator"), expected[label.split("#")[0]]))
        got = {kind: " ".join(sorted(actions)) for kind, (_, actions, _) in by_kind.items()}
        assert got == want, f"{profile} {label}"
    for label in SERVES[profile]:
        status, _, served = observed[label]["agent"]
        assert status == 200 and served == {"r1" if profile == "chroma" else "m1"}, (label, status, served)


def test_route_tables_are_read_from_the_profiles() -> None:
    """The walk covers each profile's route table as the profile matches it: every table entry is reachable
    (no earlier entry shadows it) and yields its own op."""
    for profile, table in (("chroma", chroma.ROUTES), ("mem0", mem0.ROUTES)):
        cases = _cases(profile)
        assert len(cases) >= len(table) + 1
        for method, pattern, op in table:
            segments = _path(pattern, profile).strip("/").split("/")
            route = match_routes(table, method, segments)
            assert route is not None and route.op == op, (profile, method, pattern)

