"""What erasure means on Mem0 (mem0ai 2.2.1, the `Memory` class behind the self-hosted REST server).

Mem0 writes every ADD, UPDATE and DELETE of a memory, with its text (a DELETE keeps the deleted text as
``old_memory``), to its history database (``history_db_path``; the REST server's ``HISTORY_DB_PATH``). Neither
the library nor the REST server offers a way to erase one memory's history: ``Memory.history`` only reads it,
``Memory.delete``/``delete_all`` append a DELETE event, and the only removal is ``Memory.reset`` (``POST
/reset``), which drops every memory and all history (mem0ai/mem0#6512 asks for a per-user purge; open). So
there is nothing memwarden can run; `purge` says so. What an operator can do is keep history off the disk
(``history_db_path: ":memory:"`` — the REST server's ``HISTORY_DB_PATH=:memory:``), measured in README
"Erasure". With ``infer=true`` Mem0 also keeps the last 10 messages of each session in that database.

The vector store is Mem0's configured one (its own files or server): its deleted point is removed by Mem0's
delete; how its storage keeps freed bytes is that store's (give its data directory to the scan).
"""

from __future__ import annotations

from pathlib import Path

from sidecar.erase.base import Purge

NAME = "mem0"
HISTORY = "history.db"

NO_PURGE = ("nothing to run: Mem0 offers no erasure of a deleted memory's history (mem0ai 2.2.1: no library "
            "method, no REST route; only POST /reset, which drops everything) — run Mem0 with its history off the "
            "disk (HISTORY_DB_PATH=:memory:) instead; the deleted point of the vector store is removed by Mem0's delete")

CANNOT_SEE = (
    "Mem0's vector store outside the directory scanned (a Qdrant or pgvector server keeps its own files: "
    "WAL, segments, TOAST) and the vector of a deleted memory",
)


def purge() -> Purge:
    """Mem0 has nothing to run (module docstring): a `Purge` that did not run and says why."""
    return Purge(NAME, False, what=NO_PURGE)


def hint(rel_path: str) -> str | None:
    """What a hit in this file means, for the report (never part of its correctness)."""
    name = Path(rel_path).name
    if name == HISTORY:
        return ("Mem0's history database: every ADD/UPDATE/DELETE event keeps the text and Mem0 offers no way to "
                "erase one memory's history (only POST /reset, everything); keep it off the disk with "
                "HISTORY_DB_PATH=:memory:")
    if name.startswith(HISTORY) and name.endswith(("-wal", "-journal")):
        return "SQLite's journal of Mem0's history database"
    if name == "storage.sqlite":
        return "Qdrant local mode's point store (a deleted point's bytes until SQLite reuses or VACUUMs its page)"
    return None
