"""Micro-benchmarks of the sidecar's per-request bookkeeping, old implementation against new in one run (a
script that prints figures, not a test):

    nice -n 10 .venv/bin/python bench/bookkeeping.py [--n 20000]

- ``get_rows``: `SQLiteLedger.get_rows` of 1 and 10 ids on a SQLite file (rows as `bench/overhead.py` seeds
  them: no readers, labels or extra) against the former construction (``sqlite3.Row`` read by name,
  `_row_from_db`, JSON parsed for every column).
- ``cache_version``: `SQLiteLedger.cache_version` (``PRAGMA data_version`` on a cursor of its own, plain
  tuples) against the former read through the connection's ``sqlite3.Row`` factory.
- ``record``: `decisionlog.record` of a query's decision (10 rows) on the file sink through the direct
  writer against structlog's bound logger over the same processors and sink (the former path).
- ``_digest``: `CachingLedger._digest` (one-shot ``hmac.digest``) against ``hmac.new(...).digest()``.

Prints microseconds per call per case, old and new (best of 9 alternating rounds of `--n` calls).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import sqlite3
import tempfile
import timeit
from pathlib import Path
from typing import Callable

from sidecar.governance import Row
from sidecar.ledger.cache import CachingLedger
from sidecar.ledger.sqlite import SQLiteLedger
from sidecar.ledger.sql import ROW_COLUMNS as _ROW_COLUMNS, row_from_db as _row_from_db
from sidecar.ledger.dialect import chunks as _chunks


def pair_us(old: Callable[[], object], new: Callable[[], object], n: int, repeat: int = 9) -> tuple[float, float]:
    """Best microseconds per call of `old` and of `new`, `repeat` rounds of `n` calls each, alternating (so both
    see the same periods of machine load)."""
    o, w = [], []
    for _ in range(repeat):
        o.append(timeit.timeit(old, number=n))
        w.append(timeit.timeit(new, number=n))
    return min(o) / n * 1e6, min(w) / n * 1e6


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
            old, new = pair_us(lambda: old_get_rows(ledger, "chroma", "c", ids), lambda: ledger.get_rows("chroma", "c", ids),
                               n // k)
            print(f"get_rows {k:>2} ids   old {old:8.2f} us   new {new:8.2f} us   {100 * (new - old) / old:+.0f} %")
        ledger.close()


def bench_cache_version(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = SQLiteLedger(Path(tmp) / "l.db")

        def old() -> tuple[int, int]:
            with ledger._lock:
                return int(ledger._db.execute("PRAGMA data_version").fetchone()[0]), ledger._writes

        assert old() == ledger.cache_version()
        o, w = pair_us(old, ledger.cache_version, n)
        print(f"cache_version     old {o:8.2f} us   new {w:8.2f} us   {100 * (w - o) / o:+.0f} %")
        ledger.close()


def bench_digest(n: int) -> None:
    cached = CachingLedger(None, lambda: 1)
    key = "mwk_0123456789abcdef." + "s" * 43  # the shape of a real key (`new_key_secret`)

    def old() -> bytes:
        return hmac.new(cached._secret, key.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    assert old() == cached._digest(key)
    o, w = pair_us(old, lambda: cached._digest(key), n)
    print(f"_digest           old {o:8.2f} us   new {w:8.2f} us   {100 * (w - o) / o:+.0f} %")


def bench_record(n: int) -> None:
    import structlog

    from sidecar import decisionlog, logsinks
    from sidecar.exchange import Exchange
    from sidecar.governance import Principal

    with tempfile.TemporaryDirectory() as tmp:
        sink = logsinks.logger_factory("file", Path(tmp) / "d.jsonl")("memwarden.decision")
        chain = decisionlog.processors()
        bound = structlog.wrap_logger(sink, processors=chain, wrapper_class=structlog.make_filtering_bound_logger(20))
        ex = Exchange("POST", "/q", principal=Principal(kind="agent", key_id="k", tenant="t", fleet="f", agent="a"),
                      key_id="k", operation="query", action="read", decision="allow", policies={"p1", "p2"},
                      rows_allowed=10, row_ids=[f"row-{i}" for i in range(10)])

        def old() -> None:
            bound.info("decision", **decisionlog.fields(ex, 200, "ab" * 32))

        decisionlog._write = decisionlog.writer(chain, sink)
        o, w = pair_us(old, lambda: decisionlog.record(ex, 200, policy_sha256="ab" * 32), n)
        print(f"record (file)     old {o:8.2f} us   new {w:8.2f} us   {100 * (w - o) / o:+.0f} %")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    bench_get_rows(args.n)
    bench_cache_version(args.n)
    bench_digest(args.n)
    bench_record(args.n // 4)


if __name__ == "__main__":
    main()
