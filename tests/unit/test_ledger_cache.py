"""The ledger caches (`sidecar.ledger.cache.CachingLedger`): what they serve from memory and what drops
them — another connection's commit (SQLite ``PRAGMA data_version``), a write through this connection or
the wrapper, a PostgreSQL notification; nothing is cached while PostgreSQL's channel is down, and keys are
never cached on PostgreSQL."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.ledger import CollectionRecord, SQLiteLedger, now_us
from sidecar.ledger.cache import CachingLedger
from sidecar.ledger.postgres import PostgresLedger
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)


def collection(cid: str, tenant: str = "t") -> CollectionRecord:
    return CollectionRecord("chroma", cid, tenant, "db", "c", "t/admin", now_us())


def test_sqlite_caches_and_another_connections_commit_drops_them(tmp_path: Path) -> None:
    raw = SQLiteLedger(tmp_path / "l.db")
    cached = CachingLedger(raw, raw.cache_version, ttl_s=3600)
    rec, key = raw.create_key("agent", "t", "red", "a", 1)
    raw.register_collection(collection("c1"))
    assert cached.authenticate(key) is not None and cached.get_collection("chroma", "c1") is not None
    assert cached.agent_entities({"t/red/a"})["t/red/a"]["attrs"]["trust"] == 1
    misses = cached.misses
    assert cached.authenticate(key) is not None and cached.get_collection("chroma", "c1") is not None
    assert cached.agent_entities({"t/red/a"}) and cached.misses == misses  # all three from memory
    other = SQLiteLedger(tmp_path / "l.db")  # another connection (as another process or the CLI)
    other.revoke_key(rec.key_id)
    assert cached.authenticate(key) is None  # the very next call
    other.delete_collection("chroma", "c1", "t/admin", "r")
    assert cached.get_collection("chroma", "c1") is None
    other.create_key("agent", "t", "red", "a", 3)  # the agent's trust changes
    assert cached.agent_entities({"t/red/a"})["t/red/a"]["attrs"]["trust"] == 3
    assert cached.authenticate(key + "x") is None and cached.get_collection("chroma", "nope") is None


def test_sqlite_writes_through_the_same_connection_or_the_wrapper_drop_them(tmp_path: Path) -> None:
    raw = SQLiteLedger(tmp_path / "l.db")
    cached = CachingLedger(raw, raw.cache_version, ttl_s=3600)
    rec, key = raw.create_key("agent", "t", "red", "a", 1)
    assert cached.authenticate(key) is not None
    raw.revoke_key(rec.key_id)  # same connection: data_version does not move, the write count does
    assert cached.authenticate(key) is None
    rec2, key2 = cached.create_key("agent", "t", "red", "b", 1)
    assert cached.authenticate(key2) is not None
    assert cached.revoke_key(rec2.key_id) and cached.authenticate(key2) is None  # through the wrapper


def test_no_cache_with_ttl_zero(tmp_path: Path) -> None:
    raw = SQLiteLedger(tmp_path / "l.db")
    cached = CachingLedger(raw, raw.cache_version, ttl_s=0)
    _, key = raw.create_key("agent", "t", "red", "a", 1)
    for _ in range(3):
        assert cached.authenticate(key) is not None
    assert cached.hits == 0


def wait_for_version_change(ledger: PostgresLedger, before: object) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = ledger.cache_version()
        if now is not None and now != before:
            return
        time.sleep(0.01)
    raise AssertionError("no notification within 10 s")


def settle(ledger: PostgresLedger) -> None:
    """Until the notifications sent so far are read (the token is stable and known)."""
    deadline = time.monotonic() + 10
    last = ledger.cache_version()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = ledger.cache_version()
        if now is not None and now == last:
            return
        last = now
    raise AssertionError("notifications did not settle within 10 s")


def test_postgres_notifications_drop_the_caches_and_keys_are_never_cached(pg_url: str) -> None:  # noqa: F811
    schema = fresh_schema()
    raw = PostgresLedger(pg_url, schema=schema, max_size=2)
    other = PostgresLedger(pg_url, schema=schema, max_size=2)
    try:
        cached = CachingLedger(raw, raw.cache_version, ttl_s=3600, cache_keys=False)
        deadline = time.monotonic() + 10
        while raw.cache_version() is None and time.monotonic() < deadline:  # the listener connects
            time.sleep(0.01)
        assert raw.cache_version() is not None
        rec, key = other.create_key("agent", "t", "red", "a", 1)
        other.register_collection(collection("c1"))
        settle(raw)
        assert cached.get_collection("chroma", "c1") is not None
        misses = cached.misses
        assert cached.get_collection("chroma", "c1") is not None and cached.misses == misses
        assert cached.authenticate(key) is not None
        other.revoke_key(rec.key_id)
        assert cached.authenticate(key) is None  # read from PostgreSQL on every call
        settle(raw)
        before = raw.cache_version()
        other.delete_collection("chroma", "c1", "t/admin", "r")
        wait_for_version_change(raw, before)
        assert cached.get_collection("chroma", "c1") is None
        # the channel down: nothing is cached
        other.register_collection(collection("c2"))
        settle(raw)
        assert raw._listener is not None
        raw._listener._poller = raw._listener._fd = None  # as the listener does when its connection drops
        misses = cached.misses
        assert cached.get_collection("chroma", "c2") is not None and cached.get_collection("chroma", "c2") is not None
        assert cached.misses == misses  # neither counted as a cache lookup: both went to PostgreSQL
        assert cached.hits == 1
    finally:
        raw.close()
        other.close()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=())))  # surrogates included
@example("")
@example("mwk_0123456789abcdef.s3cr3t")
@example("\ud800x\udfff")
@example("é\u2028🔑")
def test_digest_is_keyed_blake2b_of_the_key(plaintext: str) -> None:
    """`CachingLedger._digest` is BLAKE2b-256 keyed with the object's random key (a MAC: without the key the
    index says nothing of the API key), not the unkeyed hash, and another object's key gives other bytes."""
    cached, other = CachingLedger(None, lambda: 1), CachingLedger(None, lambda: 1)
    data = plaintext.encode("utf-8", "surrogatepass")
    expected = hashlib.blake2b(data, key=cached._secret, digest_size=32).digest()
    assert cached._digest(plaintext) == expected and len(expected) == 32 and len(cached._secret) == 32
    assert expected != hashlib.blake2b(data, digest_size=32).digest() and other._digest(plaintext) != expected


def test_sqlite_cache_version_moves_on_every_commit_and_write_count(tmp_path: Path) -> None:
    """`cache_version` (``PRAGMA data_version`` on its own cursor, with the write count) moves on another
    connection's commit and on this one's writes, stays while nothing commits, and leaves the connection's
    named rows alone."""
    raw = SQLiteLedger(tmp_path / "l.db")
    other = SQLiteLedger(tmp_path / "l.db")
    try:
        v0 = raw.cache_version()
        assert v0 == (raw._db.execute("PRAGMA data_version").fetchone()["data_version"], raw._writes)
        assert raw.cache_version() == v0
        other.create_key("agent", "t", "red", "a", 1)
        v1 = raw.cache_version()
        assert v1[0] != v0[0] and v1[1] == v0[1] and raw.cache_version() == v1
        raw.create_key("agent", "t", "red", "b", 1)
        v2 = raw.cache_version()
        assert v2 != v1 and v2[1] == v1[1] + 1
        assert isinstance(raw._db.execute("SELECT 1 AS one").fetchone(), sqlite3.Row)
    finally:
        raw.close()
        other.close()
