"""The one place memwarden depends on psycopg's private internals: `PostgresLedger.read_rows` without psycopg's
cursor (h25p), switched by ``MEMWARDEN_LEDGER_PG_DIRECT`` (``on`` by default; ``off``: the public path only,
``Cursor.execute(..., prepare=True)`` and ``fetchall``, the same rows and errors).

What it does: the read statements of `sidecar.ledger.postgres` for exact ``str`` arguments without NUL (one id: a
``row_id = $4`` statement; any other number: ``row_id = ANY($4)`` with the ids as a binary ``text[]``) are
prepared once per connection under names of their own (``mw_read_one_row``, ``mw_read_rows``) and executed with
libpq's ``PQsendQueryPrepared`` on the connection's ``pgconn``; the rows are loaded by a psycopg `Transformer` of
the connection (the cursor's own loaders, binary results, plain tuples). What the cursor adds per call and this
does not need: the query's conversion and its parameters' dumpers (here: UTF-8 bytes in text format, the ids as a
binary ``text[]``), psycopg's prepared-statement bookkeeping, the cursor's state. Measured: a PostgreSQL get
928.1k → 842.6k instructions per request (−9.2 %), ``read_rows`` of one id alone 195.9k → 146.2k
(docs/performance.md, round h25 and "Private internals: what is kept and why").

Private or undocumented psycopg APIs used, and why each:

- ``psycopg.generators.execute`` (an internal module): the generator that sends a query and collects its results
  (notices, notifications, ``COPY`` refused) as the cursor does; driven by ``Connection.wait``.
- ``Connection.wait`` (undocumented): runs a generator on the connection's socket, as psycopg's own calls do, so an
  interrupt cancels the query.
- ``Connection.lock`` (undocumented attribute): the lock psycopg takes around every statement of a connection.
- ``psycopg.adapt.Transformer`` used directly (an internal of the adaptation layer; documented only as the
  context object): ``set_pgresult`` and ``load_rows`` turn the binary result into tuples with the connection's
  loaders, the same values as the cursor's.
- ``psycopg.errors.error_from_result`` (undocumented): the exception the cursor raises for a failed result.
- Prepared statements under names of our own, beside psycopg's prepared-statement manager: psycopg sends
  ``DEALLOCATE ALL`` after a rollback when it has prepared statements of its own, and a session can lose prepared
  statements in other ways, so a statement found missing (SQLSTATE 26000) is prepared again and executed once
  more (an autocommit read: nothing to roll back).

The libpq wrapper (``pgconn.send_prepare``, ``send_query_prepared``, ``psycopg.pq`` enums) is psycopg's public
low-level API. When the installed psycopg lacks any of the above (``ImportError`` at import, a missing attribute
found by `DirectReads.usable` before the first statement is sent, or an ``AttributeError`` from the first direct
read), the direct path is switched off for the process, logged once (``psycopg_direct_unavailable``), and reads take
the public path. Same rows, same errors as the cursor: ``tests/unit/test_ledger_pg_direct.py`` (against
``tests/unit/postgres_direct_reference.py``, with the setting on and off).
"""

from __future__ import annotations

import struct
from typing import Any

import psycopg
import structlog

try:  # private psycopg internals (above): missing in a psycopg that reorganised them
    from psycopg.adapt import Transformer
    from psycopg.errors import error_from_result
    from psycopg.generators import execute as _pq_execute
    _IMPORT_ERROR: str | None = None
except ImportError as _exc:  # pragma: no cover - depends on the installed psycopg
    Transformer = error_from_result = _pq_execute = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"{type(_exc).__name__}: {_exc}"

_unavailable: str | None = _IMPORT_ERROR  # why the direct path is off for this process (None: not known to be)
_logged = False


class Unavailable(Exception):
    """The installed psycopg lacks an internal the direct read uses; `str` says which. Raised before anything was
    sent on the connection, or from the first direct read of the process."""


def unavailable() -> str | None:
    """Why the direct path is off for this process (the missing internal), or None."""
    return _unavailable


