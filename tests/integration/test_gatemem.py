"""memwarden bench gatemem on the synthetic episode (tests/fixtures/gatemem), with real servers: `chroma run`
and `memwarden serve` with the medical policy set, all-MiniLM-L6-v2 embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.bench.gatemem import report
from sidecar.bench.gatemem.runner import Config, DomainResult, Record, run

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


def test_chroma_alone_leaks_and_remembers(result: tuple) -> None:
    _, results, _, _ = result
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
    md = report.write(cfg, results, timings, wall, "memwarden bench gatemem --data tests/fixtures/gatemem")
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
