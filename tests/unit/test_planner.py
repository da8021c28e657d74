"""The query planner (`sidecar.planner`): the readable share from the ledger's counts, the over-fetch
size, the choice per request and what observations do; and, through the app with a MockTransport
backend, that every plan answers the true top k among readable rows with no more backend calls than
the better fixed plan."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar.app import create_app
from sidecar.config import Settings
from sidecar.governance import Principal
from sidecar.ledger import CollectionRecord, SQLiteLedger, now_us
from sidecar.planner import QueryPlanner, admitted_share, overfetch_size

POLICIES = Path(__file__).resolve().parents[2] / "policies"
A = Principal("agent", "k1", "t", "red", "a", 1)


def test_admitted_share_follows_the_visibility_filter() -> None:
    counts = [("tenant", "red", "t/red/x", (), "active", 10), ("agent", "red", "t/red/a", (), "active", 5),
              ("agent", "red", "t/red/b", (), "active", 20), ("fleet", "blue", "t/blue/c", (), "active", 40),
              ("restricted", "blue", "t/blue/c", ("t/red/a",), "active", 5), ("tenant", "red", "t/red/x", (), "deleted", 20)]
    assert admitted_share(A, counts) == pytest.approx((10 + 5 + 5) / 100)
    trusted = Principal("agent", "k2", "t", "red", "a", 2)  # reads every fleet's fleet-scoped rows
    assert admitted_share(trusted, counts) == pytest.approx((10 + 5 + 40 + 5) / 100)
    assert admitted_share(Principal("admin", "k3", "t"), counts) == pytest.approx(80 / 100)
    assert admitted_share(A, counts, wide=True) == pytest.approx(80 / 100)
    assert admitted_share(A, []) is None


def test_overfetch_size() -> None:
    assert overfetch_size(1.0, 10, 2, 100_000) == 10  # every row readable: k candidates, no more
    assert overfetch_size(1.0, 1, 2, 100_000) == 1
    n = overfetch_size(0.5, 10, 2, 100_000)
    assert n is not None and 20 < n <= 80 and 0.5 * n - 2 * (n * 0.25) ** 0.5 >= 10
    for share in (0.99, 0.9, 0.75, 0.6, 0.5, 0.4, 0.3):
        for k in (1, 5, 10, 50):
            n = overfetch_size(share, k, 2, 100_000)
            if n is None:
                continue
            step = max(1, k // 4)
            assert k <= n <= 8 * k and share * n - 2 * (n * share * (1 - share)) ** 0.5 >= k
            smaller = n - step
            assert smaller < k or share * smaller - 2 * (smaller * share * (1 - share)) ** 0.5 < k  # the smallest
    assert overfetch_size(0.1, 10, 2, 100_000) is None
    assert overfetch_size(0.1, 1, 2, 100_000) is None
    assert overfetch_size(0.5, 10, 2, 30) is None  # the scan cap bounds it


def test_plans_and_observations() -> None:
    share = {"c": [("tenant", "red", "t/red/x", (), "active", 100)]}
    calls: list[str] = []

    def counts(cid: str) -> Any:
        calls.append(cid)
        return share[cid]

    auto = QueryPlanner("auto", 2, 100_000, counts)
    assert auto.plan(A, "c", 10).unfiltered and auto.plan(A, "c", 10).n_fetch == 10  # all readable: k candidates
    assert calls == ["c"]  # counts are kept for ttl_s
    for _ in range(QueryPlanner.OBSERVATIONS):  # the nearby rows turn out unreadable
        auto.observe(A, "c", 20, 1)
    assert not auto.plan(A, "c", 10).unfiltered
    other = Principal("agent", "k9", "t", "red", "z", 1)
    assert auto.plan(other, "c", 10).unfiltered  # observations are per caller
    assert not QueryPlanner("pushdown", 2, 100_000, counts).plan(A, "c", 10).unfiltered
    assert QueryPlanner("postfilter-first", 2, 100_000, counts).plan(A, "c", 10).unfiltered
    empty = QueryPlanner("auto", 2, 100_000, lambda cid: [])
    assert not empty.plan(A, "c", 10).unfiltered


def test_warm_counts_are_used_as_if_plan_had_read_them() -> None:
    """`warm` (counts read off the event loop by the caller) leaves the planner exactly where `plan` reading
    them would: not stale, the same plans, no read of its own; a stale entry is refreshed, dropping
    observations, as on every refresh."""
    calls: list[str] = []
    rows = [("tenant", "red", "t/red/x", (), "active", 100)]

    def counts(cid: str) -> Any:
        calls.append(cid)
        return rows

    warmed, read = QueryPlanner("auto", 2, 100_000, counts), QueryPlanner("auto", 2, 100_000, counts)
    assert warmed.stale("c")
    warmed.warm("c", rows)
    assert not warmed.stale("c") and calls == []
    assert warmed.plan(A, "c", 10) == read.plan(A, "c", 10) and calls == ["c"]
    for _ in range(QueryPlanner.OBSERVATIONS):
        warmed.observe(A, "c", 20, 1)
    assert not warmed.plan(A, "c", 10).unfiltered
    warmed._stats["c"].loaded_at -= warmed.ttl_s + 1  # noqa: SLF001 (the entry ages past ttl_s)
    assert warmed.stale("c")
    warmed.warm("c", rows)
    assert warmed.plan(A, "c", 10).unfiltered  # observations dropped with the refresh
    assert calls == ["c"]


class FakeChroma:
    """A MockTransport Chroma: exact nearest neighbours over stored rows, honouring the visibility
    ``where`` the sidecar sends (the subset of Chroma's filter language it uses)."""

    def __init__(self, rows: dict[str, tuple[list[float], dict[str, Any]]]) -> None:
        self.rows = rows
        self.queries: list[dict[str, Any]] = []

    def match(self, where: Any, meta: dict[str, Any]) -> bool:
        if not where:
            return True
        (key, cond), = where.items()
        if key == "$and":
            return all(self.match(w, meta) for w in cond)
        if key == "$or":
            return any(self.match(w, meta) for w in cond)
        return meta.get(key) == cond["$eq"]

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if request.url.path.endswith("/query"):
            self.queries.append(body)
            out: dict[str, Any] = {"ids": [], "distances": [], "metadatas": [], "documents": []}
            for q in body["query_embeddings"]:
                ranked = sorted((sum((a - b) ** 2 for a, b in zip(q, v)), rid) for rid, (v, m) in self.rows.items()
                                if self.match(body.get("where"), m))[:body["n_results"]]
                out["ids"].append([r for _, r in ranked])
                out["distances"].append([d for d, _ in ranked])
                out["metadatas"].append([self.rows[r][1] for _, r in ranked])
                out["documents"].append([None for _ in ranked])
            out["included"] = ["distances", "metadatas", "documents"]
            return httpx.Response(200, json=out)
        return httpx.Response(404, json={"error": "NotFound"})


@pytest.mark.parametrize("readable_every", [1, 10])
def test_plans_agree_on_the_true_top_k(tmp_path: Path, readable_every: int) -> None:
    rnd = random.Random(readable_every)
    ledger = SQLiteLedger(tmp_path / "ledger.db")
    key = ledger.create_key("agent", "t", "red", "a", 1)[1]
    ledger.create_key("agent", "t", "blue", "b", 1)
    cid = "11111111-1111-1111-1111-111111111111"
    ledger.register_collection(CollectionRecord("chroma", cid, "t", "db", "c", "t/admin", now_us()))
    from sidecar.governance import Row
    rows: dict[str, tuple[list[float], dict[str, Any]]] = {}
    governed = []
    for i in range(300):
        mine = i % readable_every == 0
        owner, fleet, scope = ("t/red/a", "red", "tenant") if mine else ("t/blue/b", "blue", "agent")
        rid = f"r{i}"
        rows[rid] = ([rnd.random() for _ in range(4)], {"mw_tenant": "t", "mw_scope": scope, "mw_owner": owner, "mw_fleet": fleet})
        governed.append(Row("chroma", cid, rid, "t", fleet, owner, scope, owner, now_us(), status="pending"))
    ledger.reserve_rows(governed)
    ledger.activate_rows("chroma", cid, [r.row_id for r in governed])
    truth_ids = [rid for rid, (_, m) in rows.items() if m["mw_owner"] == "t/red/a"]
    queries = [[rnd.random() for _ in range(4)] for _ in range(5)]
    answers, calls = {}, {}
    for plan in ("auto", "pushdown", "postfilter-first"):
        chroma = FakeChroma(rows)
        settings = Settings(policies_dir=POLICIES, ledger_path=tmp_path / "ledger.db", query_plan=plan, metrics_port=0,
                            policy_watch_interval_s=0, reconcile_interval_s=0)
        app = create_app(settings, transport=httpx.MockTransport(chroma.handler), ledger=SQLiteLedger(tmp_path / "ledger.db"))

        async def run() -> list[Any]:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
                out = []
                for q in queries:
                    r = await client.post(f"/api/v2/tenants/t/databases/db/collections/{cid}/query", headers={"X-API-Key": key},
                                          json={"query_embeddings": [q], "n_results": 10, "include": ["distances"]})
                    assert r.status_code == 200, r.text
                    out.append(r.json()["ids"][0])
                return out
        answers[plan] = asyncio.run(run())
        calls[plan] = len(chroma.queries)
    for q, got in zip(queries, answers["auto"]):
        truth = sorted(truth_ids, key=lambda rid: sum((a - b) ** 2 for a, b in zip(q, rows[rid][0])))[:10]
        assert got == truth
    assert answers["auto"] == answers["pushdown"] == answers["postfilter-first"]
    assert calls["auto"] <= min(calls["pushdown"], calls["postfilter-first"])
    if readable_every == 10:
        assert calls["postfilter-first"] > calls["pushdown"]  # degeneracy guard: the plans do differ here
