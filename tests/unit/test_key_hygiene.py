"""API key hygiene on SQLite and PostgreSQL (ledger schema version 9): keys that expire, the last time a key was
used (written at most once a minute), rotation with a grace period, the upgrade of older ledgers, the caches never
serving a key past its expiry, and the `memwarden keys` commands (create --expires-in, rotate, list)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from sidecar.cli import app, parse_duration
from sidecar.ledger import SQLiteLedger, open_ledger
from sidecar.ledger.base import LAST_USED_RESOLUTION_US, hash_secret, now_us
from sidecar.ledger.cache import CachingLedger
from sidecar.ledger.postgres import MIGRATIONS as PG_MIGRATIONS
from sidecar.ledger.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)
from tests.unit.test_ledger import Opener, ledger, opener  # noqa: F401  (fixtures: one SQLite file, one PG schema)

HOUR_US = 3600 * 1_000_000


def _sql(ledger: Any, statement: str, *args: Any) -> list[Any]:
    """Run `statement` (``?`` placeholders) on the ledger's own database, outside its API."""
    if isinstance(ledger, SQLiteLedger):
        return ledger._db.execute(statement, args).fetchall()
    with ledger._conn() as db:
        cur = db.execute(statement.replace("?", "%s"), args)
        return cur.fetchall() if cur.description else []


def _record(ledger: Any, key_id: str) -> Any:
    return next(k for k in ledger.list_keys() if k.key_id == key_id)


def test_an_expired_key_is_refused_everywhere(ledger: Any) -> None:
    live, live_key = ledger.create_key("agent", "t", "red", "a", 1, expires_at=now_us() + HOUR_US)
    dead, dead_key = ledger.create_key("agent", "t", "red", "b", 1, expires_at=now_us() - 1)
    p = ledger.authenticate(live_key)
    assert p is not None and p.expires_at == live.expires_at and ledger.key_valid(live.key_id)
    assert ledger.authenticate(dead_key) is None and not ledger.key_valid(dead.key_id)
    assert _record(ledger, dead.key_id).expires_at == dead.expires_at
    if hasattr(ledger, "read_rows"):  # PostgreSQL: the key re-check made in the statement of a read's rows
        assert ledger.read_rows("chroma", "c", [], live.key_id)[2] is True
        assert ledger.read_rows("chroma", "c", [], dead.key_id)[2] is False
        assert ledger.visible_rows("chroma", "c", "t", None, 10, dead.key_id)[3] is False


def test_last_use_is_recorded_at_most_once_a_minute(ledger: Any) -> None:
    record, key = ledger.create_key("agent", "t", "red", "a", 1)
    assert _record(ledger, record.key_id).last_used_at is None
    before = now_us()
    assert ledger.authenticate(key) is not None
    first = _record(ledger, record.key_id).last_used_at
    assert first is not None and first >= before
    token = ledger.cache_version() if isinstance(ledger, SQLiteLedger) else None
    assert ledger.authenticate(key) is not None
    assert _record(ledger, record.key_id).last_used_at == first  # within the minute: not written again
    # a minute later (the stored time moved back): written again; on SQLite without moving the caches' token
    _sql(ledger, "UPDATE api_keys SET last_used_at = ? WHERE key_id = ?", first - LAST_USED_RESOLUTION_US, record.key_id)
    if token is not None:
        token = ledger.cache_version()
    assert ledger.authenticate(key) is not None
    assert _record(ledger, record.key_id).last_used_at > first - LAST_USED_RESOLUTION_US
    if token is not None:
        assert ledger.cache_version() == token
    # a failed authentication is no use
    _sql(ledger, "UPDATE api_keys SET last_used_at = NULL WHERE key_id = ?", record.key_id)
    assert ledger.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert _record(ledger, record.key_id).last_used_at is None


def test_rotation_gives_a_new_key_and_a_grace_period(ledger: Any) -> None:
    old, old_key = ledger.create_key("agent", "t", "red", "a", 2, roles=["triage"], expires_at=now_us() + 30 * 24 * HOUR_US)
    new, new_key, until = ledger.rotate_key(old.key_id, 3600)
    assert (new.kind, new.tenant, new.fleet, new.agent, new.trust, new.roles) == ("agent", "t", "red", "a", 2, ("triage",))
    assert new.key_id != old.key_id and new_key != old_key
    # the new key gets the old one's lifetime (30 days) when no expiry is given
    assert new.expires_at is not None and abs((new.expires_at - new.created_at) - 30 * 24 * HOUR_US) < 60_000_000
    assert abs(until - (now_us() + HOUR_US)) < 60_000_000
    p_old, p_new = ledger.authenticate(old_key), ledger.authenticate(new_key)
    assert p_old is not None and p_new is not None and p_old.uid == p_new.uid and p_old.expires_at == until
    assert _record(ledger, old.key_id).rotated_to == new.key_id
    with pytest.raises(ValueError, match="rotated already"):
        ledger.rotate_key(old.key_id, 60)
    # no grace: the old key is refused at once; the next rotation of the new key works
    newer, newer_key, until2 = ledger.rotate_key(new.key_id, 0, expires_at=now_us() + HOUR_US)
    assert ledger.authenticate(new_key) is None and ledger.authenticate(newer_key) is not None
    assert newer.expires_at is not None and newer.expires_at <= now_us() + HOUR_US
    with pytest.raises(ValueError, match="no active key"):
        ledger.rotate_key("nope", 60)
    ledger.revoke_key(newer.key_id)
    with pytest.raises(ValueError, match="no active key"):
        ledger.rotate_key(newer.key_id, 60)
    with pytest.raises(ValueError, match="not negative"):
        ledger.rotate_key(old.key_id, -1)