def disable(reason: str) -> None:
    """Switch the direct path off for this process; logged once (warning ``psycopg_direct_unavailable``)."""
    global _unavailable, _logged
    _unavailable = _unavailable or reason
    if not _logged:
        _logged = True
        structlog.get_logger("memwarden.ledger").warning(
            "psycopg_direct_unavailable", reason=_unavailable, psycopg=getattr(psycopg, "__version__", "?"),
            path="public cursor")


def _positional(sql: str) -> bytes:
    """`sql` with the named placeholders of `sidecar.ledger.postgres`'s read statements as ``$1``..``$4``."""
    out = (sql.replace("%(key)s", "$1").replace("%(backend)s", "$2").replace("%(collection)s", "$3")
           .replace("%(ids)s", "$4").replace("%(ids)b", "$4"))
    assert "%(" not in out and "$4" in out
    return out.encode()


_TEXT_OID, _TEXT_ARRAY_OID = 25, 1009
_FORMATS_TEXT = [psycopg.pq.Format.TEXT] * 4
_FORMATS_IDS_BINARY = [psycopg.pq.Format.TEXT] * 3 + [psycopg.pq.Format.BINARY]
_ARRAY_HEAD = struct.Struct("!iiiii")  # ndim 1, no NULLs, element oid, length, lower bound 1
_EMPTY_TEXT_ARRAY = struct.pack("!iii", 0, 0, _TEXT_OID)
_ITEM_LENGTH = struct.Struct("!i").pack
_BINARY_RESULT = psycopg.pq.Format.BINARY
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
_COMMAND_OK = psycopg.pq.ExecStatus.COMMAND_OK
_FATAL_ERROR = psycopg.pq.ExecStatus.FATAL_ERROR
_UNDEFINED_STATEMENT = b"26000"
_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE

Statement = tuple[bytes, bytes, list[int], list[Any]]  # (name, SQL with $n, parameter oids, parameter formats)

# What `DirectReads.rows` uses on a connection, its ``pgconn`` and a `Transformer`, checked before the first use.
_CONN_ATTRS = ("lock", "wait", "pgconn", "info")
_PGCONN_ATTRS = ("send_prepare", "send_query_prepared")
_TRANSFORMER_ATTRS = ("set_pgresult", "load_rows")


def text_array(items: list[bytes]) -> bytes:
    """The binary form of a one-dimensional ``text[]`` without NULLs (what psycopg's binary list dumper sends)."""
    if not items:
        return _EMPTY_TEXT_ARRAY
    return _ARRAY_HEAD.pack(1, 0, _TEXT_OID, len(items), 1) + b"".join(_ITEM_LENGTH(len(b)) + b for b in items)


