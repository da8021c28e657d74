"""Instructions per `PostgresLedger.read_rows` in this process, ``MEMWARDEN_LEDGER_PG_DIRECT`` on against off (a
script, not a test; issue 35: the measured gain that keeps `sidecar.ledger.pg_direct`).

Run under callgrind with ``--dump-before=getppid``: each step runs `--n` times between two ``os.getppid()`` calls,
so callgrind writes one profile part per step; ``summary`` prints each part's instructions ÷ n. The server's work
is not counted (another process); the client's waits are (the poll on the socket):

    valgrind --tool=callgrind --dump-before='os_getppid*' --callgrind-out-file=OUT/cg \\
        .venv/bin/python bench/pg_direct_cost.py run --url postgresql://postgres@127.0.0.1:5432/postgres --n 1000
    .venv/bin/python bench/pg_direct_cost.py summary OUT --n 1000

Steps: ``empty`` (the loop alone), ``on_one`` / ``off_one`` (a read of one stored id, with a valid key: a get by id),
``on_ten`` / ``off_ten`` (ten ids). A schema of its own is created and dropped.
"""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path

from callgrind_parts import part_totals

STEPS = ("empty", "on_one", "off_one", "on_ten", "off_ten")


def run(url: str, n: int) -> None:
    import psycopg

    from sidecar.governance import Row
    from sidecar.ledger.postgres import PostgresLedger
    from sidecar.ledger.sql import N_ROW_COLUMNS, ROW_COLUMNS, row_to_db

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    on = PostgresLedger(url, schema=schema, min_size=1, max_size=1, direct=True)
    off = PostgresLedger(url, schema=schema, min_size=1, max_size=1, direct=False)
    try:
        on.create_key("agent", "t", "f", "a", 1)
        key_id = on.create_key("agent", "t", "f", "k", 1)[0].key_id
        ids = [f"r{i}" for i in range(10)]
        with on._tx() as db:  # noqa: SLF001
            for i, row_id in enumerate(ids):
                row = Row("chroma", "c", row_id, "t", "f", "t/f/a", "agent", "t/f/a", i, extra={"n": i})
                db.execute(f"INSERT INTO rows ({ROW_COLUMNS}) VALUES ({','.join(['%s'] * N_ROW_COLUMNS)})",
                           list(row_to_db(row, 7)))
        steps = {
            "empty": lambda: None,
            "on_one": lambda: on.read_rows("chroma", "c", ["r3"], key_id),
            "off_one": lambda: off.read_rows("chroma", "c", ["r3"], key_id),
            "on_ten": lambda: on.read_rows("chroma", "c", ids, key_id),
            "off_ten": lambda: off.read_rows("chroma", "c", ids, key_id),
        }
        assert on.read_rows("chroma", "c", ids, key_id) == off.read_rows("chroma", "c", ids, key_id)
        for step in steps.values():  # warm-up: statements prepared, caches filled
            for _ in range(50):
                step()
        for step in steps.values():
            os.getppid()
            for _ in range(n):
                step()
        os.getppid()
    finally:
        on.close()
        off.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]


def summary(out: Path, n: int) -> None:
    totals = part_totals(out)
    for name, total in zip(STEPS, totals[1:1 + len(STEPS)]):
        print(f"{name:8s} {total / n / 1000:8.1f}k instructions per call")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "summary"])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    if args.mode == "run":
        run(args.url, args.n)
    else:
        summary(args.out, args.n)


if __name__ == "__main__":
    main()
