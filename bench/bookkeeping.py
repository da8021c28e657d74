"""Micro-benchmarks of the sidecar's per-request bookkeeping, old implementation against new in one run (a
script that prints figures, not a test):

    nice -n 10 .venv/bin/python bench/bookkeeping.py [--n 20000]

- ``get_rows``: `SQLiteLedger.get_rows` of 1 and 10 ids on a SQLite file (rows as `bench/overhead.py` seeds
  them: no readers, labels or extra) against the former construction (``sqlite3.Row`` read by name,
  `_row_from_db`, JSON parsed for every column).

Prints microseconds per call (best of 5 repeats of `--n` calls) per case, old and new.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import timeit
from pathlib import Path
from typing import Callable

from sidecar.governance import Row
from sidecar.ledger.sqlite import _ROW_COLUMNS, SQLiteLedger, _chunks, _row_from_db


def best_us(fn: Callable[[], object], n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def old_get_rows(ledger: SQLiteLedger, backend: str, collection_id: str, row_ids: list[str]) -> dict[str, Row]:
    """`SQLiteLedger.get_rows` before issue 17."""
    out: dict[str, Row] = {}
    with ledger._lock:
        for chunk in _chunks(list(dict.fromkeys(row_ids))):
            q = f"SELECT {_ROW_COLUMNS} FROM rows WHERE backend = ? AND collection_id = ? AND row_id IN ({','.join('?' * len(chunk))})"
            for r in ledger._db.execute(q, (backend, collection_id, *chunk)):
                out[r["row_id"]] = _row_from_db(r)
    return out


def bench_get_rows(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = SQLiteLedger(Path(tmp) / "l.db")
        rows = [Row("chroma", "c", f"r{i}", "t", "f", "t/f/a", "fleet", "t/f/a", i, request_id="rq") for i in range(100)]
        ledger.reserve_rows(rows)
        ledger.activate_rows("chroma", "c", [r.row_id for r in rows])
        assert isinstance(ledger._db.row_factory, type) and ledger._db.row_factory is sqlite3.Row
        for k in (1, 10):
            ids = [f"r{i * 7 % 100}" for i in range(k)]
            assert old_get_rows(ledger, "chroma", "c", ids) == ledger.get_rows("chroma", "c", ids)
            old = best_us(lambda: old_get_rows(ledger, "chroma", "c", ids), n // k)
            new = best_us(lambda: ledger.get_rows("chroma", "c", ids), n // k)
            print(f"get_rows {k:>2} ids   old {old:8.2f} us   new {new:8.2f} us   {100 * (new - old) / old:+.0f} %")
        ledger.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    bench_get_rows(args.n)


if __name__ == "__main__":
    main()
