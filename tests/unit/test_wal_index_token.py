"""The SQLite caches' token read from the WAL index's header (`SQLiteLedger.cache_version`): every commit
that has returned, by any connection of any process, moves it — so a key revoked by another process fails
the next request — and it is read through SQLite (``PRAGMA data_version``) whenever the mapped header cannot
be trusted (a writer between its two copies, an index not initialised, no mapping)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
        assert raw._wal_index is not None
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


class Torn:
    """A stand-in for the mapping whose two header copies are `first` and `second`."""

    def __init__(self, first: bytes, second: bytes) -> None:
        self.data = first + second

    def __getitem__(self, item: Any) -> bytes:
        return self.data[item]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 47), st.integers(1, 255))
def test_a_header_whose_copies_differ_is_not_used(tmp_path_factory: Any, at: int, flip: int) -> None:
    raw = SQLiteLedger(Path(tmp_path_factory.mktemp("torn")) / "l.db")
    try:
        header = raw._wal_index[:96]  # type: ignore[index]
        second = bytearray(header[48:])
        second[at] ^= flip
        raw._wal_index = Torn(header[:48], bytes(second))  # type: ignore[assignment]
        token = raw.cache_version()
        assert token == (raw._db.execute("PRAGMA data_version").fetchone()[0], raw._writes)
        raw._wal_index = Torn(header[:12] + b"\0" + header[13:48], header[:12] + b"\0" + header[13:48])  # type: ignore[assignment]
        assert raw.cache_version() == token  # not initialised: through SQLite too
    finally:
        raw._wal_index = None
        raw.close()


def test_no_mapping_without_a_wal_file(tmp_path: Path) -> None:
    memory = SQLiteLedger(":memory:")
    try:
        assert memory._wal_index is None
        assert memory.cache_version() == (memory._db.execute("PRAGMA data_version").fetchone()[0], memory._writes)
    finally:
        memory.close()


def test_a_closed_ledger_still_refuses(tmp_path: Path) -> None:
    import sqlite3

    import pytest

    raw = SQLiteLedger(tmp_path / "l.db")
    raw.close()
    with pytest.raises(sqlite3.ProgrammingError):
        raw.cache_version()
