"""Probe metrics on synthetic event streams (Wilson intervals at the edges, empty denominators), and the
experiments' accounting against in-process fake backends (`httpx.MockTransport`): contradiction on fake
Chroma and Mem0; forgetting (history, lineage, not-supported paths) and provenance (lineage endpoint vs
get-walk) on fake Mem0, bare and governed."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from typing import Any

import httpx
import pytest

from memwarden_eval.probe.experiments import Events, Sizes, contradiction, forgetting, provenance
from memwarden_eval.probe.metrics import quantile, summarize, wilson
from memwarden_eval.probe.plan import Plan
from memwarden_eval.probe.runner import no_embed
from memwarden_eval.probe.targets import ChromaTarget, Mem0Target, Result


def test_wilson_edges_and_known_values() -> None:
    zero = wilson(0, 20)
    assert zero.p == 0.0 and zero.lo == 0.0 and zero.hi == pytest.approx(0.1611, abs=1e-4)
    full = wilson(20, 20)
    assert full.p == 1.0 and full.hi == 1.0 and full.lo == pytest.approx(0.8389, abs=1e-4)
    half = wilson(50, 100)  # textbook: [0.4038, 0.5962]
    assert (half.lo, half.hi) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))
    empty = wilson(0, 0)
    assert empty.n == 0 and empty.p is None and "n/a" in empty.fmt()
    for k, n in ((1, 0), (-1, 3), (4, 3)):
        with pytest.raises(ValueError):
            wilson(k, n)
    for k in range(0, 11):
        r = wilson(k, 10)
        assert r.lo is not None and r.hi is not None and r.lo <= r.p <= r.hi  # type: ignore[operator]


def test_quantiles() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.99) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile(list(map(float, range(101))), 0.95) == 95.0


def test_summary_from_events() -> None:
    events = [
        {"kind": "probe", "experiment": "leakage", "target": "direct", "path": "get", "expected": "deny", "observed": "allow"},
        {"kind": "probe", "experiment": "leakage", "target": "direct", "path": "get", "expected": "deny", "observed": "deny"},
        {"kind": "probe", "experiment": "leakage", "target": "direct", "path": "get", "expected": "allow", "observed": "allow"},
        {"kind": "probe", "experiment": "leakage", "target": "sidecar", "path": "get", "expected": "allow", "observed": "deny"},
        {"kind": "latency", "experiment": "provenance", "target": "sidecar", "op": "hop", "ms": 2.0},
        {"kind": "latency", "experiment": "provenance", "target": "sidecar", "op": "hop", "ms": 4.0},
        {"kind": "not_supported", "experiment": "forgetting", "target": "direct", "path": "history", "reason": "no route"},
    ]
    paths, lats, unsupported = summarize(events)
    direct = next(p for p in paths if p.target == "direct")
    assert (direct.leak.k, direct.leak.n, direct.miss.k, direct.miss.n) == (1, 2, 0, 1)
    side = next(p for p in paths if p.target == "sidecar")
    assert side.leak.n == 0 and side.leak.p is None and side.miss.p == 1.0
    assert lats[0].n == 2 and lats[0].p50 == 3.0 and math.isclose(lats[0].p99 or 0, 3.98)
    assert unsupported[0]["path"] == "history"


class FakeChroma:
    """A Chroma v2 stand-in for the contradiction experiment. With ``governed`` it behaves like the
    sidecar for a single-valued predicate: a row carrying ``mw_subject``/``mw_predicate`` supersedes the
    active row with the same pair, and superseded rows are not served. Without it, every row is served."""

    def __init__(self, governed: bool) -> None:
        self.governed = governed
        self.rows: dict[str, tuple[str, dict[str, Any], bool]] = {}  # id -> (document, metadata, active)
        self.added: list[dict[str, Any]] = []
        self.wheres: list[Any] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        op = request.url.path.rsplit("/", 1)[1]
        if op == "add":
            for rid, doc, meta in zip(body["ids"], body["documents"], body["metadatas"]):
                self.added.append(meta)
                if self.governed and meta.get("mw_predicate") == "pipeline_status":
                    for old, (d, m, active) in list(self.rows.items()):
                        if active and (m.get("mw_subject"), m.get("mw_predicate")) == (meta["mw_subject"], meta["mw_predicate"]):
                            self.rows[old] = (d, m, False)
                self.rows[rid] = (doc, meta, True)
            return httpx.Response(200, json=True)
        served = [(rid, d, m) for rid, (d, m, active) in self.rows.items() if active]
        if op == "get":
            self.wheres.append(body.get("where"))
            terms = (body.get("where") or {}).get("$and", [])
            hits = [r for r in served if all(r[2].get(k) == v for term in terms for k, v in term.items())]
            return httpx.Response(200, json={"ids": [r[0] for r in hits], "documents": [r[1] for r in hits],
                                             "metadatas": [r[2] for r in hits]})
        if op == "query":
            hits = served[: body["n_results"] * 100]  # every row is "near": the superseded one must not be among them
            return httpx.Response(200, json={"ids": [[r[0] for r in hits]], "documents": [[r[1] for r in hits]],
                                             "metadatas": [[r[2] for r in hits]]})
        return httpx.Response(404, json={"error": "unexpected"})


def test_contradiction_experiment_uses_the_governed_triple_through_the_sidecar() -> None:
    plan = Plan.build(5)
    fakes = {"direct": FakeChroma(governed=False), "sidecar": FakeChroma(governed=True)}
    keys = {a.uid: f"key-{a.uid}" for a in plan.agents}

    async def run() -> list[dict[str, Any]]:
        ev = Events()
        for name, fake in fakes.items():
            t = ChromaTarget(name, "http://probe.invalid", {plan.tenants[0]: ("t", "db", "cid")}, keys,
                             transport=httpx.MockTransport(fake))
            try:
                await contradiction(plan, t, lambda texts: [[float(i), 1.0] for i in range(len(texts))], ev, Sizes.tiny())
            finally:
                await t.close()
        return ev.items

    paths, _, _ = summarize(asyncio.run(run()))
    by = {(p.experiment, p.path, p.target): p for p in paths}
    n = 2 * 2 * Sizes.tiny().contradiction_facts  # two modes x (old, new)
    assert len(fakes["sidecar"].added) == len(fakes["direct"].added) == n  # the same facts on both targets
    # the sidecar gets the governed triple and is asked about it; direct gets the same values as plain keys
    assert all(set(m) >= {"mw_subject", "mw_predicate", "mw_object"} and "subject" not in m for m in fakes["sidecar"].added)
    assert all(set(m) >= {"subject", "predicate", "object"} and not any(k.startswith("mw_") for k in m)
               for m in fakes["direct"].added)
    assert [m["mw_object"] for m in fakes["sidecar"].added[:2]] == ["paused", "running"]
    assert all(w == {"$and": [{"mw_subject": w["$and"][0]["mw_subject"]}, {"mw_predicate": "pipeline_status"}]}
               for w in fakes["sidecar"].wheres)
    for mode in ("sequential", "concurrent"):
        side, direct = by[("contradiction", mode, "sidecar")], by[("contradiction", mode, "direct")]
        assert (side.leak.k, side.leak.n) == (0, Sizes.tiny().contradiction_facts)  # stale-read rate 0
        assert direct.leak.p == 1.0  # both facts served
        for target in ("sidecar", "direct"):
            newest = by[("contradiction", f"{mode}-newest", target)].miss
            assert newest.k == 0 and newest.n == Sizes.tiny().contradiction_facts  # newest-visible rate 1
    assert by[("contradiction", "sequential-search", "sidecar")].leak.k == 0
    assert by[("contradiction", "sequential-search", "direct")].leak.p == 1.0


NOT_FOUND = {"error": "not_found", "message": "memory not found"}


class FakeMem0:
    """A Mem0 REST stand-in. Direct (``governed=False``): what Mem0 itself does — a missing id is 200
    ``null``, a deleted memory's history keeps its text and a DELETE entry, no lineage route, every row
    served. Governed: what the sidecar does for a reader allowed every row here — a missing or deleted
    id is the same 404 on get, history and lineage, deletion cascades to rows derived from it, the writer
    is taken from the API key (``key-<uid>``), a single-valued fact supersedes the active one, and
    ``redact_roots`` makes lineage show chain roots as placeholders (a wrong answer, to test the
    accounting)."""

    def __init__(self, governed: bool, redact_roots: bool = False) -> None:
        self.governed = governed
        self.redact_roots = redact_roots
        self.rows: dict[str, dict[str, Any]] = {}
        self.hidden: set[str] = set()  # superseded
        self.history: dict[str, list[dict[str, Any]]] = {}
        self.search_filters: list[dict[str, Any]] = []
        self.added: list[dict[str, Any]] = []
        self.n = 0

    def _parents(self, mid: str) -> list[str]:
        return [p for p in str(self.rows[mid]["metadata"].get("mw_derived_from", "")).split(",") if p]

    def _visible(self) -> list[dict[str, Any]]:
        return [r for mid, r in self.rows.items() if mid not in self.hidden]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body: Any = json.loads(request.content) if request.content else {}
        who = request.headers.get("X-API-Key", "")[len("key-"):]
        parts = request.url.path.strip("/").split("/")
        missing = httpx.Response(404, json=NOT_FOUND) if self.governed else httpx.Response(200, json=None)
        if request.method == "POST" and parts == ["memories"]:
            self.n += 1
            mid = str(uuid.UUID(int=self.n, version=4))
            meta = dict(body["metadata"])
            self.added.append(meta)
            if self.governed:
                if any(p not in self.rows for p in str(meta.get("mw_derived_from", "")).split(",") if p):
                    return httpx.Response(403, json={"error": "forbidden"})
                meta["mw_writer"] = who
                if meta.get("mw_predicate") == "pipeline_status":
                    self.hidden |= {i for i, r in self.rows.items() if r["metadata"].get("mw_subject") == meta["mw_subject"]}
            text = body["messages"][0]["content"]
            self.rows[mid] = {"id": mid, "memory": text, "metadata": meta, "user_id": body["user_id"]}
            self.history[mid] = [{"memory_id": mid, "old_memory": None, "new_memory": text, "event": "ADD"}]
            return httpx.Response(200, json={"results": [{"id": mid, "memory": text, "event": "ADD"}]})
        if parts[:2] == ["_memwarden", "memories"] and parts[3:] == ["lineage"]:
            if not self.governed:
                return httpx.Response(404, json={"detail": "Not Found"})
            if parts[2] not in self.rows or parts[2] in self.hidden:
                return missing
            order, depth, number = [parts[2]], {parts[2]: 0}, {}
            for mid in order:  # breadth first towards the roots
                for p in self._parents(mid):
                    if p in self.rows and p not in depth:
                        depth[p] = depth[mid] + 1
                        order.append(p)
            number = {mid: i for i, mid in enumerate(order)}
            nodes = []
            for mid in order:
                links = [number[p] for p in self._parents(mid) if p in number]
                if self.redact_roots and not links and mid != parts[2]:
                    nodes.append({"node": number[mid], "depth": depth[mid], "redacted": True, "parents": []})
                else:
                    nodes.append({"node": number[mid], "depth": depth[mid], "id": mid,
                                  "writer": self.rows[mid]["metadata"]["mw_writer"], "parents": links})
            return httpx.Response(200, json={"memory": parts[2], "truncated": False, "nodes": nodes})
        if parts[0] != "memories" and parts != ["search"]:
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.method == "GET" and len(parts) == 2:
            row = self.rows.get(parts[1])
            return httpx.Response(200, json=row) if row and parts[1] not in self.hidden else missing
        if request.method == "GET" and parts[2:] == ["history"]:
            if self.governed:
                return httpx.Response(200, json=self.history[parts[1]]) if parts[1] in self.rows else missing
            return httpx.Response(200, json=self.history.get(parts[1], []))
        if request.method == "GET" and parts == ["memories"]:
            user = request.url.params["user_id"]
            return httpx.Response(200, json={"results": [r for r in self._visible() if r["user_id"] == user]})
        if parts == ["search"]:
            self.search_filters.append(body["filters"])
            conds = {k: v for k, v in body["filters"].items() if k != "user_id"}
            hits = [r for r in self._visible() if r["user_id"] == body["filters"]["user_id"]
                    and all(r["metadata"].get(k) == v for k, v in conds.items())]
            hits.sort(key=lambda r: r["memory"] != body["query"])  # the exact text ranks first
            return httpx.Response(200, json={"results": hits[: body["top_k"]]})
        if request.method == "DELETE" and len(parts) == 2:
            if parts[1] not in self.rows:
                return httpx.Response(404, json={"detail": "not found"})
            gone = [parts[1]]
            if self.governed:  # deletion closure: rows derived from a deleted row
                for mid in gone:
                    gone += [c for c in self.rows if mid in self._parents(c) and c not in gone]
            for mid in gone:
                row = self.rows.pop(mid)
                self.history[mid].append({"memory_id": mid, "old_memory": row["memory"], "new_memory": None,
                                          "event": "DELETE", "is_deleted": True})
            return httpx.Response(200, json={"message": "Memory deleted successfully"})
        return httpx.Response(404, json={"detail": "Not Found"})


def _run_mem0(plan: Plan, fakes: dict[str, FakeMem0], experiment: Any, sizes: Sizes) -> list[dict[str, Any]]:
    keys = {a.uid: f"key-{a.uid}" for a in plan.agents}

    async def run() -> list[dict[str, Any]]:
        ev = Events()
        for name, fake in fakes.items():
            t = Mem0Target(name, "http://probe.invalid", f"probe-{plan.nonce}-{name}", keys,
                           backend_key="mem0-admin" if name == "direct" else None, transport=httpx.MockTransport(fake))
            try:
                await experiment(plan, t, no_embed, ev, sizes)
            finally:
                await t.close()
        return ev.items

    return asyncio.run(run())


def test_forgetting_on_mem0_probes_history_and_lineage_and_reports_what_is_missing() -> None:
    plan, sizes = Plan.build(5), Sizes.tiny()
    events = _run_mem0(plan, {"direct": FakeMem0(False), "sidecar": FakeMem0(True)}, forgetting, sizes)
    paths, _, unsupported = summarize(events)
    by = {(p.path, p.target): p for p in paths if p.experiment == "forgetting"}
    gone, kept = sizes.forget_deleted, sizes.forget_rows - sizes.forget_deleted
    # Mem0 alone: get/list/search forget, history does not (its text and a DELETE entry stay)
    for path in ("get", "list", "search-exact-text", "confirm-by-status-or-shape"):
        assert by[(path, "direct")].leak.k == 0 and by[(path, "direct")].leak.n == gone, path
    for path in ("history", "history-vs-never-existed", "recovered-any-path"):
        assert (by[(path, "direct")].leak.k, by[(path, "direct")].leak.n) == (gone, gone), path
    assert (by[("history", "direct")].miss.k, by[("history", "direct")].miss.n) == (0, kept)
    # through the sidecar: nothing on any path, and a deleted id answers like one that never existed
    for (path, target), p in by.items():
        if target == "sidecar":
            assert p.leak.k == 0 and p.miss.k == 0, (path, p)
    assert by[("lineage-vs-never-existed", "sidecar")].leak.n == 2 * gone  # reader and owner
    assert (by[("lineage-child", "sidecar")].leak.n, by[("lineage-child", "sidecar")].miss.n) == (gone, kept)
    assert by[("history", "sidecar")].miss.n == kept and ("lineage", "direct") not in by
    assert {(u["target"], u["path"]) for u in unsupported} == {("direct", "lineage"), ("direct", "count"), ("sidecar", "count")}


def test_provenance_reads_the_lineage_endpoint_through_the_sidecar_and_walks_gets_directly() -> None:
    plan, sizes = Plan.build(5), Sizes(chains=5)  # chain 4's third hop claims another writer
    fakes = {"direct": FakeMem0(False), "sidecar": FakeMem0(True)}
    events = _run_mem0(plan, fakes, provenance, sizes)
    paths, lats, unsupported = summarize(events)
    by = {(p.path, p.target): p for p in paths}
    for target in ("direct", "sidecar"):
        assert by[("completeness", target)].miss == wilson(0, 5) and by[("depth", target)].miss == wilson(0, 5)
        assert by[("write", target)].miss == wilson(0, 20)
    assert by[("writer", "sidecar")].miss == wilson(0, 20)
    assert by[("writer", "direct")].miss == wilson(1, 20)  # the forged claim is all Mem0 has
    # parents: mw_derived_from (Mem0 ids) through the sidecar, plain derived_from directly
    assert sum("mw_derived_from" in m for m in fakes["sidecar"].added) == 15
    assert sum("derived_from" in m for m in fakes["direct"].added) == 15
    assert not any(k.startswith("mw_") for m in fakes["direct"].added for k in m)
    n = {(lt.op, lt.target): lt.n for lt in lats}
    assert n[("lineage", "sidecar")] == 5 and n[("hop", "sidecar")] == 5  # one lineage call per chain
    assert n[("hop", "direct")] == 20 and ("lineage", "direct") not in n  # one get per hop
    assert [(u["target"], u["path"]) for u in unsupported] == [("direct", "lineage-endpoint")]
    # a lineage answer that hides the roots counts against completeness, depth and the roots' writers
    wrong = summarize(_run_mem0(plan, {"sidecar": FakeMem0(True, redact_roots=True)}, provenance, sizes))[0]
    bad = {p.path: p.miss for p in wrong}
    assert bad["completeness"] == wilson(5, 5) and bad["depth"] == wilson(5, 5) and bad["writer"] == wilson(5, 20)


def test_contradiction_on_mem0_filters_plain_keys_and_sends_the_triple_only_through_the_sidecar() -> None:
    plan, sizes = Plan.build(5), Sizes.tiny()
    fakes = {"direct": FakeMem0(False), "sidecar": FakeMem0(True)}
    paths, _, _ = summarize(_run_mem0(plan, fakes, contradiction, sizes))
    by = {(p.path, p.target): p for p in paths}
    facts = sizes.contradiction_facts
    assert all({"mw_subject", "mw_predicate", "mw_object", "subject", "predicate"} <= set(m) for m in fakes["sidecar"].added)
    assert all(set(m) >= {"subject", "predicate", "object"} and not any(k.startswith("mw_") for k in m)
               for m in fakes["direct"].added)
    # the Mem0 profile refuses filters on mw_* keys: facts are selected by the plain keys on both targets
    assert all(not any(k.startswith("mw_") for k in f) for fake in fakes.values() for f in fake.search_filters)
    for mode in ("sequential", "concurrent"):
        assert (by[(mode, "sidecar")].leak.k, by[(mode, "direct")].leak.k) == (0, facts)
        assert by[(f"{mode}-newest", "sidecar")].miss == wilson(0, facts)
    assert by[("sequential-search", "direct")].leak.k == facts and by[("sequential-search", "sidecar")].leak.k == 0


def test_mem0_target_names_and_answers() -> None:
    t = Mem0Target("direct", "http://probe.invalid", "space", backend_key="k")
    try:
        ghost = t.native("never-written")
        assert uuid.UUID(ghost).version == 5 and t.native("never-written") == ghost  # no Mem0 id is version 5
        assert not t.seen(Result(200, 1.0, None), "never-written")  # Mem0's 200 null for a missing id
        assert t.seen(Result(200, 1.0, {"results": [{"id": "x", "memory": "the text"}]}), "never-written", "the text")
        assert t.supports == {"history"}
        assert Mem0Target("sidecar", "http://probe.invalid", "s").supports == {"history", "lineage"}
        assert ChromaTarget("direct", "http://probe.invalid", {}).supports == {"count"}
        with pytest.raises(ValueError):
            Mem0Target("baseline", "http://probe.invalid", "s")
    finally:
        asyncio.run(t.close())


def test_probe_run_refuses_bad_backend_options_before_starting_anything(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from sidecar.cli import app

    for args in (["--backend", "qdrant"], ["--backend-url", "http://x"], ["--chroma-url", "http://x"],
                 ["--backend", "mem0", "--chroma-url", "http://x", "--sidecar-url", "http://y", "--ledger", "l.db"],
                 ["--chroma-url", "http://x", "--backend-url", "http://x", "--sidecar-url", "http://y", "--ledger", "l.db"]):
        result = CliRunner().invoke(app, ["probe", "run", "--out", str(tmp_path), *args])
        assert result.exit_code == 2, (args, result.output)
    assert not list(tmp_path.iterdir())