def test_a_grace_never_extends_a_keys_expiry(ledger: Any) -> None:
    old, _ = ledger.create_key("admin", "t", None, None, 0, expires_at=now_us() + 60_000_000)
    _, _, until = ledger.rotate_key(old.key_id, 24 * 3600)
    assert until == old.expires_at


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_migration_10_keeps_existing_keys_valid_without_expiry(kind: str, tmp_path: Path,
                                                            request: pytest.FixtureRequest) -> None:
    """Keys written by the version-8 code authenticate after the upgrade, with no expiry and no recorded use."""
    if kind == "sqlite":
        db: Any = sqlite3.connect(tmp_path / "v8.db", isolation_level=None)
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        migrations, ph = SQLITE_MIGRATIONS, "?"
    else:
        url, schema = request.getfixturevalue("pg_url"), fresh_schema()
        db = psycopg.connect(url, autocommit=True)
        db.execute(f'CREATE SCHEMA "{schema}"')
        db.execute(f"SET search_path = {schema}")
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at BIGINT NOT NULL)")
        migrations, ph = PG_MIGRATIONS, "%s"
    for version in range(8):
        for statement in migrations[version].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"INSERT INTO schema_version VALUES ({ph}{', 0' if kind == 'postgres' else ''})", (version + 1,))
    db.execute(f"INSERT INTO api_keys (key_id, salt, hash, kind, tenant, fleet, agent, trust, created_at) "
               f"VALUES ('k8', '00', {ph}, 'agent', 't', 'red', 'a', 1, 1)", (hash_secret(b"\0", "s"),))
    db.close()
    ledger = SQLiteLedger(tmp_path / "v8.db") if kind == "sqlite" else open_ledger(url, schema=schema, max_size=2)
    try:
        assert ledger.migrate() == len(migrations) == 10
        [k] = ledger.list_keys()
        assert (k.key_id, k.expires_at, k.last_used_at, k.rotated_to) == ("k8", None, None, None)
        p = ledger.authenticate("mwk_k8.s")
        assert p is not None and p.expires_at is None and ledger.key_valid("k8")
    finally:
        ledger.close()


def test_the_key_cache_never_serves_a_key_past_its_expiry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inner = SQLiteLedger(tmp_path / "l.db")
    cache = CachingLedger(inner, inner.cache_version, ttl_s=3600)
    try:
        record, key = inner.create_key("agent", "t", "red", "a", 1, expires_at=now_us() + HOUR_US)
        assert cache.authenticate(key) is not None
        assert cache.authenticate(key) is not None and cache.hits == 1
        later = now_us() + 2 * HOUR_US
        for module in ("sidecar.ledger.cache", "sidecar.ledger.sqlite"):
            monkeypatch.setattr(f"{module}.now_us", lambda: later)
        assert cache.authenticate(key) is None  # the cached principal is past its key's expiry: asked again, refused
    finally:
        inner.close()


def test_parse_duration() -> None:
    assert parse_duration("30d") == 30 * 86400 and parse_duration("12h") == 43200 and parse_duration("0s") == 0
    assert parse_duration("90m") == 5400 and parse_duration("2w") == 14 * 86400
    for bad in ("", "3", "3x", "-1h", "1.5h", "1h30m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_keys_commands_create_rotate_and_list(tmp_path: Path) -> None:
    runner = CliRunner()
    db = str(tmp_path / "l.db")
    out = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--fleet", "red", "--agent", "a1", "--trust", "1",
                              "--expires-in", "30d", "--ledger", db])
    assert out.exit_code == 0, out.output
    old_key = out.stdout.strip().splitlines()[0]
    old_id = old_key[len("mwk_"):].split(".")[0]
    for bad in (["--expires-in", "0s"], ["--expires-in", "soon"]):
        r = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--admin", "--ledger", db, *bad])
        assert r.exit_code == 2
    rotated = runner.invoke(app, ["keys", "rotate", old_id, "--grace", "1h", "--ledger", db])
    assert rotated.exit_code == 0, rotated.output
    new_key = rotated.stdout.strip().splitlines()[0]
    new_id = new_key[len("mwk_"):].split(".")[0]
    store = SQLiteLedger(tmp_path / "l.db")
    try:
        assert store.authenticate(old_key) is not None and store.authenticate(new_key) is not None
    finally:
        store.close()
    assert runner.invoke(app, ["keys", "rotate", old_id, "--ledger", db]).exit_code == 1  # rotated already
    assert runner.invoke(app, ["keys", "rotate", new_id, "--grace", "soon", "--ledger", db]).exit_code == 2
    listed = runner.invoke(app, ["keys", "list", "--ledger", db], env={"COLUMNS": "60"})
    assert listed.exit_code == 0 and old_id in listed.stdout and new_id in listed.stdout  # full ids, even narrow
    rows = [json.loads(line) for line in runner.invoke(app, ["keys", "list", "--format", "json", "--ledger", db]).stdout.splitlines()]
    by_id = {r["key_id"]: r for r in rows}
    assert by_id[old_id]["state"] == f"rotated to {new_id}" and by_id[old_id]["expires_at"].endswith("Z")
    assert by_id[new_id]["state"] == "active" and by_id[new_id]["last_used_at"].endswith("Z")  # the authenticate above
