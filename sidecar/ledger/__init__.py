"""The ledger: API keys, agents, collection ownership, row governance metadata and tombstones.

`Ledger` is the protocol the stages use; `SQLiteLedger` is the embedded default and
`sidecar.ledger.postgres.PostgresLedger` the shared one for several replicas.
"""

from typing import TYPE_CHECKING, Any

from sidecar.ledger.base import CollectionIntent, CollectionRecord, KeyRecord, Ledger, StaleFact, new_key_secret, now_us
from sidecar.ledger.sqlite import SQLiteLedger

if TYPE_CHECKING:
    from sidecar.config import Settings

__all__ = ["CollectionIntent", "CollectionRecord", "KeyRecord", "Ledger", "SQLiteLedger", "StaleFact", "new_key_secret", "ledger_from_settings",
           "now_us", "open_ledger"]


def open_ledger(path: str, **options: Any) -> Ledger:
    """Open the ledger at `path`: a ``postgresql://`` / ``postgres://`` URL opens a `PostgresLedger`
    (`options`: schema, min_size, max_size, timeout_s, migrate_on_open), anything else an SQLite file
    (created and migrated)."""
    if path.startswith(("postgresql://", "postgres://")):
        from sidecar.ledger.postgres import PostgresLedger

        return PostgresLedger(path, **options)
    return SQLiteLedger(path)


def ledger_from_settings(settings: "Settings") -> Ledger:
    """The ledger the settings name: `ledger_url` (PostgreSQL) when set, else the SQLite `ledger_path`."""
    if settings.ledger_url:
        return open_ledger(settings.ledger_url, schema=settings.ledger_schema, min_size=settings.ledger_pool_min,
                           max_size=settings.ledger_pool_max, timeout_s=settings.ledger_timeout_s,
                           migrate_on_open=settings.ledger_migrate_on_start)
    return open_ledger(str(settings.ledger_path))
