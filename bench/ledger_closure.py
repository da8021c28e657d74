"""Deletion closure (`Ledger.tombstone`, cascade) and lineage (`Ledger.lineage`) on a chain of 200 derivations and
a fan-out (a root, 300 children, 300 grandchildren each derived from two children), on SQLite and PostgreSQL (a
script that prints figures, not a test):

    PYTHONPATH=<tree> .venv/bin/python bench/ledger_closure.py sqlite postgres [--url postgresql://…]

Run it on two trees (old and new) to compare. Each shape is built 5 times in one ledger (the tables grow) and the
medians are printed, in ms; on SQLite also the statements one lineage and one tombstone of the chain run
(sqlite3's trace callback). PostgreSQL: a fresh schema of the database at `--url`, dropped at the end, without
planner statistics (as a new ledger is before its first ANALYZE).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from typing import Any

import psycopg

from sidecar.governance import Row
from sidecar.ledger import SQLiteLedger, open_ledger


def _row(collection: str, row_id: str, parents: tuple[tuple[str, str], ...] = ()) -> Row:
    return Row("chroma", collection, row_id, "t", "red", "t/red/a", "fleet", "t/red/a", 1, derived_from=parents,
               content_hmac="h" + row_id)


def build(ledger: Any, shape: str, tag: str) -> tuple[str, str]:
    """Write one `shape` (``chain`` or ``fanout``) with ids prefixed by `tag`; (root id, a leaf id)."""
    if shape == "chain":
        rows = [_row("c", f"{tag}r0")] + [_row("c", f"{tag}r{i}", (("c", f"{tag}r{i - 1}"),)) for i in range(1, 200)]
        root, leaf = f"{tag}r0", f"{tag}r199"
    else:
        kids = [_row("c", f"{tag}k{i}", (("c", f"{tag}root"),)) for i in range(300)]
        grand = [_row("c", f"{tag}g{i}", (("c", f"{tag}k{i}"), ("c", f"{tag}k{(i + 1) % 300}"))) for i in range(300)]
        rows = [_row("c", f"{tag}root"), *kids, *grand]
        root, leaf = f"{tag}root", f"{tag}g7"
    for r in rows:
        ledger.reserve_rows([r])
        ledger.activate_rows("chroma", "c", [r.row_id])
    return root, leaf


def run(kind: str, url: str) -> None:
    schema = "bench_closure_" + uuid.uuid4().hex[:8]
    ledger: Any = (SQLiteLedger(tempfile.mkdtemp() + "/l.db") if kind == "sqlite"
                   else open_ledger(url, schema=schema, min_size=1, max_size=1))
    try:
        for shape in ("chain", "fanout"):
            walk, close, nodes, closed = [], [], 0, 0
            for rep in range(5):
                root, leaf = build(ledger, shape, f"{shape}{rep}_")
                t0 = time.perf_counter()
                nodes = len(ledger.lineage("chroma", "c", leaf))
                walk.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                closed = len(ledger.tombstone("chroma", "c", [root], "x", "r"))
                close.append(time.perf_counter() - t0)
            print(f"{kind:8s} {shape:7s} lineage {nodes:3d} nodes {statistics.median(walk) * 1000:7.2f} ms | "
                  f"tombstone {closed:3d} rows {statistics.median(close) * 1000:7.2f} ms")
        if kind == "sqlite":
            root, leaf = build(ledger, "chain", "count_")
            seen: list[str] = []
            ledger._db.set_trace_callback(seen.append)  # noqa: SLF001
            ledger.lineage("chroma", "c", leaf)
            walked = len(seen)
            seen.clear()
            ledger.tombstone("chroma", "c", [root], "x", "r")
            ledger._db.set_trace_callback(None)  # noqa: SLF001
            print(f"sqlite   chain   statements: lineage {walked}, tombstone {len(seen)}")
    finally:
        ledger.close()
        if kind != "sqlite":
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kinds", nargs="+", choices=["sqlite", "postgres"])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    for kind in args.kinds:
        run(kind, args.url)


if __name__ == "__main__":
    main()
