"""Connection bounds and request-target forms against a real `memwarden serve` (sidecar/server.py).

A bounded slow-client run on loopback — sockets that never send a byte, slowloris headers, bodies
that trickle — against a sidecar with a small file-descriptor limit: slow sockets are answered 408 or
closed within their deadlines, and keyed requests sent meanwhile are served (200), not starved.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES, Stack

pytestmark = pytest.mark.integration


def raw_request(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes or answers one response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out or len(out) < out.index(b"\r\n\r\n") + 4 + _length(out):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


@pytest.mark.parametrize("target", [
    "http://127.0.0.1:{port}/api/v2/auth/identity",    # absolute-form (RFC 9112 §3.2.2)
    "http://other.example/api/v2/auth/identity",        # absolute-form naming another host
    "/api/v2/auth/identity#frag",                       # fragment
    "/api/v2/auth/identity?limit=1#frag",               # fragment after a query
])
def test_absolute_form_and_fragments_are_refused(stack: Stack, target: str) -> None:
    t = stack.tenant("abs")
    key = stack.key(t.name, "f1", "a1", 1)
    origin = raw_request(stack.sidecar.port, f"GET /api/v2/auth/identity HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
                         "Connection: close\r\n\r\n".encode())
    assert status_of(origin) == 200  # the same request in origin-form is served
    head = origin.split(b"\r\n\r\n")[0].lower()
    assert b"\r\nserver:" not in head and b"\r\ndate:" in head  # no server banner; Date (RFC 9110 §6.6.1) kept
    req = (f"GET {target.format(port=stack.sidecar.port)} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
           "Connection: close\r\n\r\n").encode()
    answer = raw_request(stack.sidecar.port, req)
    assert status_of(answer) == 400, answer[:300]
    assert b"request target" in answer


# -- slow clients --------------------------------------------------------------------------------

NOFILE = 256
MAX_CONNECTIONS = 120
TIMEOUTS = {"MEMWARDEN_IDLE_TIMEOUT_S": "2", "MEMWARDEN_HEADER_TIMEOUT_S": "2", "MEMWARDEN_BODY_TIMEOUT_S": "3"}


@pytest.fixture
def bounded_sidecar(tmp_path: Path, chroma_server: Server) -> Iterator[tuple[Server, str]]:
    ledger_path = tmp_path / "ledger.db"
    led = SQLiteLedger(ledger_path)
    key = led.create_key("agent", "slow", "f1", "a1", 1)[1]
    led.close()
    side = start_sidecar(chroma_server.url, ledger_path, POLICIES, nofile=NOFILE,
                         extra_env={**TIMEOUTS, "MEMWARDEN_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
                                    "MEMWARDEN_METRICS_PORT": "0", "MEMWARDEN_RECONCILE_INTERVAL_S": "0",
                                    "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0"})
    yield side, key
    side.stop()


async def _hold(port: int, kind: str, key: str, seconds: float, log: list[tuple[str, str, float]]) -> None:
    """One slow client, for at most `seconds`: `idle` sends nothing, `headers` sends its request line
    and headers one byte every 0.2 s, `body` sends complete headers and then one body byte every 0.2 s.
    Records (kind, outcome, seconds until the server answered or closed)."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (OSError, asyncio.TimeoutError) as exc:
        log.append((kind, f"connect:{type(exc).__name__}", time.monotonic() - started))
        return
    started = time.monotonic()  # the deadlines run from the connection (300 connects take a while on a busy machine)
    head = f"POST /api/v2/auth/identity HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n".encode()
    if kind == "body":
        writer.write(head + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    trickle = head if kind == "headers" else b"x" * 10_000
    i = 0

    async def answered() -> bytes:
        try:
            return await reader.read(4096)
        except ConnectionResetError:  # closed while bytes it sent were unread (evicted, or after a 408): a reset
            return b""

    reading = asyncio.ensure_future(answered())
    try:
        while time.monotonic() - started < seconds:
            done, _ = await asyncio.wait([reading], timeout=0.2)
            if done:
                data = reading.result()
                outcome = f"status:{status_of(data)}" if data else "closed"
                log.append((kind, outcome, time.monotonic() - started))
                return
            if kind != "idle" and i < len(trickle):
                try:
                    writer.write(trickle[i:i + 1])
                    await writer.drain()
                except (ConnectionError, OSError):
                    pass
                i += 1
        log.append((kind, "held", time.monotonic() - started))
    finally:
        reading.cancel()
        writer.close()


async def _keyed(port: int, key: str, seconds: float, results: list[int]) -> None:
    """A well-behaved client: one keyed request on a fresh connection every 0.25 s."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            writer.write(f"GET /api/v2/auth/identity HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
                         "Connection: close\r\n\r\n".encode())
            data = await asyncio.wait_for(reader.read(4096), 5)
            writer.close()
            results.append(status_of(data))
        except (OSError, asyncio.TimeoutError):
            results.append(-1)
        await asyncio.sleep(0.25)


async def _attack(port: int, key: str, per_kind: int, seconds: float) -> tuple[list[tuple[str, str, float]], list[int]]:
    log: list[tuple[str, str, float]] = []
    keyed: list[int] = []
    slow = [_hold(port, kind, key, seconds, log) for kind in ("idle", "headers", "body") for _ in range(per_kind)]
    await asyncio.gather(*slow, _keyed(port, key, seconds - 1.0, keyed))
    return log, keyed


def test_slow_clients_are_bounded_and_keyed_requests_are_served(bounded_sidecar: tuple[Server, str]) -> None:
    side, key = bounded_sidecar
    # 3 x 100 slow sockets: more than MAX_CONNECTIONS, and with the keyed client and the sidecar's own
    # files, more than the NOFILE the sidecar may open.
    log, keyed = asyncio.run(_attack(side.port, key, per_kind=100, seconds=8.0))
    assert keyed and all(s == 200 for s in keyed), keyed
    by_kind: dict[str, list[tuple[str, float]]] = {}
    for kind, outcome, dt in log:
        by_kind.setdefault(kind, []).append((outcome, dt))
    assert all(len(v) == 100 for v in by_kind.values())
    # Nobody is held for the whole run: each slow socket was answered or closed within its bound
    # (or closed earlier to make room for the keyed client, or refused 503 when over MAX_CONNECTIONS).
    for kind, outcomes in by_kind.items():
        assert not [o for o in outcomes if o[0] == "held"], (kind, outcomes)
    slowloris = [o for o in by_kind["headers"] if o[0] == "status:408"]
    assert slowloris and all(dt < 2 + 2.0 for _, dt in slowloris)
    trickled = [o for o in by_kind["body"] if o[0] == "status:408"]
    assert trickled and all(dt < 3 + 2.0 for _, dt in trickled)
    assert all(o in ("closed", "status:503", "status:408") for o, _ in (x for v in by_kind.values() for x in v)), log
    assert side.proc.poll() is None


# -- slow read (issue 34, finding 1) --------------------------------------------------------------

ATTACKERS = 45
PIPELINED = 12_000
HEARTBEAT = b"GET /api/v2/heartbeat HTTP/1.1\r\nHost: x\r\n\r\n"


def rss_bytes(pid: int) -> int:
    """The resident set size of process `pid` (``VmRSS`` of /proc/<pid>/status), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@pytest.fixture
def plain_sidecar(tmp_path: Path, chroma_server: Server) -> Iterator[tuple[Server, str]]:
    """A sidecar with the default connection bounds, its decision log in a small rotated file (the attack
    below makes hundreds of thousands of 401 events)."""
    ledger_path = tmp_path / "ledger.db"
    led = SQLiteLedger(ledger_path)
    key = led.create_key("agent", "slowread", "f1", "a1", 1)[1]
    led.close()
    side = start_sidecar(chroma_server.url, ledger_path, POLICIES,
                         extra_env={"MEMWARDEN_METRICS_PORT": "0", "MEMWARDEN_RECONCILE_INTERVAL_S": "0",
                                    "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0", "MEMWARDEN_DECISION_LOG_SINK": "file",
                                    "MEMWARDEN_DECISION_LOG_PATH": str(tmp_path / "decisions.jsonl"),
                                    "MEMWARDEN_DECISION_LOG_MAX_BYTES": str(4 * 1024 * 1024),
                                    "MEMWARDEN_DECISION_LOG_BACKUPS": "1"})
    yield side, key
    side.stop()


async def slow_read_attack(port: int, key: str, pid: int, keyed_requests: int = 11,
                           gap_s: float = 0.5) -> tuple[list[tuple[int, float]], int, int]:
    """`ATTACKERS` keyless connections each send `PIPELINED` heartbeats in one send and never read; meanwhile a
    keyed ``GET /api/v2/auth/identity`` on a fresh connection every `gap_s`. Returns ([(status or -1 when
    unanswered within 5 s, seconds)], resident bytes of `pid` before, peak resident bytes during)."""
    loop = asyncio.get_running_loop()
    before = rss_bytes(pid)
    peak = before
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.ensure_future(sample())
    socks = []
    for _ in range(ATTACKERS):
        s = socket.socket()
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", port))
        socks.append(s)
    payload = HEARTBEAT * PIPELINED
    sends = [asyncio.ensure_future(loop.sock_sendall(s, payload)) for s in socks]
    results: list[tuple[int, float]] = []
    try:
        await asyncio.sleep(gap_s)
        for _ in range(keyed_requests):
            started = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                try:
                    writer.write(f"GET /api/v2/auth/identity HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
                                 "Connection: close\r\n\r\n".encode())
                    data = await asyncio.wait_for(reader.read(), 5 - (time.monotonic() - started))
                finally:
                    writer.close()
                results.append((status_of(data), time.monotonic() - started))
            except (OSError, asyncio.TimeoutError):
                results.append((-1, time.monotonic() - started))
            await asyncio.sleep(gap_s)
    finally:
        sampling = False
        await sampler
        for task in sends:
            task.cancel()
        for s in socks:
            s.close()
    return results, before, peak


def test_slow_read_attack_does_not_starve_keyed_requests_or_grow_memory(plain_sidecar: tuple[Server, str]) -> None:
    """Issue 34, finding 1: before, every keyed request timed out while the attack ran and the sidecar's
    memory grew from 128 MiB to over 400 MiB (1.4 GiB in the report's run)."""
    side, key = plain_sidecar
    results, before, peak = asyncio.run(slow_read_attack(side.port, key, side.proc.pid))
    assert side.proc.poll() is None
    assert results and all(status == 200 for status, _ in results), results
    assert peak - before < 150 * 1024 * 1024, (before >> 20, peak >> 20)
