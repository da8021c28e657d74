"""The SQLite caches' token (`SQLiteLedger.cache_version`: ``PRAGMA data_version`` and the connection's own
write count): every commit that has returned, by any connection of any process, moves it — so a key revoked
by another process fails the next request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sidecar.ledger import SQLiteLedger
from sidecar.ledger.cache import CachingLedger, request_scope

ROOT = Path(__file__).resolve().parents[2]


def _in_another_process(db: Path, code: str) -> None:
    subprocess.run([sys.executable, "-c", f"from sidecar.ledger import SQLiteLedger\nled = SQLiteLedger({str(db)!r})\n{code}\nled.close()"],
                   check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_a_key_revoked_by_another_process_fails_the_next_request(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    raw = SQLiteLedger(db)
    try:
        record, key = raw.create_key("agent", "t", "red", "a", 1)
        cached = CachingLedger(raw, raw.cache_version, ttl_s=3600, per_request=True)
        for _ in range(3):
            with request_scope():
                assert cached.authenticate(key) is not None
        assert cached.hits >= 2
        _in_another_process(db, f"assert led.revoke_key({record.key_id!r})")
        with request_scope():
            assert cached.authenticate(key) is None
        # ... and a new key another process made is found at once (nothing negative is cached anyway).
        _in_another_process(db, "open(%r, 'w').write(led.create_key('agent', 't', 'red', 'b', 1)[1])" % str(tmp_path / "k"))
        with request_scope():
            assert cached.authenticate((tmp_path / "k").read_text()) is not None
    finally:
        raw.close()


def test_a_commit_of_another_process_moves_the_token(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    raw = SQLiteLedger(db)
    try:
        before = raw.cache_version()
        _in_another_process(db, "led.create_key('agent', 't', 'red', 'a', 1)")
        after = raw.cache_version()
        assert after != before and raw.cache_version() == after
    finally:
        raw.close()


def test_an_in_memory_ledger_has_the_same_token() -> None:
    memory = SQLiteLedger(":memory:")
    try:
        assert memory.cache_version() == (memory._db.execute("PRAGMA data_version").fetchone()[0], memory._writes)
        memory.create_key("agent", "t", "red", "a", 1)
        assert memory.cache_version()[1] == memory._writes == 2  # the migration, then the key
    finally:
        memory.close()


def test_a_closed_ledger_still_refuses(tmp_path: Path) -> None:
    import sqlite3

    import pytest

    raw = SQLiteLedger(tmp_path / "l.db")
    raw.close()
    with pytest.raises(sqlite3.ProgrammingError):
        raw.cache_version()
