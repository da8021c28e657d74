"""Earlier code of `sidecar.exchange`, kept as a test reference."""

from __future__ import annotations

import os


def request_id_h23(random_bytes: bytes | None = None) -> str:
    """`sidecar.exchange.new_request_id` before the ids were drawn 1024 at a time (one ``os.urandom(16)`` per
    id), of `random_bytes` (16) when given."""
    b = bytearray(os.urandom(16) if random_bytes is None else random_bytes)
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # variant RFC 4122
    return b.hex()
