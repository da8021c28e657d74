"""Failpoints (testing only, ``MEMWARDEN_FAILPOINTS``): named crash points of the write and delete transactions."""

from __future__ import annotations

import os
import signal


def crash() -> None:
    """Die like ``kill -9`` (no clean-up, no answer)."""
    os.kill(os.getpid(), signal.SIGKILL)
