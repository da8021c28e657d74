"""A tiny-N run of every probe experiment against each backend profile, direct and through the sidecar: the
real Chroma fixture, and our Mem0 REST server on the real mem0ai `Memory` (started for this module) with a
sidecar (``MEMWARDEN_BACKEND=mem0``) in front of it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterator

import pytest
from rich.console import Console
from typer.testing import CliRunner

from memwarden_eval.cli import app
from memwarden_eval.embeddings import embed
from memwarden_eval.harness import start_mem0, start_sidecar
from memwarden_eval.probe.experiments import EXPERIMENTS, Sizes
from memwarden_eval.probe.metrics import PathSummary, summarize
from memwarden_eval.probe.plan import Plan
from memwarden_eval.probe.report import read_events, read_meta
from memwarden_eval.probe.runner import no_embed, run_probe
from tests.integration.conftest import POLICIES, Stack
from tests.integration.mem0.conftest import MEM0_KEY, sidecar_env

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run_dir(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    console = Console(file=io.StringIO())
    return run_probe(Plan.build(3), list(EXPERIMENTS), stack.chroma.url, stack.sidecar.url, stack.ledger_path, out,
                     embed, Sizes.tiny(), console)


def _by(run_dir: Path) -> dict[tuple[str, str, str], PathSummary]:
    paths, _, _ = summarize(read_events(run_dir))
    return {(p.experiment, p.path, p.target): p for p in paths}


def test_every_experiment_ran_on_both_targets(run_dir: Path) -> None:
    assert run_dir.name.endswith("-chroma-all-seed3") and read_meta(run_dir)["backend"] == "chroma"
    for name in ("events.jsonl", "summary.csv", "summary.md", "leak_rates.png", "miss_rates.png", "latency.png", "meta.json"):
        assert (run_dir / name).stat().st_size > 0, name
    events = read_events(run_dir)
    seen = {(e["experiment"], e["target"]) for e in events if e["kind"] in ("probe", "latency")}
    assert seen == {(x, t) for x in EXPERIMENTS for t in ("direct", "sidecar")}
    # Chroma has no history route, and alone no lineage route: reported, not failed.
    assert {(e["experiment"], e["path"], e["target"]) for e in events if e["kind"] == "not_supported"} == {
        ("forgetting", "history", "direct"), ("forgetting", "history", "sidecar"), ("forgetting", "lineage", "direct"),
        ("provenance", "lineage-endpoint", "direct")}


def test_sidecar_closes_what_direct_chroma_leaks(run_dir: Path) -> None:
    paths, _, _ = summarize(read_events(run_dir))
    by = {(p.experiment, p.path, p.target): p for p in paths}
    # degeneracy guard: the bare backend really leaks, and the probes exercise both sides
    assert by[("leakage", "get", "direct")].leak.p == 1.0
    assert by[("leakage", "search", "direct")].leak.k > 0
    assert by[("propagation", "foreign-get", "direct")].leak.k > 0
    for p in paths:
        if p.target == "sidecar":
            assert p.leak.k == 0 and p.miss.k == 0, p
    assert by[("leakage", "get", "sidecar")].leak.n > 50 and by[("leakage", "get", "sidecar")].miss.n > 10
    assert by[("provenance", "writer", "sidecar")].miss.n == 4 * Sizes.tiny().chains  # read from the lineage endpoint
    tiny = Sizes.tiny()
    assert by[("forgetting", "lineage-child", "sidecar")].leak.n == tiny.forget_deleted  # a deleted parent never shown
    assert by[("forgetting", "lineage-child", "sidecar")].miss.n == tiny.forget_rows - tiny.forget_deleted
    assert by[("forgetting", "lineage-vs-never-existed", "sidecar")].leak.n == 2 * tiny.forget_deleted


def test_sidecar_supersession_removes_stale_reads_that_direct_chroma_serves(run_dir: Path) -> None:
    """Through the sidecar the contradicting facts are one governed triple on a single-valued predicate,
    so the older fact is superseded: stale-read rate 0, newest-visible rate 1. Chroma alone serves both."""
    paths, _, _ = summarize(read_events(run_dir))
    by = {(p.experiment, p.path, p.target): p for p in paths}
    facts = Sizes.tiny().contradiction_facts
    for mode in ("sequential", "concurrent"):
        for path in (mode, f"{mode}-both-admitted"):  # every write admitted on both targets
            side, direct = by[("contradiction", path, "sidecar")].leak, by[("contradiction", path, "direct")].leak
            assert (side.k, side.n) == (0, facts), path
            assert (direct.k, direct.n) == (facts, facts), path  # measured: Chroma serves both facts
            for target in ("sidecar", "direct"):
                newest = by[("contradiction", f"{path}-newest", target)].miss
                assert (newest.k, newest.n) == (0, facts), (path, target)
    search = {t: by[("contradiction", "sequential-search", t)].leak for t in ("sidecar", "direct")}
    assert (search["sidecar"].k, search["sidecar"].n) == (0, facts) and search["direct"].k > 0


def test_report_is_recomputed_from_events_alone(run_dir: Path) -> None:
    before = (run_dir / "summary.csv").read_text()
    md = (run_dir / "summary.md").read_text()
    for name in ("summary.csv", "summary.md", "leak_rates.png"):
        (run_dir / name).unlink()
    result = CliRunner().invoke(app, ["probe", "report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "summary.csv").read_text() == before
    assert (run_dir / "summary.md").read_text() == md
    assert (run_dir / "leak_rates.png").exists()
    assert CliRunner().invoke(app, ["probe", "report", str(run_dir / "nope")]).exit_code == 2


@pytest.fixture(scope="module")
def mem0_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Our Mem0 REST server and a Mem0-profile sidecar for this module only, and one tiny run on them."""
    tmp = tmp_path_factory.mktemp("probe-mem0")
    mem0 = start_mem0(tmp / "mem0", MEM0_KEY)
    side = None
    try:
        side = start_sidecar(mem0.url, tmp / "ledger.db", POLICIES, extra_env=sidecar_env())
        yield run_probe(Plan.build(4), list(EXPERIMENTS), mem0.url, side.url, tmp / "ledger.db", tmp / "runs", no_embed,
                        Sizes.tiny(), Console(file=io.StringIO()), backend="mem0", backend_key=MEM0_KEY)
    finally:
        if side:
            side.stop()
        mem0.stop()


