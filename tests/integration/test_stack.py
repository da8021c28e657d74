"""`memwarden-eval stack` (`make serve`) as real processes: a taken port stops it before anything starts or any
key is printed, and SIGTERM stops its Chroma and sidecar exactly as Ctrl-C (SIGINT) does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from memwarden_eval.harness import free_port

pytestmark = pytest.mark.integration


def _default_sigint() -> None:
    """In the child before it runs: SIGINT's default action. A shell starts a background job (``pytest ... &``,
    ``nohup``) with SIGINT ignored, the child would inherit that across exec, and Python leaves an ignored
    SIGINT ignored, so Ctrl-C's signal would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stack(workdir: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")}
    return subprocess.Popen([sys.executable, "-m", "memwarden_eval.cli", "stack", "--workdir", str(workdir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_default_sigint)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port someone else listens on (on every address, as a server of another user might)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("option", ["--port", "--chroma-port"])
def test_a_taken_port_fails_before_keys_are_made(tmp_path: Path, taken_port: int, option: str) -> None:
    other = "--chroma-port" if option == "--port" else "--port"
    proc = _stack(tmp_path / "stack", option, str(taken_port), other, str(free_port()))
    out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, errs)
    lines = errs.strip().splitlines()
    assert len(lines) == 1, errs
    assert f"port {taken_port}" in lines[0] and "not free" in lines[0] and option in lines[0], lines[0]
    assert "mwk_" not in out + errs and "key" not in out.lower()
    # Nothing was started or provisioned: no Chroma data directory, no ledger with keys.
    assert not (tmp_path / "stack" / "chroma").exists() and not (tmp_path / "stack" / "ledger.db").exists()


def _children(pid: int) -> list[int]:
    """Direct child processes of `pid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_chroma_and_the_sidecar(tmp_path: Path, sig: signal.Signals) -> None:
    port, chroma_port = free_port(), free_port()
    proc = _stack(tmp_path / "stack", "--port", str(port), "--chroma-port", str(chroma_port))
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 180
        while not any("stops both" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, (lines, proc.stderr.read() if proc.stderr else "")
            lines.append(line)
            assert time.monotonic() < deadline, lines
        text = "".join(lines)
        assert f"http://127.0.0.1:{port}" in text and f"http://127.0.0.1:{chroma_port}" in text
        agent_key = next(line for line in lines if line.startswith("agent key")).split()[-1]
        assert agent_key.startswith("mwk_")
        with httpx.Client(trust_env=False, timeout=10) as http:
            assert http.get(f"http://127.0.0.1:{chroma_port}/api/v2/heartbeat").status_code == 200
            me = http.get(f"http://127.0.0.1:{port}/api/v2/auth/identity", headers={"X-API-Key": agent_key})
            assert me.status_code == 200, me.text
        children = _children(proc.pid)
        assert len(children) == 2 and all(_alive(c) for c in children), children
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        assert not any(_alive(c) for c in children)
        for p in (port, chroma_port):
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://127.0.0.1:{p}/", timeout=2, trust_env=False)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
