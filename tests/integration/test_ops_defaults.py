"""Issue 34, finding 12, on a real `memwarden serve`: readiness details only for operators, and the drain on
SIGTERM (readiness fails first, requests in flight still complete, then the process exits 0)."""

from __future__ import annotations

import json
import signal
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES, Stack, admin_client, chroma_client

pytestmark = pytest.mark.integration


def test_readyz_on_the_api_port_says_ready_and_nothing_else(stack: Stack) -> None:
    agent = stack.key(f"r{uuid.uuid4().hex[:8]}", "red", "a", 3)
    led = stack.ledger()
    operator = led.create_key("operator", None, None, None, 0)[1]
    led.close()
    for headers in ({}, {"X-API-Key": agent}):
        r = stack.http(**headers).get("/_memwarden/readyz")
        assert r.status_code == 200 and r.json() == {"ready": True}, r.text
    details = stack.http(operator).get("/_memwarden/readyz").json()
    on_metrics = stack.sidecar.readiness().json()
    for body in (details, on_metrics):
        assert body["ready"] is True and body["checks"] == {"ledger": True, "policies": True, "backend": True}
        assert len(body["policy"]["sha256"]) == 64 and body["mode"] == "enforce" and body["draining"] is False


def _response(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(60)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_sigterm_fails_readiness_then_finishes_requests_in_flight_and_exits_0(chroma_server: Server, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    SQLiteLedger(ledger).close()
    side = start_sidecar(chroma_server.url, ledger, POLICIES,
                         extra_env={"MEMWARDEN_SHUTDOWN_DRAIN_S": "5", "MEMWARDEN_BODY_TIMEOUT_S": "120",
                                    "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0"})
    sock = None
    try:
        name = f"d{uuid.uuid4().hex[:8]}"
        led = SQLiteLedger(ledger)
        admin = led.create_key("admin", name, None, None, 0)[1]
        key = led.create_key("agent", name, "red", "a", 1)[1]
        led.close()
        adm = admin_client(side.port, {"X-API-Key": admin})
        adm.create_tenant(name)
        adm.create_database("default_database", tenant=name)
        cid = chroma_client(side.port, name, {"X-API-Key": admin}).create_collection("mem").id
        assert httpx.get(side.url + "/_memwarden/readyz", trust_env=False).status_code == 200
        # A request in flight: its head and the first bytes of its body are in, the rest comes later.
        body = json.dumps({"ids": ["nothing-here"], "include": ["documents"]}).encode()
        sock = socket.create_connection(("127.0.0.1", side.port))
        sock.sendall(f"POST /api/v2/tenants/{name}/databases/default_database/collections/{cid}/get HTTP/1.1\r\n"
                     f"Host: memwarden\r\nX-API-Key: {key}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
        time.sleep(0.5)
        side.proc.send_signal(signal.SIGTERM)
        # Readiness fails first, while the API port still answers (on it: no details).
        deadline = time.monotonic() + 10
        while True:
            r = httpx.get(side.url + "/_memwarden/readyz", trust_env=False, timeout=10)
            if r.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 503 and r.json() == {"ready": False}
        assert side.readiness().json()["draining"] is True
        assert httpx.get(side.url + "/_memwarden/healthz", trust_env=False).status_code == 200  # alive: no restart
        # After the drain the listener closes...
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", side.port), timeout=1).close()
            except OSError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the listener stayed open after the drain")
        assert side.proc.poll() is None  # ... while the request in flight holds the process
        sock.sendall(body[5:])
        head, _, payload = _response(sock).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert json.loads(payload)["ids"] == []
        assert side.proc.wait(timeout=30) == 0, side.log_tail()
        assert "SIGTERM: not ready" in side.log.read_text()
    finally:
        if sock is not None:
            sock.close()
        side.stop()
