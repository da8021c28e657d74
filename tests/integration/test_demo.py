"""The README's main job (`make demo` → `memwarden-eval demo`) runs end to end and finds no leak and no miss."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from memwarden_eval.demo import run_demo

pytestmark = pytest.mark.integration


def test_demo_scenario_passes(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(tmp_path, Console(file=out, width=200)) == 0
    text = out.getvalue()
    assert "14 principals" in text and "0 leaks, 0 misses" in text
    assert text.count(" ok ") == 14
