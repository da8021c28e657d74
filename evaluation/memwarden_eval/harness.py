"""Start and stop real servers on 127.0.0.1: `chroma run` and the sidecar (used by the demo, tests, bench).

Each server is a subprocess on a free port; `start_*` waits until it answers and raises
RuntimeError (with the tail of its log) if it does not within `timeout_s` seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> str | None:
    """Why `port` on `host` cannot be listened on (e.g. ``[Errno 98] Address already in use``), or None when
    it can. Bound with ``SO_REUSEADDR`` as uvicorn and Chroma bind, so a port in TIME_WAIT counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return str(exc)
    return None


@dataclass
class Server:
    """A running subprocess serving HTTP at `url`; its output goes to `log`."""

    name: str
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_url: str | None = None  # the sidecar's Prometheus listener
    data_dir: Path | None = None  # where a backend keeps its data (`chroma run --path`, the Mem0 server's --data)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def readiness(self) -> httpx.Response:
        """``/_memwarden/readyz`` on the sidecar's metrics (operator) listener: the details (checks, policy
        set, reload errors, mode) that the API port shows only to an operator key."""
        if self.metrics_url is None:
            raise RuntimeError(f"{self.name} has no metrics listener")
        return httpx.get(self.metrics_url.rsplit("/", 1)[0] + "/_memwarden/readyz", timeout=30.0, trust_env=False)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _wait(server: Server, path: str, timeout_s: float, headers: dict[str, str] | None = None,
          verify: ssl.SSLContext | bool = True) -> Server:
    """`server` once `path` answers below 500; a server that exits, does not answer within `timeout_s`, or
    whose start is interrupted (Ctrl-C, a signal handler raising) is stopped before the error propagates.
    `verify`: the TLS client context for an ``https`` server (its CA, and a client certificate for mTLS)."""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:  # its whole start-up output: a refusal lists every problem
                raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail(100_000)}")
            try:
                r = httpx.get(server.url + path, timeout=2.0, headers=headers, trust_env=False, verify=verify)
                if r.status_code < 500:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{server.name} did not start within {timeout_s}s:\n{server.log_tail()}")
    except BaseException:
        server.stop()
        raise


def chroma_executable() -> str:
    exe = Path(sys.executable).with_name("chroma")
    if exe.exists():
        return str(exe)
    found = shutil.which("chroma")
    if not found:
        raise RuntimeError("the `chroma` command is not installed (pip install chromadb)")
    return found


def start_chroma(data_dir: Path, port: int | None = None, timeout_s: float = 60.0, allow_reset: bool = False) -> Server:
    """`chroma run --host 127.0.0.1 --port P --path data_dir`; with `allow_reset`, a config file that
    enables Chroma's ``/api/v2/reset`` (off by default in Chroma)."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / f"chroma-{port}.log"
    fh = open(log, "wb")
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    args = ["--host", "127.0.0.1", "--port", str(port), "--path", str(data_dir)]
    if allow_reset:
        config = data_dir.parent / f"chroma-{port}.yaml"
        config.write_text(f'persist_path: "{data_dir}"\nport: {port}\nlisten_address: "127.0.0.1"\nallow_reset: true\n')
        args = [str(config)]
    proc = subprocess.Popen(
        [chroma_executable(), "run", *args],
        stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    return _wait(Server("chroma", f"http://127.0.0.1:{port}", port, proc, log, data_dir=data_dir), "/api/v2/heartbeat", timeout_s)


def start_sidecar(backend_url: str, ledger_path: Path, policies_dir: Path, port: int | None = None,
                  timeout_s: float = 60.0, extra_env: dict[str, str] | None = None,
                  nofile: int | None = None, tls_client: ssl.SSLContext | None = None) -> Server:
    """`memwarden serve` (this interpreter) in front of `backend_url`; `nofile` caps its open file
    descriptors (RLIMIT_NOFILE), as a small container would. `tls_client`: the sidecar serves HTTPS
    (``MEMWARDEN_TLS_*`` in `extra_env`) and this client context trusts it (and, for mTLS, presents a client
    certificate): the server's url is ``https://``."""
    port = port or free_port()
    log = ledger_path.parent / f"sidecar-{port}.log"
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(log, "wb")
    env = {**os.environ, "MEMWARDEN_BACKEND_URL": backend_url, "MEMWARDEN_LEDGER_PATH": str(ledger_path),
           "MEMWARDEN_POLICIES_DIR": str(policies_dir), "MEMWARDEN_METRICS_HOST": "127.0.0.1",
           "MEMWARDEN_METRICS_PORT": str(free_port()),
           # stopped at once on SIGTERM (`Server.stop`) unless the caller's environment asks for a drain
           "MEMWARDEN_SHUTDOWN_DRAIN_S": os.environ.get("MEMWARDEN_SHUTDOWN_DRAIN_S", "0"), **(extra_env or {})}
    metrics_port = int(env["MEMWARDEN_METRICS_PORT"])

    def limit() -> None:
        if nofile is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=limit if nofile else None,
    )
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
    scheme = "https" if tls_client is not None else "http"
    return _wait(Server("sidecar", f"{scheme}://127.0.0.1:{port}", port, proc, log, metrics_url), "/_memwarden/healthz",
                 timeout_s, verify=tls_client if tls_client is not None else True)


def start_mem0(data_dir: Path, api_key: str, port: int | None = None, timeout_s: float = 120.0,
               history_db: str | None = None) -> Server:
    """Our Mem0-REST-compatible test server (memwarden_eval.mem0_server: the real `mem0ai` `Memory`, infer=False,
    Qdrant local mode, offline all-MiniLM-L6-v2) on 127.0.0.1, authenticated by `api_key` (X-API-Key);
    `history_db` is Mem0's ``history_db_path`` (default ``data_dir/history.db``; ``:memory:`` = not on disk)."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / f"mem0-{port}.log"
    fh = open(log, "wb")
    env = {**os.environ, "MEM0_TELEMETRY": "False", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "MEM0_ADMIN_API_KEY": api_key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memwarden_eval.mem0_server", "--host", "127.0.0.1", "--port", str(port), "--data", str(data_dir)]
        + (["--history-db", history_db] if history_db else []),
        # cwd: the directory holding memwarden_eval, so `-m` finds it in a checkout that did not install it
        stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=str(Path(__file__).resolve().parents[1]),
    )
    return _wait(Server("mem0", f"http://127.0.0.1:{port}", port, proc, log, data_dir=data_dir), "/api/health", timeout_s)
