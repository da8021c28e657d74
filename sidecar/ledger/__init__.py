"""The ledger: API keys, agents, collection ownership, row governance metadata and tombstones.

`Ledger` is the protocol the stages use; `SQLiteLedger` is the embedded default and
`sidecar.ledger.postgres.PostgresLedger` the shared one for several replicas.
"""

from typing import TYPE_CHECKING, Any

import sqlite3

from sidecar.errors import LedgerOpenError
from sidecar.ledger.base import (CollectionIntent, CollectionRecord, KeyRecord, Ledger, StaleFact, new_key_secret,
                                 now_us, redact_url)
from sidecar.ledger.sqlite import SQLiteLedger

if TYPE_CHECKING:
    from sidecar.config import Settings

__all__ = ["CollectionIntent", "CollectionRecord", "KeyRecord", "Ledger", "LedgerOpenError", "SQLiteLedger", "StaleFact",
           "new_key_secret", "ledger_from_settings", "now_us", "open_ledger", "redact_url"]


def open_ledger(path: str, **options: Any) -> Ledger:
    """Open the ledger at `path`: a ``postgresql://`` / ``postgres://`` URL opens a `PostgresLedger`
    (`options`: schema, min_size, max_size, timeout_s, migrate_on_open, direct), anything else an SQLite file
    (created and migrated). Raises `LedgerOpenError`, one line naming the ledger (a URL without its
    password) and what to check, when it cannot be opened (`SchemaOutOfDate` is one)."""
    if path.startswith(("postgresql://", "postgres://")):
        from sidecar.ledger.postgres import PostgresLedger

        try:
            return PostgresLedger(path, **options)
        except LedgerOpenError as exc:  # not reachable, or (SchemaOutOfDate) not migrated
            how = ":" if type(exc) is not LedgerOpenError else " unavailable:"
            raise type(exc)(f"ledger {redact_url(path)}{how} {exc}") from None
    try:
        return SQLiteLedger(path)
    except (OSError, sqlite3.Error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LedgerOpenError(f"ledger {path}: {reason}; check that its directory exists and is writable by this "
                                "user and that the file is a memwarden ledger (MEMWARDEN_LEDGER_PATH)") from None


def ledger_from_settings(settings: "Settings") -> Ledger:
    """The ledger the settings name: `ledger_url` (PostgreSQL) when set, else the SQLite `ledger_path`."""
    if settings.ledger_url:
        return open_ledger(settings.ledger_url, schema=settings.ledger_schema, min_size=settings.ledger_pool_min,
                           max_size=settings.ledger_pool_max, timeout_s=settings.ledger_timeout_s,
                           migrate_on_open=settings.ledger_migrate_on_start,
                           direct=settings.ledger_pg_direct == "on")
    return open_ledger(str(settings.ledger_path))
