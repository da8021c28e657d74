"""What erasure means on Chroma (chromadb 1.x, the local persistent server `chroma run --path DIR`).

Measured on chromadb 1.5.9 (README "Erasure"; `tests/integration/test_erase.py`): after a delete, the row's
text is still in ``chroma.sqlite3`` — in Chroma's log (the record that added it) and in the pages the deleted
records were freed from. Chroma's own means to remove it:

- its automatic log purge: after every write to a collection Chroma deletes that collection's log records
  below the position up to which its vector index was last persisted; the index persists every
  ``hnsw.sync_threshold`` records applied to it (collection configuration, default 1000, at least 2);
- ``chroma vacuum --path DIR`` (Chroma's CLI; documented at docs.trychroma.com "CLI: Vacuum"): purges the log
  of the collections of ``default_tenant``/``default_database`` the same way, then VACUUMs the SQLite file
  (rewrites it without free pages) and turns the automatic purge on. It blocks Chroma's reads and writes while
  it runs (Chroma recommends stopping the server; running it is "not strictly required").

`purge` runs ``chroma vacuum``; nothing here reads Chroma's files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sidecar.erase.base import EraseError, Purge

NAME = "chroma"
DATABASE = "chroma.sqlite3"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

CANNOT_SEE = (
    "Chroma's vector index (<segment uuid>/data_level0.bin): a deleted row's vector stays there, marked "
    "deleted, as long as the collection exists — numbers, which a text scan cannot see",
    "Chroma's full-text index keeps trigrams of a text, not the text: a byte scan cannot tell whether "
    "a deleted row's trigrams remain (VACUUM rewrites the index's pages)",
)


def cli(explicit: str | None = None) -> str:
    """The `chroma` command: `explicit`, else the one beside this interpreter, else the first on PATH.
    Raises `EraseError` when there is none (``pip install chromadb`` provides it)."""
    if explicit:
        found = shutil.which(explicit)
        if not found:
            raise EraseError(f"the chroma command {explicit!r} is not found (or not executable)")
        return found
    beside = Path(sys.executable).with_name("chroma")
    if beside.exists():
        return str(beside)
    found = shutil.which("chroma")
    if not found:
        raise EraseError("the `chroma` command is not installed here (pip install chromadb): it runs Chroma's vacuum")
    return found


def check_data_path(data_path: Path) -> None:
    """Raises `EraseError` unless `data_path` is a Chroma persist directory (holds ``chroma.sqlite3``)."""
    if not (data_path / DATABASE).is_file():
        raise EraseError(f"{data_path} is not a Chroma persist directory (no {DATABASE}): give the directory of `chroma run --path`")


def purge(data_path: Path, timeout_s: float, command: str | None = None) -> Purge:
    """Run ``chroma vacuum --path data_path --force --timeout N`` and wait for it (at most `timeout_s` plus
    30 s). Returns what ran and its output's last lines. Raises `EraseError` when the directory is not
    Chroma's, the command is missing, fails (its last output lines in the message) or times out."""
    check_data_path(data_path)
    argv = [cli(command), "vacuum", "--path", str(data_path), "--force", "--timeout", str(max(1, int(timeout_s)))]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s + 30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise EraseError(f"`chroma vacuum` did not finish within {timeout_s + 30:.0f} s") from exc
    except OSError as exc:
        raise EraseError(f"`{argv[0]}` could not be run: {exc.strerror or exc}") from exc
    output = [ln.strip() for ln in _ANSI.sub("", (done.stdout + done.stderr).decode("utf-8", "replace")).splitlines() if ln.strip()]
    if done.returncode != 0:
        raise EraseError(f"`chroma vacuum` exited with {done.returncode}: {' | '.join(output[-3:])}")
    return Purge(NAME, True, " ".join(argv[:2] + ["--path", str(data_path)]), round(time.monotonic() - started, 3),
                 output[-2:], "Chroma's log purge (collections of default_tenant/default_database) and SQLite VACUUM")


def hint(rel_path: str) -> str | None:
    """What a hit in this file means, for the report (never part of its correctness)."""
    name = Path(rel_path).name
    if name == DATABASE:
        return ("Chroma's database: a deleted row's text stays in Chroma's log until Chroma purges the log past it "
                "(after a write to its collection, up to where the collection's vector index was last persisted: "
                "every hnsw sync_threshold records, default 1000), and in freed pages until VACUUM")
    if name.endswith(("-wal", "-journal")):
        return "SQLite's journal of chroma.sqlite3 (rewritten by later transactions)"
    if name.endswith(".pickle") or name.endswith(".bin"):
        return "Chroma's vector index files"
    return None
