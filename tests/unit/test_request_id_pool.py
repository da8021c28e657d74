"""`sidecar.exchange.new_request_id` draws the bytes of 1024 ids in one ``os.urandom`` call: each id is what the
old code (`exchange_reference.request_id_h23`, one ``os.urandom(16)`` per id) made of its own 16 bytes, each
16 bytes are used once, every id is handed out once, and a forked child never hands out the parent's ids."""

from __future__ import annotations

import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import exchange

from .exchange_reference import request_id_h23


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 2500))
def test_ids_are_the_old_ids_of_fresh_bytes(seed: int, n: int) -> None:
    rnd = random.Random(seed)
    draws: list[bytes] = []

    def urandom(k: int) -> bytes:
        data = rnd.randbytes(k)
        draws.append(data)
        return data

    saved = list(exchange._ids)
    exchange._ids.clear()
    real = exchange.os.urandom
    exchange.os.urandom = urandom  # type: ignore[assignment]
    try:
        got = [exchange.new_request_id() for _ in range(n)]
    finally:
        exchange.os.urandom = real  # type: ignore[assignment]
        exchange._ids[:] = saved
    assert all(len(d) == 16 * exchange._IDS_PER_DRAW for d in draws)
    assert len(draws) == -(-n // exchange._IDS_PER_DRAW)
    # Every draw's 16-byte chunks, each made into an id as the old code made it, handed out last first.
    expected: list[str] = []
    for d in draws:
        ids = [request_id_h23(d[i:i + 16]) for i in range(0, len(d), 16)]
        expected += reversed(ids)
    assert got == expected[:n]
    assert len(set(got)) == n


def test_a_forked_child_drops_the_undrawn_ids() -> None:
    exchange.new_request_id()  # the pool holds undrawn ids now
    pending = set(exchange._ids)
    assert pending
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first ids, to the parent
        try:
            os.close(r)
            os.write(w, ",".join(exchange.new_request_id() for _ in range(5)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child_ids = f.read().decode().split(",")
    os.waitpid(pid, 0)
    assert len(child_ids) == 5 and not set(child_ids) & pending
    assert set(exchange._ids) == pending  # the parent's pool untouched


def test_no_id_repeats_across_draws() -> None:
    ids = [exchange.new_request_id() for _ in range(3 * exchange._IDS_PER_DRAW + 7)]
    assert len(set(ids)) == len(ids)
