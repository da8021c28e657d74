"""The slow-read attack of issue 34 (finding 1) against a sidecar, with figures (a script, not a test; not run in CI).

    .venv/bin/python bench/slowread.py [--attackers 45] [--pipelined 12000] [--keyed 40] [--gap-s 0.25]
                                       [--url http://127.0.0.1:PORT --pid PID --key KEY] [--json out.json]

Without ``--url`` it starts ``chroma run`` and ``memwarden serve`` (default connection bounds; the decision log
in a rotated 4 MiB file under a temp dir) and an agent key. Then:

1. quiet: ``--keyed`` keyed ``GET /api/v2/auth/identity`` requests, each on a fresh connection, ``--gap-s`` apart;
2. attack: ``--attackers`` keyless connections each send ``--pipelined`` ``GET /api/v2/heartbeat`` in one send
   and never read their answers, while the same keyed requests run; then the attackers close;
3. after: the sidecar's memory once it has settled (2 s).

Prints, per phase, the keyed requests' statuses and latency p50/p99/max (ms; a request unanswered within 5 s
counts as 5000 ms and status -1) and the sidecar's resident memory (``VmRSS`` of /proc/<pid>/status, MiB):
before, peak during the attack (sampled every 50 ms), after. With ``--url`` the sidecar's ``--pid`` is needed
for the memory figures (on this machine). Traffic goes to 127.0.0.1 only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "evaluation"))  # memwarden_eval of this checkout (the harness)

from memwarden_eval.harness import start_chroma, start_sidecar  # noqa: E402
from sidecar.ledger import SQLiteLedger  # noqa: E402

HEARTBEAT = b"GET /api/v2/heartbeat HTTP/1.1\r\nHost: x\r\n\r\n"
KEYED_TIMEOUT_S = 5.0


def rss_mib(pid: int) -> float:
    """Resident memory of `pid` (``VmRSS``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass
class Phase:
    name: str
    statuses: dict[str, int] = field(default_factory=dict)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    rss_before_mib: float = 0.0
    rss_peak_mib: float = 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


async def keyed(port: int, key: str) -> tuple[int, float]:
    """One keyed request on a fresh connection: (status, or -1 when not answered within 5 s; seconds)."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), KEYED_TIMEOUT_S)
        try:
            writer.write(f"GET /api/v2/auth/identity HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n"
                         "Connection: close\r\n\r\n".encode())
            data = await asyncio.wait_for(reader.read(), KEYED_TIMEOUT_S - (time.monotonic() - started))
        finally:
            writer.close()
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
        return status, time.monotonic() - started
    except (OSError, asyncio.TimeoutError):
        return -1, KEYED_TIMEOUT_S


async def phase(name: str, port: int, key: str, pid: int | None, n: int, gap_s: float,
                attackers: int = 0, pipelined: int = 0) -> Phase:
    loop = asyncio.get_running_loop()
    out = Phase(name)
    out.rss_before_mib = out.rss_peak_mib = rss_mib(pid) if pid else 0.0
    sampling = True

    async def sample() -> None:
        while sampling and pid:
            out.rss_peak_mib = max(out.rss_peak_mib, rss_mib(pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.ensure_future(sample())
    socks: list[socket.socket] = []
    sends: list[asyncio.Future[None]] = []
    try:
        for _ in range(attackers):
            s = socket.socket()
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", port))
            socks.append(s)
        payload = HEARTBEAT * pipelined
        sends = [asyncio.ensure_future(loop.sock_sendall(s, payload)) for s in socks]
        latencies = []
        for _ in range(n):
            await asyncio.sleep(gap_s)
            status, seconds = await keyed(port, key)
            out.statuses[str(status)] = out.statuses.get(str(status), 0) + 1
            latencies.append(seconds * 1000)
        out.p50_ms, out.p99_ms, out.max_ms = percentile(latencies, 0.5), percentile(latencies, 0.99), max(latencies)
    finally:
        sampling = False
        await sampler
        for task in sends:
            task.cancel()
        for s in socks:
            s.close()
    return out


async def run(port: int, key: str, pid: int | None, args: argparse.Namespace) -> dict[str, object]:
    quiet = await phase("quiet", port, key, pid, args.keyed, args.gap_s)
    attack = await phase("attack", port, key, pid, args.keyed, args.gap_s, args.attackers, args.pipelined)
    await asyncio.sleep(2.0)
    after = rss_mib(pid) if pid else 0.0
    return {"attackers": args.attackers, "pipelined": args.pipelined, "quiet": asdict(quiet),
            "attack": asdict(attack), "rss_after_mib": after}


def report(result: dict[str, object]) -> None:
    print(f"slow-read attack: {result['attackers']} keyless connections x {result['pipelined']} pipelined heartbeats, "
          "never reading")
    for name in ("quiet", "attack"):
        p = result[name]
        assert isinstance(p, dict)
        print(f"  {name:6} keyed: statuses {p['statuses']}  p50 {p['p50_ms']:.1f} ms  p99 {p['p99_ms']:.1f} ms  "
              f"max {p['max_ms']:.1f} ms  | sidecar RSS before {p['rss_before_mib']:.0f} MiB, "
              f"peak {p['rss_peak_mib']:.0f} MiB")
    print(f"  after  sidecar RSS {result['rss_after_mib']:.0f} MiB (2 s after the attackers closed)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attackers", type=int, default=45)
    ap.add_argument("--pipelined", type=int, default=12_000)
    ap.add_argument("--keyed", type=int, default=40, help="keyed requests per phase")
    ap.add_argument("--gap-s", type=float, default=0.25, help="seconds between keyed requests")
    ap.add_argument("--url", help="an already started sidecar (else one is started with chroma)")
    ap.add_argument("--pid", type=int, help="with --url: the sidecar's process id, for the memory figures")
    ap.add_argument("--key", help="with --url: an agent key of that sidecar's ledger")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.url:
        if not args.key:
            ap.error("--url needs --key")
        port = urlsplit(args.url).port or 80
        result = asyncio.run(run(port, args.key, args.pid, args))
    else:
        with tempfile.TemporaryDirectory(prefix="memwarden-slowread-") as tmp:
            root = Path(tmp)
            chroma = start_chroma(root / "chroma", timeout_s=120)
            sidecar = None
            try:
                ledger = SQLiteLedger(root / "ledger.db")
                key = ledger.create_key("agent", "slowread", "f1", "a1", 1)[1]
                ledger.close()
                sidecar = start_sidecar(chroma.url, root / "ledger.db", ROOT / "policies", timeout_s=120, extra_env={
                    "MEMWARDEN_METRICS_PORT": "0", "MEMWARDEN_DECISION_LOG_SINK": "file",
                    "MEMWARDEN_DECISION_LOG_PATH": str(root / "decisions.jsonl"),
                    "MEMWARDEN_DECISION_LOG_MAX_BYTES": str(4 * 1024 * 1024), "MEMWARDEN_DECISION_LOG_BACKUPS": "1"})
                result = asyncio.run(run(sidecar.port, key, sidecar.proc.pid, args))
                result["sidecar_alive"] = sidecar.proc.poll() is None
            finally:
                if sidecar is not None:
                    sidecar.stop()
                chroma.stop()
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
