"""memwarden-eval bench gatemem on the synthetic episode (tests/fixtures/gatemem), with real servers: `chroma run`
and `memwarden serve` with the medical policy set, all-MiniLM-L6-v2 embeddings; and `--backend mem0`: the same
episode over our Mem0 REST server (evaluation/memwarden_eval/mem0_server.py, the real mem0ai Memory; the mem0 tests' fixture) with a
sidecar in Mem0 mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memwarden_eval.gatemem import report
from memwarden_eval.gatemem.runner import Config, DomainResult, Record, run
from tests.integration.mem0.conftest import MEM0_KEY

pytestmark = pytest.mark.integration
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gatemem"


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, list[DomainResult], object, float]:
    cfg = Config(data_dir=FIXTURE, out_dir=tmp_path_factory.mktemp("gatemem"), domains=("medical",), ks=(5, 10), jobs=1,
                 cause_k=10)
    results, timings, wall = run(cfg)
    return cfg, results, timings, wall


def _rec(results: list[DomainResult], n: int, variant: str) -> Record:
    cid = f"med_synthetic_001_ckpt_{n:02d}"
    return next(r for r in results[0].records if r.checkpoint_id == cid and r.variant == variant)


def test_every_checkpoint_in_every_variant(result: tuple) -> None:
    _, results, _, _ = result
    d = results[0]
    assert d.episodes == 1 and d.turns == 24 and d.checkpoints == 10
    assert sorted({(r.checkpoint_id, r.variant) for r in d.records}) == sorted(
        (f"med_synthetic_001_ckpt_{n:02d}", v) for n in range(1, 11) for v in "abc")
    assert all(set(r.scores) == {5, 10} for r in d.records)


def test_sidecar_enforces_what_cedar_decides_offline(result: tuple) -> None:
    _, results, _, _ = result
    # every row the sidecar served in (b) is one the domain policy set permits to the asker (roles on the keys,
    # labels on the rows, decided at run time by the sidecar)
    assert results[0].stats.get("b_offline_disagreements", 0) == 0


@pytest.mark.parametrize("run", ["result", "mem0_result"])
def test_backend_alone_leaks_and_remembers(run: str, request: pytest.FixtureRequest) -> None:
    """Variant (a), Chroma or Mem0 without memwarden: every protected fact and every deleted one comes back."""
    _, results, _, _ = request.getfixturevalue(run)
    for n in (3, 4, 5, 9):
        assert _rec(results, n, "a").scores[10].leak is True, n
    for n in (6, 7):
        assert _rec(results, n, "a").scores[10].forget_fail is True, n


def test_memwarden_ingest_labels(result: tuple) -> None:
    _, results, _, _ = result
    # family logistics-only, unassigned clinician, revoked family access, another patient: nothing protected served
    for n in (3, 4, 5, 9):
        r = _rec(results, n, "b")
        assert r.scores[10].leak is False, (n, r.rows)
    assert _rec(results, 4, "b").rows and set(_rec(results, 4, "b").rows) <= {"t013", "t014"}   # Dr. Roe: Cara's rows
    # the deletion request at t021 was executed: neither the rows nor later restatements hold the number
    for n in (6, 7):
        r = _rec(results, n, "b")
        assert r.scores[10].forget_fail is False and not {"t004", "t005"} & set(r.rows)
    # utility survives: the patient, the family before revocation, the scheduler, the covering clinician
    for n in (1, 2, 8, 10):
        assert _rec(results, n, "b").scores[10].recall == 1.0, n


def test_oracle_is_an_upper_bound(result: tuple) -> None:
    _, results, _, _ = result
    for r in results[0].records:
        if r.variant == "c" and r.query_type != "utility":
            assert not r.scores[10].leak and not r.scores[10].forget_fail, r.checkpoint_id


def test_deletes_reached_chroma(result: tuple) -> None:
    cfg, _, _, _ = result
    # The run's Chroma is stopped; its data directory persists: open it with the sidecar gone and check the
    # collections of variant (b) directly.
    import chromadb

    client = chromadb.PersistentClient(path=str(cfg.out_dir / "work" / "chroma"), tenant="gmb-med000",
                                       database="gatemem", settings=chromadb.config.Settings(anonymized_telemetry=False))
    got = client.get_collection("memories").get(ids=["t004", "t005", "t010", "t004~t021"])
    assert sorted(got["ids"]) == ["t004~t021", "t010"]
    rewritten = got["documents"][got["ids"].index("t004~t021")]
    assert "555-0101" not in rewritten and "[deleted]" in rewritten
    meta = client.get_collection("memories").get(ids=["t009"], include=["metadatas"])["metadatas"][0]
    assert meta["mw_labels"] == "clinical" and meta["mw_scope"] == "restricted"
    readers = meta["mw_readers"].split(",")
    assert "gmb-med000/ep/clinician_dr_kim" in readers and "gmb-med000/ep/clinician_dr_roe" not in readers
    assert "gmb-med000/ep/family_ben_ruiz" not in readers            # re-scoped by the revocation at t018
    direct = chromadb.PersistentClient(path=str(cfg.out_dir / "work" / "chroma"), tenant="gma-med000",
                                       database="gatemem", settings=chromadb.config.Settings(anonymized_telemetry=False))
    assert sorted(direct.get_collection("memories").get(ids=["t004", "t005"])["ids"]) == ["t004", "t005"]


def test_report(result: tuple) -> None:
    cfg, results, timings, wall = result
    md = report.write(cfg, results, timings, wall, "memwarden-eval bench gatemem --data tests/fixtures/gatemem")
    text = md.read_text()
    assert "| medical | (a) |" in text and "| medical | (c) |" in text and "family_overreach" in text
    summary = json.loads((cfg.out_dir / "summary.json").read_text())
    b = summary["by_k"]["10"]["medical/b"]
    assert b["leak"]["k"] == 0 and b["leak"]["n"] == 4 and b["forget_fail"]["n"] == 2
    a = summary["by_k"]["10"]["medical/a"]
    assert a["leak"]["k"] == 4
    assert summary["cost"]["direct:add"]["n"] == 24 and summary["cost"]["sidecar:query"]["n"] == 10
    assert (cfg.out_dir / "gatemem.png").stat().st_size > 10_000
    lines = (cfg.out_dir / "records.jsonl").read_text().splitlines()
    assert len(lines) == 30 and json.loads(lines[0])["scores"]["10"]["k"] == 10


# ---- --backend mem0: the same episode over the Mem0 REST backend (evaluation/memwarden_eval/mem0_server.py, real mem0ai Memory) ----

MEM0_TAG = "t16"


@pytest.fixture(scope="module")
def mem0_result(tmp_path_factory: pytest.TempPathFactory, mem0_server) -> tuple[Config, list[DomainResult], object, float]:  # noqa: F811
    cfg = Config(data_dir=FIXTURE, out_dir=tmp_path_factory.mktemp("gatemem-mem0"), domains=("medical",), ks=(5, 10), jobs=1,
                 cause_k=10, backend="mem0", mem0_url=mem0_server.url, mem0_key=MEM0_KEY, run_tag=MEM0_TAG)
    results, timings, wall = run(cfg)
    return cfg, results, timings, wall


def _mem0_rows(server_url: str, run_id: str) -> dict[str, dict]:
    """Mem0's own view (its admin key, no memwarden) of the memories of `run_id`, by the benchmark's row id."""
    import httpx

    r = httpx.get(f"{server_url}/memories", params={"run_id": run_id, "top_k": 1000}, headers={"X-API-Key": MEM0_KEY},
                  timeout=60, trust_env=False)
    r.raise_for_status()
    return {m["metadata"]["gm_row"]: m for m in r.json()["results"]}


def test_mem0_every_checkpoint_and_sidecar_matches_cedar(mem0_result: tuple) -> None:
    _, results, _, _ = mem0_result
    d = results[0]
    assert d.episodes == 1 and d.turns == 24 and d.checkpoints == 10
    assert sorted({(r.checkpoint_id, r.variant) for r in d.records}) == sorted(
        (f"med_synthetic_001_ckpt_{n:02d}", v) for n in range(1, 11) for v in "abc")
    # rows come back under the benchmark's row ids (t001…, rewrites t004~t021), not Mem0's UUIDs
    assert all(rid.startswith("t") for r in d.records for rid in r.rows)
    assert d.stats.get("b_offline_disagreements", 0) == 0


def test_mem0_through_memwarden(mem0_result: tuple) -> None:
    _, results, _, _ = mem0_result
    for n in (3, 4, 5, 9):
        for v in "bc":
            r = _rec(results, n, v)
            assert r.scores[10].leak is False, (n, v, r.rows)
    assert _rec(results, 4, "b").rows and set(_rec(results, 4, "b").rows) <= {"t013", "t014"}   # Dr. Roe: Cara's rows
    for n in (6, 7):
        for v in "bc":   # deletion closure: F = 0, the deleted rows never come back
            r = _rec(results, n, v)
            assert r.scores[10].forget_fail is False and not {"t004", "t005"} & set(r.rows), (n, v, r.rows)
    for n in (1, 2, 8, 10):
        assert _rec(results, n, "b").scores[10].recall == 1.0, n
        assert _rec(results, n, "c").scores[10].recall > 0, n


def test_mem0_deletes_and_rescopes_reached_mem0(mem0_result: tuple, mem0_server) -> None:  # noqa: F811
    b = _mem0_rows(mem0_server.url, f"gmb-med000-{MEM0_TAG}")
    assert "t004" not in b and "t005" not in b and "t010" in b
    assert "555-0101" not in b["t004~t021"]["memory"] and "[deleted]" in b["t004~t021"]["memory"]
    meta = b["t009"]["metadata"]
    assert meta["mw_labels"] == ["clinical"] and meta["mw_scope"] == "restricted"
    assert "gmb-med000/ep/clinician_dr_kim" in meta["mw_readers"] and "gmb-med000/ep/clinician_dr_roe" not in meta["mw_readers"]
    assert "gmb-med000/ep/family_ben_ruiz" not in meta["mw_readers"]            # re-scoped by the revocation at t018
    assert b["t009"]["agent_id"] == "gmb-med000/ep/clinician_dr_kim"          # written as its speaker
    a = _mem0_rows(mem0_server.url, f"gma-med000-{MEM0_TAG}")
    assert {"t004", "t005"} <= set(a) and len(a) == 24                         # Mem0 alone deleted nothing


def test_mem0_report(mem0_result: tuple) -> None:
    cfg, results, timings, wall = mem0_result
    report.write(cfg, results, timings, wall, "memwarden-eval bench gatemem --backend mem0 --data tests/fixtures/gatemem")
    summary = json.loads((cfg.out_dir / "summary.json").read_text())
    assert summary["backend"] == "mem0" and summary["variants"]["a"] == "Mem0 alone (no memwarden)"
    k10 = summary["by_k"]["10"]
    assert k10["medical/a"]["leak"]["k"] == 4 and k10["medical/a"]["forget_fail"]["k"] == 2
    for v in "bc":
        assert k10[f"medical/{v}"]["leak"]["k"] == 0 and k10[f"medical/{v}"]["forget_fail"]["k"] == 0
    assert k10["medical/b"]["utility_recall"] > 0
    assert summary["cost"]["direct:add"]["n"] == 24 and summary["cost"]["sidecar:query"]["n"] == 10
    assert "Mem0 alone" in (cfg.out_dir / "summary.md").read_text()
