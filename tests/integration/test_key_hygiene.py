"""API key expiry and rotation through a real `memwarden serve` (SQLite ledger, key cache on): a key is refused from
its expiry on, even while its principal is in the sidecar's key cache; a rotated key keeps working through its grace
period beside its replacement and is refused after it; the sidecar records when a key was last used."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger.base import now_us
from tests.integration.conftest import POLICIES, Stack


@pytest.fixture(scope="module")
def long_cache(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[Stack]:
    """A sidecar whose key cache keeps a principal for 60 s: an expiry must cut that short."""
    tmp: Path = tmp_path_factory.mktemp("hygiene")
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", POLICIES, extra_env={"MEMWARDEN_LEDGER_CACHE_TTL_S": "60"})
    yield Stack(chroma_server, side, tmp / "ledger.db")
    side.stop()

pytestmark = pytest.mark.integration


def _status(stack: Stack, key: str) -> int:
    with httpx.Client(base_url=stack.sidecar.url, headers={"X-API-Key": key}, timeout=30, trust_env=False) as c:
        return c.get("/api/v2/auth/identity").status_code


def _until_refused(stack: Stack, key: str, deadline_us: int) -> int:
    """Poll until `key` is refused or `deadline_us` (UTC µs) passes; the UTC µs time it was first refused."""
    while now_us() < deadline_us:
        if _status(stack, key) == 401:
            return now_us()
        time.sleep(0.1)
    raise AssertionError("the key was still accepted")


def test_a_cached_key_is_refused_from_its_expiry(long_cache: Stack) -> None:
    stack = long_cache
    ledger = stack.ledger()
    try:
        record, key = ledger.create_key("agent", "hyg", "red", "a1", 1, expires_at=now_us() + 3_000_000)
    finally:
        ledger.close()
    assert _status(stack, key) == 200 and _status(stack, key) == 200  # the second from the key cache (TTL 60 s)
    assert record.expires_at is not None
    # refused from its expiry on, not when the cache entry ages out a minute later
    refused_at = _until_refused(stack, key, record.expires_at + 30_000_000)
    assert refused_at >= record.expires_at
    ledger = stack.ledger()
    try:
        used = next(k for k in ledger.list_keys("hyg") if k.key_id == record.key_id).last_used_at
    finally:
        ledger.close()
    assert used is not None and record.created_at <= used <= record.expires_at


def test_a_rotated_key_works_through_its_grace_then_is_refused(stack: Stack) -> None:
    ledger = stack.ledger()
    try:
        old, old_key = ledger.create_key("agent", "hyg", "red", "a2", 1)
        assert _status(stack, old_key) == 200
        new, new_key, until = ledger.rotate_key(old.key_id, 3.0)
    finally:
        ledger.close()
    assert _status(stack, old_key) == 200 and _status(stack, new_key) == 200
    assert _until_refused(stack, old_key, until + 10_000_000) >= until
    assert _status(stack, new_key) == 200
