"""The ledger: API keys, agents, collection ownership, row governance metadata and tombstones.

`Ledger` is the protocol the stages use; `SQLiteLedger` is the embedded default.
"""

from sidecar.ledger.base import CollectionRecord, KeyRecord, Ledger, new_key_secret, now_us
from sidecar.ledger.sqlite import SQLiteLedger

__all__ = ["CollectionRecord", "KeyRecord", "Ledger", "SQLiteLedger", "new_key_secret", "now_us", "open_ledger"]


def open_ledger(path: str) -> Ledger:
    """Open (creating and migrating) the ledger at `path` (an SQLite file path)."""
    return SQLiteLedger(path)
