"""The purge `memwarden serve` runs on a schedule (``ERASE_INTERVAL_S``, ``ERASE_DATA_PATH``): Chroma only.

Every interval it asks the ledger when the backend last confirmed a delete (`Ledger.last_backend_delete`) and
runs the backend's purge (`sidecar.erase.chroma.purge`: ``chroma vacuum``) only when that moved since its last
purge — so an idle deployment is never vacuumed, and deletes confirmed while a purge runs are purged by the
next one. The purge runs in a worker thread (requests keep being served; Chroma itself blocks its reads and
writes while it vacuums). A failure is logged (``erase_failed``) and retried at the next interval.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

from sidecar.erase import chroma
from sidecar.erase.base import Purge
from sidecar.ledger import offloop

TIMEOUT_S = 600.0  # one scheduled `chroma vacuum` at most, seconds


async def purge_forever(ledger: Any, data_path: Path, interval_s: float, command: str | None = None) -> None:
    """Purge Chroma's data at `data_path` every `interval_s` seconds when a delete was confirmed since the last
    purge (never before the first interval). Runs until cancelled; logs ``erase_purged`` / ``erase_failed``."""
    log = structlog.get_logger("memwarden.erase")
    done: int | None = None
    while True:
        await asyncio.sleep(interval_s)
        try:
            newest = await offloop.call(ledger, ledger.last_backend_delete, chroma.NAME)
            if newest is None or newest == done:
                continue
            result: Purge = await asyncio.to_thread(chroma.purge, data_path, TIMEOUT_S, command)
            done = newest
            log.info("erase_purged", backend=chroma.NAME, seconds=result.seconds, deletes_up_to_us=newest)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next interval tries again; nothing is served differently meanwhile
            log.warning("erase_failed", backend=chroma.NAME, error=type(exc).__name__, detail=str(exc)[:300])
