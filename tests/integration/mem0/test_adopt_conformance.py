"""Done-when of issue 14 (adopt): a Chroma holding rows written straight into it and a Mem0 store holding
memories written straight into it (neither through the sidecar) are adopted by declared rules, and then the
conformance run — cedarpy as the oracle, every principal × every read path — passes on the adopted rows.

The rules give each seed of `tests.conformance.corpus.SEEDS` the governance that test gives it by
writing through the sidecar (owner = its writer, the requested fleet, scope and readers), read from plain
metadata the application wrote (author, visibility, share, home) and, on Mem0, from the application's own
agent_id. One row per backend is covered by no rule: it must never be served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Stack, Tenant
from tests.integration.mem0.conftest import MEM0_KEY, Mem0Stack, World
from tests.conformance.corpus import AGENTS, PRINCIPALS, SEEDS, oracle
from tests.conformance.drivers import EMB

pytestmark = pytest.mark.integration

TEXT = {"alpha": "hiking in the mountains on the weekend", "beta": "the quarterly budget review is on friday"}
FLEET = {agent: fleet for fleet, agent, _ in AGENTS}


def app_metadata(s: Any) -> dict[str, Any]:
    """What an application without memwarden might have stored about a seed: plain keys only."""
    meta: dict[str, Any] = {"author": s.writer, "visibility": s.scope, "topic": s.topic, "seed": s.row_id}
    if s.readers:
        meta["share"] = ",".join(s.readers)
    if s.fleet:
        meta["home"] = s.fleet
    return meta


def rules(tenant: str, head: str, native: bool) -> str:
    """Rules mapping each writer (by metadata author, or on Mem0 by its agent_id) to its agent, a cross-fleet
    row (``home``) to its fleet, ``visibility`` to the scope and ``share`` to the readers."""
    text = f'tenant = "{tenant}"\n{head}\n[scope_from]\nkey = "visibility"\nreaders_key = "share"\n'
    for w in sorted({s.writer for s in SEEDS}):
        native_id = f'agent_id = "{tenant}-bot-{w}"\n' if native else ""
        author = "" if native else f'author = "{w}", '
        for home in sorted({s.fleet for s in SEEDS if s.writer == w and s.fleet}):
            text += f'\n[[map]]\n{native_id}metadata = {{ {author}home = "{home}" }}\nowner = "{FLEET[w]}/{w}"\nfleet = "{home}"\n'
        text += f'\n[[map]]\n{native_id}' + ("" if native else f'metadata = {{ author = "{w}" }}\n') + f'owner = "{FLEET[w]}/{w}"\n'
    return text


def run_adopt(ledger: Path, backend: str, url: str, rules_file: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    exe = Path(sys.executable).with_name("memwarden")
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")}
    r = subprocess.run([str(exe), "adopt", backend, "--rules", str(rules_file), "--ledger", str(ledger),
                        "--backend-url", url, "--format", "json"],
                       capture_output=True, text=True, timeout=600, env={**base, **(env or {})})
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout)[0])


# -- Chroma --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chroma_world(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Tenant:
    t = stack.tenant("aconf")
    for fleet, agent, trust in AGENTS:
        t.keys[agent] = stack.key(t.name, fleet, agent, trust)
    t.keys["admin"] = t.admin_key
    coll = stack.direct(t.name).create_collection("adopted")
    coll.add(ids=[s.row_id for s in SEEDS] + ["ungoverned"], embeddings=[EMB[s.row_id] for s in SEEDS] + [EMB["ungoverned"]],
             documents=[f"doc {s.row_id}" for s in SEEDS] + ["nobody's"],
             metadatas=[app_metadata(s) for s in SEEDS] + [{"topic": "alpha", "visibility": "tenant",
                                                           "mw_tenant": t.name, "mw_scope": "tenant"}])
    path = tmp_path_factory.mktemp("aconf") / "rules.toml"
    path.write_text(rules(t.name, '[[collection]]\nname = "adopted"', native=False))
    rep = run_adopt(stack.ledger_path, "chroma", stack.chroma.url, path)
    assert rep["adopted"] == len(SEEDS) and [u["id"] for u in rep["uncovered"]] == ["ungoverned"]
    return t


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_chroma_adopted_reads_match_cedar(stack: Stack, chroma_world: Tenant, principal: str) -> None:
    t = chroma_world
    expected = oracle(t.name, principal, "read")
    every = [s.row_id for s in SEEDS] + ["ungoverned"]
    assert expected and expected != set(every), "degenerate oracle"
    coll = stack.client(t.keys[principal], t.name).get_collection("adopted")
    assert set(coll.get(ids=every)["ids"]) == expected
    assert set(coll.get()["ids"]) == expected
    alpha = {s.row_id for s in SEEDS if s.topic == "alpha"}
    assert set(coll.get(where={"topic": "alpha"})["ids"]) == expected & alpha
    assert set(coll.query(query_embeddings=[EMB["r1-agent"]], n_results=len(every))["ids"][0]) == expected
    assert coll.count() == len(expected)


# -- Mem0 ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mem0_world(mem0_stack: Mem0Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[World, dict[str, str]]:
    w = mem0_stack.world(AGENTS, prefix="aconf")
    w.keys["admin"] = w.admin
    ids: dict[str, str] = {}
    with mem0_stack.direct() as d:  # straight into Mem0, with the application's own agent ids
        for s in SEEDS + [None]:
            agent = f"{w.name}-bot-{s.writer}" if s else f"{w.name}-stranger"
            meta = app_metadata(s) if s else {"topic": "alpha", "visibility": "tenant", "mw_tenant": w.name}
            text = f"{TEXT[s.topic]} ({s.row_id})" if s else TEXT["alpha"] + " (stranger)"
            r = d.post("/memories", json={"messages": [{"role": "user", "content": text}], "agent_id": agent,
                                          "user_id": "u1", "infer": False, "metadata": meta})
            assert r.status_code == 200, r.text
            ids[s.row_id if s else "ungoverned"] = r.json()["results"][0]["id"]
    path = tmp_path_factory.mktemp("aconf-mem0") / "rules.toml"
    path.write_text(rules(w.name, '[mem0]\ndeployment = "default"', native=True))
    env = {"MEMWARDEN_BACKEND_TOKEN": MEM0_KEY, "MEMWARDEN_BACKEND": "mem0"}
    rep = run_adopt(mem0_stack.ledger_path, "mem0", mem0_stack.mem0.url, path, env)
    assert rep["adopted"] == len(SEEDS), rep
    assert ids["ungoverned"] in {u["id"] for u in rep["uncovered"]}
    again = run_adopt(mem0_stack.ledger_path, "mem0", mem0_stack.mem0.url, path, env)
    assert again["adopted"] == 0 and again["restamped"] == 0  # idempotent
    return w, ids


def _names(ids: dict[str, str], rows: list[dict[str, Any]]) -> set[str]:
    back = {v: k for k, v in ids.items()}
    return {back.get(r["id"], r["id"]) for r in rows}


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_mem0_adopted_reads_match_cedar(mem0_stack: Mem0Stack, mem0_world: tuple[World, dict[str, str]],
                                        principal: str) -> None:
    w, ids = mem0_world
    expected = oracle(w.name, principal, "read")
    assert expected and expected != set(ids), "degenerate oracle"
    with mem0_stack.http(w.keys[principal]) as h:
        assert {n for n, mid in ids.items() if h.get(f"/memories/{mid}").status_code == 200} == expected
        assert {n for n, mid in ids.items() if h.get(f"/memories/{mid}/history").status_code == 200} == expected
        assert _names(ids, h.get("/memories").json()["results"]) == expected
        assert _names(ids, h.get("/memories", params={"user_id": "u1", "top_k": 100}).json()["results"]) == expected
        # listed by the agent_id the application gave them in Mem0 (which adoption keeps), as Mem0 answers it
        for writer in sorted({s.writer for s in SEEDS}):
            by_agent = h.get("/memories", params={"agent_id": f"{w.name}-bot-{writer}", "top_k": 100})
            assert by_agent.status_code == 200, by_agent.text
            assert _names(ids, by_agent.json()["results"]) == expected & {s.row_id for s in SEEDS if s.writer == writer}
            hits = h.post("/search", json={"query": TEXT["alpha"], "top_k": 50, "threshold": 0.0,
                                           "filters": {"agent_id": f"{w.name}-bot-{writer}"}})
            assert hits.status_code == 200, hits.text
            assert _names(ids, hits.json()["results"]) == expected & {s.row_id for s in SEEDS if s.writer == writer}
        hits = h.post("/search", json={"query": TEXT["alpha"], "top_k": 50, "threshold": 0.0}).json()["results"]
        assert _names(ids, hits) & set(ids) == expected
        alpha = {s.row_id for s in SEEDS if s.topic == "alpha"}
        hits = h.post("/search", json={"query": "anything", "top_k": 50, "threshold": 0.0,
                                       "filters": {"topic": "alpha"}}).json()["results"]
        assert _names(ids, hits) & set(ids) == expected & alpha
