"""A tiny-N run of every probe experiment against the real Chroma fixture, direct and through the sidecar."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sidecar.cli import app
from sidecar.embeddings import embed
from sidecar.probe.experiments import EXPERIMENTS, Sizes
from sidecar.probe.metrics import summarize
from sidecar.probe.plan import Plan
from sidecar.probe.report import read_events
from sidecar.probe.runner import run_probe
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run_dir(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    console = Console(file=io.StringIO())
    return run_probe(Plan.build(3), list(EXPERIMENTS), stack.chroma.url, stack.sidecar.url, stack.ledger_path, out,
                     embed, Sizes.tiny(), console)


def test_every_experiment_ran_on_both_targets(run_dir: Path) -> None:
    assert run_dir.name.endswith("-all-seed3")
    for name in ("events.jsonl", "summary.csv", "summary.md", "leak_rates.png", "miss_rates.png", "latency.png", "meta.json"):
        assert (run_dir / name).stat().st_size > 0, name
    events = read_events(run_dir)
    seen = {(e["experiment"], e["target"]) for e in events if e["kind"] in ("probe", "latency")}
    assert seen == {(x, t) for x in EXPERIMENTS for t in ("direct", "sidecar")}
    # Chroma has no history or lineage route: reported, not failed.
    assert {(e["experiment"], e["path"]) for e in events if e["kind"] == "not_supported"} >= {("forgetting", "history"), ("forgetting", "lineage")}


def test_sidecar_closes_what_direct_chroma_leaks(run_dir: Path) -> None:
    paths, _, _ = summarize(read_events(run_dir))
    by = {(p.experiment, p.path, p.target): p for p in paths}
    # degeneracy guard: the bare backend really leaks, and the probes exercise both sides
    assert by[("leakage", "get", "direct")].leak.p == 1.0
    assert by[("leakage", "search", "direct")].leak.k > 0
    assert by[("propagation", "foreign-get", "direct")].leak.k > 0
    for p in paths:
        if p.target == "sidecar" and p.experiment in ("leakage", "propagation", "contradiction", "forgetting"):
            assert p.leak.k == 0 and p.miss.k == 0, p
    assert by[("leakage", "get", "sidecar")].leak.n > 50 and by[("leakage", "get", "sidecar")].miss.n > 10
    assert by[("provenance", "writer", "sidecar")].miss.k == 0


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


def test_plan_is_deterministic() -> None:
    a, b = Plan.build(11), Plan.build(11)
    assert a == b and len(a.agents) == 24 and Plan.build(12).nonce != a.nonce
    with pytest.raises(ValueError):
        Plan.build(1, fleets=2)
