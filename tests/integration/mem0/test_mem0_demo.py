"""`memwarden-eval demo --backend mem0` runs end to end and finds no leak and no miss."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from memwarden_eval.demo_mem0 import run_mem0_demo

pytestmark = pytest.mark.integration


def test_mem0_demo_scenario_passes(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_mem0_demo(tmp_path, Console(file=out, width=200)) == 0, out.getvalue()
    assert "0 leaks, 0 misses" in out.getvalue()
