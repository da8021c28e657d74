"""`sidecar.erase` without a backend: the byte scan, its SQLite hint, the ledger match, the schedule's settings
and the command's output (issue 34, finding 7; the real backends are in tests/integration/test_erase.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sidecar.config import ConfigError, load_settings
from sidecar.erase import match_ledger
from sidecar.erase import scan as scan_mod
from sidecar.erase.scan import PIECE_BYTES, needles, pieces, scan, sqlite_free_pages
from sidecar.governance import Row
from sidecar.provenance import content_digest
from tests.unit.test_ledger import ledger, opener  # noqa: F401  (fixtures: both ledgers)
from tests.pgutil import pg_url  # noqa: F401  (fixture)

TEXT = "erase-marker 5f1c Alice keeps her passport in the blue drawer"


def test_needles_cover_the_encodings_and_normal_forms_without_duplicates() -> None:
    forms = {n.form: n.data for n in needles("café \"x\"")}
    assert forms["utf-8"] == "café \"x\"".encode()
    assert forms["utf-8 NFD"] == "cafe\u0301 \"x\"".encode()
    assert forms["utf-16-le"] == "café \"x\"".encode("utf-16-le") and "utf-16-be" in forms
    assert forms["json-escaped"] == b'caf\\u00e9 \\"x\\"' and forms["json"] == 'café \\"x\\"'.encode()
    plain = needles("plain ascii")  # its JSON forms are its UTF-8 bytes: listed once
    assert sorted(n.form for n in plain) == ["utf-16-be", "utf-16-le", "utf-8"]
    assert len({n.data for n in needles(TEXT)}) == len(needles(TEXT))
    assert pieces("short") == [] and all(len(p) == PIECE_BYTES for p in pieces(TEXT * 3))


def test_a_text_across_read_chunks_is_counted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_mod, "CHUNK_BYTES", 7)  # every occurrence straddles a chunk boundary
    (tmp_path / "f.bin").write_bytes(b"xx" + TEXT.encode() + b"\x00" * 13 + TEXT.encode("utf-16-le") + b"yy" + TEXT.encode())
    result = scan([tmp_path], [TEXT, "absent text"])
    [found] = result.found[0]
    # The UTF-16 LE copy after a NUL byte also reads as UTF-16 BE one byte earlier: one place, two forms.
    assert found.file == "f.bin" and found.places == 3
    assert found.forms == {"utf-8": 2, "utf-16-le": 1, "utf-16-be": 1}
    assert found.offsets == [2, 75, 200] and found.where == {"file": 3}
    assert result.found[1] == [] and result.files == 1 and result.unreadable == []


def test_symbolic_links_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text(TEXT)
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside / "secret")
    (root / "dirlink").symlink_to(outside, target_is_directory=True)
    assert scan([root], [TEXT]).found == [[]]


def test_sqlite_hits_are_placed_in_free_pages_or_pages_in_use(tmp_path: Path) -> None:
    """A deleted row's overflow pages go to the freelist; its first bytes stay in the table's page (no
    secure_delete). A long text spread over overflow pages is found in pieces, not whole."""
    db = tmp_path / "d.sqlite"
    con = sqlite3.connect(db)
    con.executescript("PRAGMA secure_delete=OFF; PRAGMA page_size=1024; PRAGMA auto_vacuum=NONE; CREATE TABLE t (x TEXT);")
    long_text = " ".join(f"word{i:04d}" for i in range(400))  # ~4 KB: over several 1 KiB overflow pages
    with con:
        con.execute("INSERT INTO t VALUES (?)", (TEXT + "-" * 5000 + TEXT,))
        con.execute("INSERT INTO t VALUES (?)", (long_text,))
    assert sqlite_free_pages(db) == (1024, set())
    with con:
        con.execute("DELETE FROM t WHERE x LIKE 'erase-marker%'")
    con.close()
    page_size, free = sqlite_free_pages(db)  # type: ignore[misc]
    assert page_size == 1024 and free
    result = scan([tmp_path], [TEXT, long_text])
    [found] = result.found[0]
    assert found.places == 2 and found.where == {"page in use": 1, "free page": 1}
    [split] = result.found[1]
    assert split.places == 0 and split.pieces_found > split.pieces_total // 2
    (tmp_path / "d.sqlite-wal").write_bytes(TEXT.encode())
    assert {f.file: f.where for f in scan([tmp_path], [TEXT]).found[0]}["d.sqlite-wal"] == {"SQLite write-ahead log file": 1}
    (tmp_path / "x.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xff" * 84)  # a header not as documented: no hint
    assert sqlite_free_pages(tmp_path / "x.sqlite") is None


def test_ledger_match_names_deleted_rows_and_counts_live_copies(ledger: Any) -> None:  # noqa: F811
    key = ledger.content_key()
    ledger.create_key("admin", "t", None, None, 0)
    ledger.create_key("admin", "u", None, None, 0)
    digest = content_digest(key, TEXT)
    rows = [Row("chroma", "c1", "gone", "t", "red", "t/red/a", "fleet", "t/red/a", 1, content_hmac=digest),
            Row("chroma", "c1", "kept", "t", "blue", "t/blue/b", "fleet", "t/blue/b", 1, content_hmac=digest),
            Row("chroma", "c2", "other", "u", "red", "u/red/a", "fleet", "u/red/a", 1, content_hmac=digest)]
    assert ledger.reserve_rows(rows) == []
    for r in rows:
        ledger.activate_rows("chroma", r.collection, [r.row_id])
    ledger.tombstone("chroma", "c1", ["gone"], "t/red/a", "req")
    # The match is up to the content normalisation (case, spacing, edge punctuation).
    [report, none] = match_ledger(ledger, "chroma", ["  " + TEXT.upper() + "!", "never written"])
    assert (report.deleted_count, report.deleted_rows, report.live_count) == (1, ["c1/gone"], 2)
    assert (none.deleted_count, none.live_count) == (0, 0)
    assert match_ledger(ledger, "mem0", [TEXT])[0].deleted_count == 0
    assert match_ledger(ledger, "chroma", [TEXT], tenants=["u"])[0].live_count == 1


def test_last_backend_delete_is_the_newest_confirmed_one(ledger: Any) -> None:  # noqa: F811
    assert ledger.last_backend_delete("chroma") is None
    rows = [Row("chroma", "c1", i, "t", "red", "t/red/a", "fleet", "t/red/a", 1) for i in ("a", "b")]
    assert ledger.reserve_rows(rows) == []
    ledger.activate_rows("chroma", "c1", ["a", "b"])
    ledger.tombstone("chroma", "c1", ["a", "b"], "t/red/a", "req")
    assert ledger.last_backend_delete("chroma") is None  # tombstoned, not yet deleted by the backend
    ledger.mark_backend_deleted("chroma", "c1", ["a"])
    first = ledger.last_backend_delete("chroma")
    assert first is not None and ledger.last_backend_delete("mem0") is None
    ledger.mark_backend_deleted("chroma", "c1", ["b"])
    assert ledger.last_backend_delete("chroma") > first


def test_an_erase_schedule_that_cannot_run_is_refused_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .env of the working directory
    for name in ("MEMWARDEN_BACKEND", "MEMWARDEN_ERASE_DATA_PATH", "MEMWARDEN_ERASE_INTERVAL_S"):
        monkeypatch.delenv(name, raising=False)
    chroma_dir = tmp_path / "chroma"
    chroma_dir.mkdir()
    with pytest.raises(ConfigError, match="MEMWARDEN_ERASE_INTERVAL_S needs MEMWARDEN_ERASE_DATA_PATH"):
        load_settings(erase_interval_s=60)
    with pytest.raises(ConfigError, match="not a Chroma persist directory"):
        load_settings(erase_interval_s=60, erase_data_path=chroma_dir)
    with pytest.raises(ConfigError, match="Mem0 offers no purge"):
        load_settings(backend="mem0", erase_interval_s=60, erase_data_path=chroma_dir)
    (chroma_dir / "chroma.sqlite3").write_bytes(b"")
    assert load_settings(erase_interval_s=60, erase_data_path=chroma_dir).erase_interval_s == 60
    assert load_settings(backend="mem0").erase_interval_s == 0  # off by default


def test_the_report_never_shows_the_texts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMWARDEN_LEDGER_PATH", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("MEMWARDEN_BACKEND", "chroma")
    data = tmp_path / "data"
    data.mkdir()
    (data / "chroma.sqlite3").write_bytes(b"head " + TEXT.encode() + b" tail")
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{TEXT}\n\nsecond text never stored\n", encoding="utf-8")
    for fmt in ("text", "json"):
        r = CliRunner().invoke(app, ["erase", "--verify", "--no-purge", "--data-path", str(data), "--text-file", str(texts),
                                     "--format", fmt])
        assert r.exit_code == 1, r.output
        assert TEXT not in r.output and "second text" not in r.output and "passport" not in r.output
    doc = json.loads(r.output)
    assert [t["remains"] for t in doc["verify"]["texts"]] == [True, False]
    assert doc["verify"]["texts"][0]["found"][0]["offsets"] == [5]
    assert not any(p.name != "ledger.db" and TEXT.encode() in p.read_bytes()
                   for p in tmp_path.rglob("*") if p.is_file() and p.parent != data and p != texts)


def test_a_directory_that_cannot_be_listed_makes_the_scan_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_walk = scan_mod.os.walk

    def walk(top: Any, onerror: Any = None, followlinks: bool = False) -> Any:
        onerror(PermissionError(13, "Permission denied", str(tmp_path / "locked")))  # as os.walk reports it
        return real_walk(top, onerror=onerror, followlinks=followlinks)

    monkeypatch.setattr(scan_mod.os, "walk", walk)
    result = scan([tmp_path], [TEXT])
    assert result.unreadable == [f"{tmp_path / 'locked'}: Permission denied"] and result.found == [[]]


def test_erase_refuses_what_it_cannot_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clear refusals (exit 2), nothing run: verify without texts (memwarden keeps digests, not text), Chroma's
    purge without its data directory, a directory that is not Chroma's, a `chroma` command that is not there."""
    from sidecar.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMWARDEN_LEDGER_PATH", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("MEMWARDEN_BACKEND", "chroma")
    monkeypatch.delenv("MEMWARDEN_ERASE_DATA_PATH", raising=False)
    data = tmp_path / "data"
    data.mkdir()
    (data / "chroma.sqlite3").write_bytes(b"")
    (tmp_path / "empty").mkdir()

    def refused(*args: str) -> str:
        r = CliRunner().invoke(app, ["erase", *args])
        assert r.exit_code == 2, r.output
        return r.output

    assert "never the text" in refused("--verify", "--data-path", str(data))
    assert "--data-path" in refused()
    assert "not a Chroma persist directory" in refused("--data-path", str(tmp_path / "empty"))
    assert "is not found" in refused("--data-path", str(data), "--chroma-cli", str(tmp_path / "no-chroma"))
    assert "not a directory" in refused("--verify", "--text", "x", "--no-purge", "--data-path", str(tmp_path / "nowhere"))
    assert not (data / "chroma.sqlite3").read_bytes()  # nothing ran on it
