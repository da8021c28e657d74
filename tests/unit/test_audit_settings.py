"""Issue 34 (findings 4 and 6): the settings of the audit trail and of shadow mode are validated at start-up.

- ``LOG_LEVEL`` is one of Python logging's five levels (any case); ``verbose`` and numbers are refused with a
  message naming the variable and the levels (on main any text was accepted and an unknown one meant INFO).
- ``DECISION_LOG`` is ``on`` (default) or ``off``; anything else is refused.
- ``SHADOW_MODE`` is ``off``, ``reads`` or ``all``; the legacy booleans still work (true = reads) and every
  mode but off still needs ``SHADOW_MODE_CONFIRM``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from sidecar.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]
CONFIRM = "decisions-are-not-enforced"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for k in list(os.environ):
        if k.upper().startswith("MEMWARDEN_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)  # no .env of the working directory
    yield


@pytest.mark.parametrize("value, level", [("debug", "DEBUG"), ("INFO", "INFO"), ("Warning", "WARNING"),
                                          (" error ", "ERROR"), ("critical", "CRITICAL")])
def test_known_log_levels_are_kept_in_upper_case(monkeypatch: pytest.MonkeyPatch, value: str, level: str) -> None:
    monkeypatch.setenv("MEMWARDEN_LOG_LEVEL", value)
    assert load_settings().log_level == level


@pytest.mark.parametrize("value", ["verbose", "WARN", "10", "", "info,debug", "TRACE"])
def test_unknown_log_levels_are_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MEMWARDEN_LOG_LEVEL", value)
    with pytest.raises(ConfigError, match=r"log_level \(MEMWARDEN_LOG_LEVEL\): unknown log level .*debug, info, warning"):
        load_settings()


def test_decision_log_is_on_by_default_and_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().decision_log == "on"
    for value, expected in (("off", "off"), ("OFF", "off"), ("on", "on")):
        monkeypatch.setenv("MEMWARDEN_DECISION_LOG", value)
        assert load_settings().decision_log == expected
    for bad in ("false", "0", "no", "yes", "maybe"):
        monkeypatch.setenv("MEMWARDEN_DECISION_LOG", bad)
        with pytest.raises(ConfigError, match=r"decision_log \(MEMWARDEN_DECISION_LOG\): .*use on or off"):
            load_settings()


@pytest.mark.parametrize("value, mode", [("false", "off"), ("off", "off"), ("0", "off"), ("true", "reads"),
                                         ("1", "reads"), ("reads", "reads"), ("READS", "reads"), ("all", "all")])
def test_shadow_mode_values(monkeypatch: pytest.MonkeyPatch, value: str, mode: str) -> None:
    monkeypatch.setenv("MEMWARDEN_SHADOW_MODE", value)
    monkeypatch.setenv("MEMWARDEN_SHADOW_MODE_CONFIRM", CONFIRM)
    assert load_settings().shadow_mode == mode


def test_shadow_mode_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMWARDEN_SHADOW_MODE", "writes")
    with pytest.raises(ConfigError, match=r"shadow_mode \(MEMWARDEN_SHADOW_MODE\): 'writes': use off, reads or all"):
        load_settings()
    for mode in ("true", "reads", "all"):  # every mode that does not enforce needs the confirmation
        monkeypatch.setenv("MEMWARDEN_SHADOW_MODE", mode)
        with pytest.raises(ConfigError, match="SHADOW_MODE_CONFIRM"):
            load_settings()


def test_serve_refuses_an_unknown_log_level_with_one_line(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.upper().startswith("MEMWARDEN_")},
           "MEMWARDEN_LOG_LEVEL": "verbose", "MEMWARDEN_LEDGER_PATH": str(tmp_path / "l.db"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", "1"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "MEMWARDEN_LOG_LEVEL" in text and "unknown log level 'verbose'" in text and "Traceback" not in text