class DirectReads:
    """The direct read of two statements of `sidecar.ledger.postgres`: `one_sql` (parameters ``%(key)s``,
    ``%(backend)s``, ``%(collection)s``, ``%(ids)s`` = one id) and `many_sql` (the same, ``%(ids)b`` = a binary
    ``text[]``). State lives on the connection: ``direct_prepared`` (a set of the statement names prepared in its
    session, or None) and ``direct_tx`` (its `Transformer`, or None), both attributes its class declares."""

    def __init__(self, one_sql: str, many_sql: str) -> None:
        self.one: Statement = (b"mw_read_one_row", _positional(one_sql), [_TEXT_OID] * 4, _FORMATS_TEXT)
        self.many: Statement = (b"mw_read_rows", _positional(many_sql), [_TEXT_OID] * 3 + [_TEXT_ARRAY_OID],
                                _FORMATS_IDS_BINARY)
        self._checked = False  # `usable` passed once (attributes are the class's and psycopg's: once is enough)
        self._served = False  # a direct read completed: an AttributeError after this is a bug, not a missing internal

    def params(self, key_id: Any, backend: Any, collection_id: Any, ids: list[Any]
               ) -> tuple[Statement, list[bytes | None]] | None:
        """(statement, parameters) of the direct read, or None when an argument is not an exact ``str``
        (``key_id`` may be None), holds NUL or is not UTF-8-encodable: those take the cursor."""
        try:
            if type(backend) is not str or type(collection_id) is not str or "\x00" in backend or "\x00" in collection_id:
                return None
            if key_id is None:
                key = None
            elif type(key_id) is str and "\x00" not in key_id:
                key = key_id.encode()
            else:
                return None
            encoded = []
            for i in ids:
                if type(i) is not str or "\x00" in i:
                    return None
                encoded.append(i.encode())
            if len(encoded) == 1:
                return self.one, [key, backend.encode(), collection_id.encode(), encoded[0]]
            return self.many, [key, backend.encode(), collection_id.encode(), text_array(encoded)]
        except UnicodeEncodeError:
            return None

    def usable(self, conn: Any) -> None:
        """Raise `Unavailable` (and switch the direct path off, logged once) when psycopg or `conn` lacks an
        internal `rows` uses; nothing is sent."""
        if self._checked:
            return
        missing = _unavailable
        if missing is None:
            for owner, attrs in ((conn, _CONN_ATTRS), (getattr(conn, "pgconn", None), _PGCONN_ATTRS),
                                 (Transformer, _TRANSFORMER_ATTRS)):
                gone = [a for a in attrs if not hasattr(owner, a)]
                if gone:
                    missing = f"{type(owner).__name__} has no {', '.join(gone)}"
                    break
        if missing is not None:
            disable(missing)
            raise Unavailable(missing)
        self._checked = True

    def rows(self, conn: Any, statement: Statement, params: list[bytes | None]) -> list[tuple[Any, ...]]:
        """Execute `statement` (prepared on `conn` first if it is not yet) with `params`; its rows as tuples.
        Raises psycopg errors as the cursor does, `Unavailable` as `usable` (or for an ``AttributeError`` of the
        process's first direct read: the connection may then be mid-statement; the pool discards it)."""
        self.usable(conn)
        if self._served:
            return _rows(conn, statement, params)
        try:
            result = _rows(conn, statement, params)
        except AttributeError as exc:
            reason = f"AttributeError: {exc}"
            disable(reason)
            raise Unavailable(reason) from exc
        self._served = True
        return result


def _rows(conn: Any, statement: Statement, params: list[bytes | None]) -> list[tuple[Any, ...]]:
    name, sql, types, formats = statement
    prepared = conn.direct_prepared
    if prepared is None:
        prepared = conn.direct_prepared = set()
    with conn.lock:
        pgconn = conn.pgconn
        for attempt in (0, 1):
            if name not in prepared:
                pgconn.send_prepare(name, sql, param_types=types)
                (res,) = conn.wait(_pq_execute(pgconn))
                if res.status != _COMMAND_OK:
                    raise error_from_result(res, encoding=conn.info.encoding)
                prepared.add(name)
            pgconn.send_query_prepared(name, params, param_formats=formats, result_format=_BINARY_RESULT)
            results = conn.wait(_pq_execute(pgconn))
            if not results:
                raise psycopg.errors.InternalError("got no result from the query")  # as the cursor
            res = results[-1]
            if len(results) == 1 and res.status == _TUPLES_OK:
                break
            if res.status == _FATAL_ERROR and res.error_field(_SQLSTATE) == _UNDEFINED_STATEMENT and not attempt:
                prepared.discard(name)  # gone from the session (DEALLOCATE ALL): prepare it again, once
                continue
            if res.status == _FATAL_ERROR:
                raise error_from_result(res, encoding=conn.info.encoding)
            raise psycopg.errors.InternalError(f"unexpected result {psycopg.pq.ExecStatus(res.status).name} of {name!r}")
        tx = conn.direct_tx
        if tx is None:
            tx = conn.direct_tx = Transformer(conn)
        tx.set_pgresult(res)
        rows: list[tuple[Any, ...]] = tx.load_rows(0, res.ntuples, tuple)
        tx.set_pgresult(None)
    return rows
