"""Issue 34, finding 2: ordinary CLI commands run against the SQLite ledger of a serving sidecar.

A real `memwarden serve` on an SQLite ledger answers reads from several threads while other processes run
`memwarden keys create` and `memwarden keys revoke` 50 times each. The sidecar must stay up (the WAL index it
used to map lost SQLite's POSIX locks, so each new process re-initialised it under the sidecar: SIGBUS),
answer every read with 200 (no 5xx, no dropped connection), and honour every revocation on the revoked
key's next request (401)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES, admin_client, chroma_client

pytestmark = pytest.mark.integration

ROUNDS = 50
READERS = 4


def cli(ledger: Path, *args: str) -> str:
    """`memwarden keys ARGS --ledger LEDGER` in a process of its own; its stdout (exit status 0 asserted)."""
    out = subprocess.run([sys.executable, "-m", "sidecar.cli", "keys", *args, "--ledger", str(ledger)],
                         env={k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_keys_create_and_revoke_in_other_processes_while_serving(chroma_server: Server, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    SQLiteLedger(ledger).close()
    side = start_sidecar(chroma_server.url, ledger, POLICIES,
                         extra_env={"MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0", "MEMWARDEN_LEDGER_CACHE_TTL_S": "3600"})
    stop = threading.Event()
    failures: list[str] = []
    served = [0] * READERS
    try:
        name = f"cc{uuid.uuid4().hex[:8]}"
        led = SQLiteLedger(ledger)
        admin = led.create_key("admin", name, None, None, 0)[1]
        reader_key = led.create_key("agent", name, "red", "reader", 1)[1]
        led.close()
        adm = admin_client(side.port, {"X-API-Key": admin})
        adm.create_tenant(name)
        adm.create_database("default_database", tenant=name)
        cid = str(chroma_client(side.port, name, {"X-API-Key": admin}).create_collection("mem").id)
        count_url = f"{side.url}/api/v2/tenants/{name}/databases/default_database/collections/{cid}/count"

        def read(i: int) -> None:
            with httpx.Client(headers={"X-API-Key": reader_key}, trust_env=False, timeout=30) as client:
                while not stop.is_set():
                    try:
                        r = client.get(count_url)
                    except httpx.HTTPError as exc:
                        failures.append(f"reader {i}: {type(exc).__name__}: {exc}")
                        return
                    if r.status_code != 200:
                        failures.append(f"reader {i}: {r.status_code} {r.text[:200]}")
                        return
                    served[i] += 1
                    stop.wait(0.005)  # leave the CPU to the CLI processes (a shared machine)

        threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(READERS)]
        for t in threads:
            t.start()
        def get(client: httpx.Client, key: str, n: int) -> httpx.Response:
            try:
                return client.get(count_url, headers={"X-API-Key": key})
            except httpx.HTTPError as exc:
                side.proc.poll()
                raise AssertionError(f"round {n}: {exc!r}; sidecar exit status {side.proc.returncode} "
                                     f"(-7: SIGBUS)\n{side.log_tail()}") from None

        with httpx.Client(trust_env=False, timeout=30) as client:
            for n in range(ROUNDS):
                out = cli(ledger, "create", "--tenant", name, "--fleet", "red", "--agent", f"a{n}", "--trust", "1")
                key = next(w for w in out.split() if w.startswith("mwk_"))
                key_id = key[len("mwk_"):].split(".")[0]
                r = get(client, key, n)
                assert r.status_code == 200, (n, r.status_code, r.text, side.log_tail())
                cli(ledger, "revoke", key_id)
                r = get(client, key, n)
                assert r.status_code == 401, (n, r.status_code, r.text, side.log_tail())
                assert side.proc.poll() is None, f"sidecar exited with {side.proc.returncode}:\n{side.log_tail()}"
                assert not failures, failures
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert not failures, failures
        assert all(served), served  # every reader was answered throughout
        assert side.proc.poll() is None, f"sidecar exited with {side.proc.returncode}:\n{side.log_tail()}"
    finally:
        stop.set()
        side.stop()