def test_mem0_every_experiment_ran_and_missing_paths_are_reported(mem0_run_dir: Path) -> None:
    assert mem0_run_dir.name.endswith("-mem0-all-seed4") and read_meta(mem0_run_dir)["backend"] == "mem0"
    assert "backend mem0" in (mem0_run_dir / "summary.md").read_text()
    events = read_events(mem0_run_dir)
    seen = {(e["experiment"], e["target"]) for e in events if e["kind"] in ("probe", "latency")}
    assert seen == {(x, t) for x in EXPERIMENTS for t in ("direct", "sidecar")}
    # Mem0 has history but no count route; lineage is the sidecar's
    assert {(e["experiment"], e["path"], e["target"]) for e in events if e["kind"] == "not_supported"} == {
        ("forgetting", "count", "direct"), ("forgetting", "count", "sidecar"), ("forgetting", "lineage", "direct"),
        ("provenance", "lineage-endpoint", "direct")}


def test_mem0_through_the_sidecar_leaks_and_misses_nothing(mem0_run_dir: Path) -> None:
    by = _by(mem0_run_dir)
    sidecar = [p for key, p in by.items() if key[2] == "sidecar"]
    for p in sidecar:
        assert p.leak.k == 0 and p.miss.k == 0, p
    tiny = Sizes.tiny()
    assert by[("leakage", "get", "sidecar")].leak.n > 50 and by[("leakage", "search", "sidecar")].miss.n > 10
    # lineage answers provenance (mw_derived_from) and forgetting; history is 404 for a deleted memory
    assert by[("provenance", "completeness", "sidecar")].miss.n == tiny.chains
    assert by[("provenance", "writer", "sidecar")].miss.n == 4 * tiny.chains
    assert by[("forgetting", "lineage-child", "sidecar")].leak.n == tiny.forget_deleted
    assert by[("forgetting", "lineage-vs-never-existed", "sidecar")].leak.n == 2 * tiny.forget_deleted
    assert by[("forgetting", "history-vs-never-existed", "sidecar")].leak.n == tiny.forget_deleted
    for mode in ("sequential", "concurrent"):  # supersession: stale-read rate 0 over admitted pairs
        assert by[("contradiction", f"{mode}-both-admitted", "sidecar")].leak.n == tiny.contradiction_facts


def test_mem0_alone_shows_its_known_leaks(mem0_run_dir: Path) -> None:
    """Measured: Mem0 alone serves every row to every agent, both contradicting facts, and a deleted
    memory's text from its history; its get, list and search do forget."""
    by = _by(mem0_run_dir)
    tiny = Sizes.tiny()
    assert by[("leakage", "get", "direct")].leak.p == 1.0 and by[("leakage", "search", "direct")].leak.k > 0
    assert by[("propagation", "foreign-get", "direct")].leak.p == 1.0
    for mode in ("sequential", "concurrent"):
        stale = by[("contradiction", mode, "direct")].leak
        assert (stale.k, stale.n) == (tiny.contradiction_facts, tiny.contradiction_facts)
    assert by[("contradiction", "sequential-search", "direct")].leak.k > 0
    for path in ("history", "history-vs-never-existed", "recovered-any-path"):
        leak = by[("forgetting", path, "direct")].leak
        assert (leak.k, leak.n) == (tiny.forget_deleted, tiny.forget_deleted), path
    for path in ("get", "list", "search-exact-text", "confirm-by-status-or-shape"):
        assert by[("forgetting", path, "direct")].leak.k == 0, path
    # every miss on Mem0 alone is 0 too: the baseline loses nothing, it only over-serves
    assert all(p.miss.k == 0 for key, p in by.items() if key[2] == "direct")


def test_plan_is_deterministic() -> None:
    a, b = Plan.build(11), Plan.build(11)
    assert a == b and len(a.agents) == 24 and Plan.build(12).nonce != a.nonce
    with pytest.raises(ValueError):
        Plan.build(1, fleets=2)
