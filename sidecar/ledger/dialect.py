"""What differs between the ledger's two SQL dialects, and nothing else: the placeholder, the type of a time
column, byte-order collation, row locks, the "readers hold this name" test, and how a list of ids or of
(collection, id) pairs is sent (an ``IN`` list of placeholders in chunks on SQLite, one array parameter on
PostgreSQL). `sidecar.ledger.sql.SQLLedger` writes every shared statement once over a `Dialect`.

Sources: SQLite "The JSON1 extension" (``json_each``, ``json_extract``); PostgreSQL 15 manual, "Array
Functions" (``unnest`` of several arrays), "Row and Array Comparisons" (``= ANY``).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

# SQLite's default limit of host parameters is 32766 (3.32+); an ``IN`` list is sent in chunks of this many.
CHUNK = 500


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[list[Any]]:
    """`items` in consecutive lists of at most `size` (none when `items` is empty)."""
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


class Dialect:
    """One SQL dialect of the ledger (`SQLITE`, `POSTGRES`). Attributes are SQL text; methods return
    ``(sql fragment, parameters)`` to be composed into a statement (never a placeholder substituted into text)."""

    name = ""
    ph = "?"  # the driver's placeholder (DB-API paramstyle: qmark for sqlite3, format for psycopg)
    time_type = "INTEGER"  # the type of a UTC µs column in the migrations
    collate_bytes = ""  # appended to an ORDER BY column for byte order (SQLite's default BINARY collation)
    for_update = ""  # appended to a SELECT whose rows the transaction is about to change
    # "readers (a JSON array in a TEXT column) holds the string {ph}" (`sidecar.core.visibility.sql_branches`)
    reads_json = ""
    readers_sorted = ""  # a row's readers, sorted and comma-joined (migration 4's fact partitions)

    def marks(self, n: int) -> str:
        """``n`` placeholders joined by commas."""
        return ",".join([self.ph] * n)

    def in_ids(self, column: str, ids: Sequence[Any]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        """``column`` is one of `ids`: one or more (condition, parameters), each to run as its own statement
        (their results are the union); none when `ids` is empty."""
        raise NotImplementedError

    def lookup(self, table: str, alias: str, on: str, index: str | None = None, outer: bool = True) -> str:
        """A join (``LEFT JOIN`` when `outer`) of `table` as `alias` on condition `on` (over `alias`'s columns and
        the preceding FROM items), each row of the left side looked up through an index of `table` (`index` when
        named, else the one `on` matches), whatever the planner's statistics (the graph walks: a step reads the edges of the nodes it reached, never every edge of
        the backend)."""
        raise NotImplementedError

    def pairs(self, pairs: Sequence[tuple[str, str]]) -> tuple[str, tuple[Any, ...]]:
        """A table expression (to follow ``FROM``) of the (collection, id) `pairs` in order, as columns
        ``collection_id`` and ``row_id``, bound to one statement whatever their number."""
        raise NotImplementedError


class SQLiteDialect(Dialect):
    name = "sqlite"
    ph = "?"
    time_type = "INTEGER"
    collate_bytes = ""
    for_update = ""
    reads_json = "EXISTS (SELECT 1 FROM json_each(rows.readers) WHERE value = ?)"
    readers_sorted = "(SELECT group_concat(value, ',') FROM (SELECT value FROM json_each(rows.readers) ORDER BY value))"

    def lookup(self, table: str, alias: str, on: str, index: str | None = None, outer: bool = True) -> str:
        """``INDEXED BY``: without statistics SQLite's planner reads a recursive step's edges through the primary
        key's ``backend`` prefix (every edge of the backend at each step; measured: a 601-row closure 3.6 s instead
        of 24 ms)."""
        hint = f" INDEXED BY {index}" if index else ""
        return f"{'LEFT JOIN' if outer else 'JOIN'} {table} AS {alias}{hint} ON {on}"

    def in_ids(self, column: str, ids: Sequence[Any]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        for chunk in chunks(ids):
            yield f"{column} IN ({self.marks(len(chunk))})", tuple(chunk)

    def pairs(self, pairs: Sequence[tuple[str, str]]) -> tuple[str, tuple[Any, ...]]:
        """One JSON array parameter (``json_each``); where JSON would not carry the pairs exactly (a value that is
        not a ``str``, holds NUL — ``json_each`` ends a string there — or is not UTF-8: a lone surrogate) a
        ``VALUES`` list of bound parameters instead, whose binding raises as any other statement's would (and which
        holds at most SQLite's limit of parameters, 16,383 pairs by default; more raise ``OperationalError``)."""
        try:
            if all(type(c) is str and type(r) is str and "\x00" not in c and "\x00" not in r for c, r in pairs):
                text = json.dumps([list(p) for p in pairs], ensure_ascii=False)
                text.encode("utf-8")
                return ("(SELECT json_extract(value, '$[0]') AS collection_id, json_extract(value, '$[1]') AS row_id "
                        "FROM json_each(?)) AS pairs", (text,))
        except UnicodeEncodeError:
            pass
        values = ", ".join(["(?, ?)"] * len(pairs))
        return (f"(SELECT column1 AS collection_id, column2 AS row_id FROM (VALUES {values})) AS pairs",
                tuple(x for p in pairs for x in p))


class PostgresDialect(Dialect):
    name = "postgresql"
    ph = "%s"
    time_type = "BIGINT"
    collate_bytes = ' COLLATE "C"'
    for_update = " FOR UPDATE"
    reads_json = "jsonb_exists(readers::jsonb, %s)"
    readers_sorted = ("(SELECT string_agg(v, ',' ORDER BY v COLLATE \"C\") "
                      "FROM json_array_elements_text(rows.readers::json) AS v)")

    def lookup(self, table: str, alias: str, on: str, index: str | None = None, outer: bool = True) -> str:
        """``LATERAL`` over a subquery the planner may not pull up (``OFFSET 0``): a nested loop of index scans,
        where it would otherwise hash every row of the backend's `table` (it cannot estimate a recursive CTE's rows;
        measured on a 2,700-edge ledger without statistics: a lineage of 4 nodes 11.8 ms by hash joins)."""
        return (f"{'LEFT JOIN' if outer else 'JOIN'} LATERAL (SELECT * FROM {table} AS {alias} WHERE {on} OFFSET 0) "
                f"AS {alias} ON true")

    def in_ids(self, column: str, ids: Sequence[Any]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        if ids:
            yield f"{column} = ANY(%s)", (list(ids),)

    def pairs(self, pairs: Sequence[tuple[str, str]]) -> tuple[str, tuple[Any, ...]]:
        return ("unnest(%s::text[], %s::text[]) AS pairs (collection_id, row_id)",
                ([c for c, _ in pairs], [r for _, r in pairs]))


SQLITE = SQLiteDialect()
POSTGRES = PostgresDialect()
