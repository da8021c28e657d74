"""`PostgresLedger.read_rows` before h25p (`git show 8912bda:sidecar/ledger/postgres.py`): the statement of
`_read_rows_query` executed on the connection's reused binary tuple cursor (psycopg's query conversion, dumpers
and prepared-statement manager). Kept as the reference `tests/unit/test_ledger_pg_direct.py` compares the direct
read (`sidecar.ledger.pg_direct`, libpq's prepared statements through ``pgconn``) and the public path of
``MEMWARDEN_LEDGER_PG_DIRECT=off`` with."""

from __future__ import annotations

from typing import Any

from psycopg.rows import tuple_row

from sidecar.governance import Row
from sidecar.ledger.postgres import PostgresLedger, _done_sync, _failed_sync, _read_rows_query


def reference_read_rows(ledger: PostgresLedger, backend: str, collection_id: str, row_ids: list[str],
                        key_id: str | None = None) -> tuple[dict[str, Row], dict[str, dict[str, Any]], bool]:
    ids = list(dict.fromkeys(row_ids))
    pool = ledger._pool  # noqa: SLF001
    conn = pool.getconn()
    try:
        cur = conn.rows_cursor
        if cur is None:
            cur = conn.rows_cursor = conn.cursor(row_factory=tuple_row, binary=True)
        query, ids_value = _read_rows_query(ids)
        result = cur.execute(query, {"key": key_id, "backend": backend, "collection": collection_id,
                                     "ids": ids_value}).fetchall()
        _done_sync(conn)
    except BaseException:
        _failed_sync(conn)
        raise
    finally:
        pool.putconn(conn)
    return ledger._read_rows_result(result, key_id)  # noqa: SLF001
