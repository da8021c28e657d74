"""``MEMWARDEN_LEDGER_PG_DIRECT`` (issue 35): ``on`` (default) or ``off``, any case and surrounding blanks;
anything else is refused at start-up with a message naming the variable; the value reaches `PostgresLedger`
through `ledger_from_settings` (on: the direct read of `sidecar.ledger.pg_direct`; off: none)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from sidecar.config import ConfigError, load_settings
from sidecar.ledger import ledger_from_settings
from sidecar.ledger.postgres import PostgresLedger
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for k in list(os.environ):
        if k.upper().startswith("MEMWARDEN_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)  # no .env of the working directory
    yield


def test_on_by_default_and_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().ledger_pg_direct == "on"
    for value, expected in (("off", "off"), ("OFF", "off"), (" on ", "on"), ("On", "on")):
        monkeypatch.setenv("MEMWARDEN_LEDGER_PG_DIRECT", value)
        assert load_settings().ledger_pg_direct == expected
    for bad in ("true", "false", "0", "1", "yes", "direct", ""):
        monkeypatch.setenv("MEMWARDEN_LEDGER_PG_DIRECT", bad)
        with pytest.raises(ConfigError, match=r"ledger_pg_direct \(MEMWARDEN_LEDGER_PG_DIRECT\): .*use on .* or off"):
            load_settings()


@pytest.mark.parametrize("value", ["on", "off"])
def test_the_setting_reaches_the_postgres_ledger(monkeypatch: pytest.MonkeyPatch, pg_url: str, value: str) -> None:  # noqa: F811
    monkeypatch.setenv("MEMWARDEN_LEDGER_PG_DIRECT", value)
    settings = load_settings(ledger_url=pg_url, ledger_schema=fresh_schema(), ledger_pool_min=0, ledger_pool_max=1)
    ledger = ledger_from_settings(settings)
    try:
        assert isinstance(ledger, PostgresLedger)
        assert (ledger._direct is not None) is (value == "on")  # noqa: SLF001
        assert ledger.read_rows("chroma", "c", ["absent"], None) == ({}, {}, True)
    finally:
        ledger.close()
