"""What the core reads off a backend profile: the governance parts it was built with (issue 35).

The core's transactions (`sidecar.core.writes`, `sidecar.core.deletes`) take the profile itself as `Governed` and
read these attributes at each call, so a profile (or a test) that swaps one keeps the core in step.
"""

from __future__ import annotations

from typing import Protocol

from sidecar.config import Settings
from sidecar.ledger.base import Ledger
from sidecar.provenance import Provenance
from sidecar.stages.authorize import Authorizer

# Ledger row statuses a request may act on (a tombstoned or reserved row does not exist for a caller).
LIVE = ("active", "superseded")


class Governed(Protocol):
    """A backend profile as the core sees it: its backend's ledger name (``name``: ``chroma``, ``mem0``), the
    ledger, the authorizer (Cedar decisions, row counts), the provenance rules bound to the backend and the
    settings."""

    name: str
    ledger: Ledger
    authz: Authorizer
    prov: Provenance
    settings: Settings
