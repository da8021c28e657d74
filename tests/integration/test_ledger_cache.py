"""Ledger caches across processes (`sidecar.ledger.cache`): two real `memwarden serve` processes on one
SQLite ledger file, both warm; a key revoked, an agent's trust changed or a collection deleted through
another process (the CLI, the other replica) is honoured by each replica on its very next request. The
PostgreSQL equivalents are in test_replicas.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES, admin_client, chroma_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair(chroma_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server, Path]]:
    tmp = tmp_path_factory.mktemp("cache")
    ledger = tmp / "ledger.db"
    SQLiteLedger(ledger).close()
    env = {"MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0", "MEMWARDEN_LEDGER_CACHE_TTL_S": "3600"}  # no expiry helps
    a = start_sidecar(chroma_server.url, ledger, POLICIES, extra_env=env)
    try:
        b = start_sidecar(chroma_server.url, ledger, POLICIES, extra_env=env)
    except BaseException:
        a.stop()
        raise
    yield a, b, ledger
    a.stop()
    b.stop()


def cli(ledger: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "keys", *args, "--ledger", str(ledger)],
                         env={k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def tenant(a: Server, ledger: Path) -> tuple[str, str, str]:
    name = f"c{uuid.uuid4().hex[:8]}"
    led = SQLiteLedger(ledger)
    admin = led.create_key("admin", name, None, None, 0)[1]
    led.close()
    adm = admin_client(a.port, {"X-API-Key": admin})
    adm.create_tenant(name)
    adm.create_database("default_database", tenant=name)
    coll = chroma_client(a.port, name, {"X-API-Key": admin}).create_collection("mem")
    return name, str(coll.id), admin


def count(s: Server, key: str, name: str, cid: str) -> httpx.Response:
    return httpx.get(f"{s.url}/api/v2/tenants/{name}/databases/default_database/collections/{cid}/count",
                     headers={"X-API-Key": key}, trust_env=False, timeout=30)


def test_revocation_through_the_cli_is_honoured_by_both_warm_replicas(pair: tuple[Server, Server, Path]) -> None:
    a, b, ledger = pair
    name, cid, _ = tenant(a, ledger)
    led = SQLiteLedger(ledger)
    rec, key = led.create_key("agent", name, "red", "r", 1)
    led.close()
    for _ in range(3):  # warm both caches
        assert count(a, key, name, cid).status_code == 200 and count(b, key, name, cid).status_code == 200
    cli(ledger, "revoke", rec.key_id)
    assert count(b, key, name, cid).status_code == 401
    assert count(a, key, name, cid).status_code == 401


def test_a_collection_deleted_through_a_is_gone_on_b(pair: tuple[Server, Server, Path]) -> None:
    a, b, ledger = pair
    name, cid, admin = tenant(a, ledger)
    led = SQLiteLedger(ledger)
    key = led.create_key("agent", name, "red", "r", 1)[1]
    led.close()
    assert count(b, key, name, cid).status_code == 200 and count(b, key, name, cid).status_code == 200
    chroma_client(a.port, name, {"X-API-Key": admin}).delete_collection("mem")
    r = count(b, key, name, cid)
    assert r.status_code == 404 and r.json()["error"] == "not_found", r.text


def test_a_key_created_after_both_are_warm_works_on_both(pair: tuple[Server, Server, Path]) -> None:
    a, b, ledger = pair
    name, cid, _ = tenant(a, ledger)
    led = SQLiteLedger(ledger)
    first = led.create_key("agent", name, "red", "r", 1)[1]
    led.close()
    assert count(a, first, name, cid).status_code == 200 and count(b, first, name, cid).status_code == 200
    assert count(b, first + "x", name, cid).status_code == 401  # unknown: answered by the ledger, not cached
    key = cli(ledger, "create", "--tenant", name, "--fleet", "red", "--agent", "s", "--trust", "1")
    plaintext = next(w for w in key.split() if w.startswith("mwk_"))
    assert count(b, plaintext, name, cid).status_code == 200
    assert count(a, plaintext, name, cid).status_code == 200
