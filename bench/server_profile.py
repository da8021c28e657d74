"""Instructions per request of the whole server process at C concurrent clients (a script, not a test).

`bench/request_profile.py` drives the app over ASGI in one process; this drives a real listener instead:
the HTTP server stack of ``memwarden serve`` (uvicorn, httptools, uvloop, `sidecar.server.guarded_protocol`)
in this process, in front of the sidecar (``--mode sidecar``: `sidecar.app.create_app` with
`request_profile`'s settings), `bench/core_passthrough.py`'s ungoverned app (``--mode core``) or
`bench/passthrough.py`'s raw relay (``--mode passthrough``), with a client in a child process (callgrind does
not follow it) holding `--clients` keep-alive connections and sending `--warm` then `--n` requests in all
(gets of one id, or ``--op q10`` queries, bodies as in `request_profile`), each connection one request at a
time. The process exits when the client has its last answer, so two runs' totals differ by what the extra
requests cost, the server's reads, writes and event-loop turns included:

    .venv/bin/python bench/request_profile.py setup DIR          # once: Chroma data, ledger, keys
    valgrind --tool=callgrind --callgrind-out-file=F100 .venv/bin/python bench/server_profile.py DIR --n 100
    valgrind --tool=callgrind --callgrind-out-file=F600 .venv/bin/python bench/server_profile.py DIR --n 600
    # per request: (I refs of F600 - I refs of F100) / 500

With ``--syscalls`` (not under valgrind) it prints the system calls of the measured requests instead, counted
by ``strace -f -c`` attached to this process after the warm-up; with ``--cycles``, the objects per request the
measured requests left in reference cycles (only the cyclic garbage collector frees them), by type.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POLICIES = HERE.parent / "policies"


def bodies(state: dict[str, Any], op: str) -> tuple[str, list[bytes]]:
    rnd = random.Random(7)
    cid = state["collection"]
    if op == "get":
        return (f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}/get",
                [json.dumps({"ids": [state["ids"][rnd.randrange(len(state["ids"]))]], "include": ["documents", "metadatas"]},
                            separators=(",", ":")).encode() for _ in range(500)])
    return (f"/api/v2/tenants/bench/databases/benchdb/collections/{cid}/query",
            [json.dumps({"query_embeddings": [[round(rnd.uniform(-1, 1), 6) for _ in range(state.get("dim", 384))]],
                         "n_results": 10, "include": ["documents", "metadatas", "distances"]},
                        separators=(",", ":")).encode() for _ in range(200)])


async def client(port: int, path: str, key: str, body_list: list[bytes], clients: int, total: int, warm: int,
                 marker: Path | None) -> None:
    """`total` requests over `clients` connections; after the first `warm` answers, `marker` is written."""
    sent = [0]
    done = [0]
    warmed = asyncio.Event()
    if warm == 0:
        warmed.set()
    head = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nuser-agent: wrk\r\naccept: */*\r\n"
            "content-type: application/json\r\n" + (f"x-api-key: {key}\r\n" if key else "")).encode()

    async def one_conn() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while sent[0] < total:
            i = sent[0]
            sent[0] += 1
            if i >= warm:
                await warmed.wait()
            body = body_list[i % len(body_list)]
            writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
            resp = await reader.readuntil(b"\r\n\r\n")
            status = int(resp.split(b" ", 2)[1])
            length = 0
            for line in resp.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            payload = await reader.readexactly(length)
            if status != 200:
                raise RuntimeError(f"{status}: {payload[:300]!r}")
            done[0] += 1
            if done[0] == warm:
                if marker is not None:
                    marker.write_text("warm")
                    while marker.exists():  # the strace attach (``--syscalls``) removes it when it runs
                        await asyncio.sleep(0.05)
                warmed.set()
        writer.close()

    await asyncio.gather(*(one_conn() for _ in range(clients)))


async def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from memwarden_eval.harness import start_chroma
    from sidecar.server import ConnectionLimits, guarded_protocol

    root: Path = args.dir
    state = json.loads((root / "state.json").read_text())
    path, body_list = bodies(state, args.op)
    (root / "server-profile-bodies.json").write_text(json.dumps([b.decode() for b in body_list]))
    chroma = start_chroma(root / "chroma")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    key = ""
    passthrough_server = None
    try:
        if args.mode == "sidecar":
            from sidecar.app import create_app
            from sidecar.config import Settings

            settings = Settings(backend_url=chroma.url, ledger_path=root / "ledger.db", ledger_url=state.get("ledger_url"),
                                policies_dir=POLICIES, reconcile_interval_s=0, policy_watch_interval_s=0,
                                decision_log_sink="file", decision_log_path=root / "decisions.jsonl",
                                ledger_cache_ttl_s=3600)
            app = create_app(settings)
            app.state.services.upstream._transport._expiry = 3600.0
            key = state["agent"]
        elif args.mode == "core":
            sys.path.insert(0, str(HERE))
            import core_passthrough

            from sidecar.stages.forward import Upstream

            upstream = Upstream(chroma.url, timeout_s=30.0, max_connections=64)
            upstream._transport._expiry = 3600.0  # type: ignore[attr-defined]
            app = core_passthrough.app_for(upstream)
        else:
            sys.path.insert(0, str(HERE))
            import passthrough

            app = None
        cmd = [sys.executable, str(Path(__file__).resolve()), str(root), "--client", str(port), "--path", path,
               "--key", key, "--n", str(args.n), "--warm", str(args.warm), "--clients", str(args.clients),
               "--op", args.op]
        if args.syscalls or args.cycles:
            cmd += ["--marker", str(root / "server-profile-warm")]
        if app is not None:
            config = uvicorn.Config(app, log_level="warning", access_log=False, http=guarded_protocol(ConnectionLimits()),
                                    proxy_headers=False, server_header=False, lifespan="on", loop="uvloop",
                                    timeout_keep_alive=5)
            server = uvicorn.Server(config)
            server_task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started:
                await asyncio.sleep(0.01)
        else:
            host, _, cport = chroma.url.removeprefix("http://").rpartition(":")
            passthrough_server = await asyncio.start_server(lambda r, w: passthrough.serve(host, int(cport), r, w), sock=sock)
        proc = await asyncio.create_subprocess_exec(*cmd, env={k: v for k, v in os.environ.items() if not k.startswith("LD_PRELOAD")})
        strace = None
        if args.syscalls:
            marker = root / "server-profile-warm"
            while not marker.exists():
                await asyncio.sleep(0.05)
            out = root / "server-profile-strace.txt"
            strace = subprocess.Popen(["strace", "-f", "-c", "-o", str(out), "-p", str(os.getpid())])
            await asyncio.sleep(1.0)
            marker.unlink()
        if args.cycles:
            marker = root / "server-profile-warm"
            while not marker.exists():
                await asyncio.sleep(0.001)
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            marker.unlink()
        rc = await proc.wait()
        if strace is not None:
            strace.send_signal(2)
            strace.wait()
            print(out.read_text())
        if rc != 0:
            raise SystemExit(f"client failed: {rc}")
        if args.cycles:
            gc.collect()
            gc.set_debug(0)
            kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
            print(f"objects left in reference cycles per request: {len(gc.garbage) / args.n:.2f}")
            for kind, count in kinds.most_common(30):
                print(f"  {count / args.n:7.2f} {kind}")
            gc.garbage.clear()
        if app is not None:
            server.should_exit = True
            await server_task
        else:
            passthrough_server.close()
    finally:
        chroma.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--mode", choices=["sidecar", "core", "passthrough"], default="sidecar")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--op", choices=["get", "q10"], default="get")
    ap.add_argument("--syscalls", action="store_true")
    ap.add_argument("--cycles", action="store_true")
    ap.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default="", help=argparse.SUPPRESS)
    ap.add_argument("--key", default="", help=argparse.SUPPRESS)
    ap.add_argument("--marker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client is not None:
        body_list = [b.encode() for b in json.loads((args.dir / "server-profile-bodies.json").read_text())]
        asyncio.run(client(args.client, args.path, args.key, body_list, args.clients, args.warm + args.n, args.warm,
                           args.marker))
        return
    import uvloop

    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
