"""The sidecar in front of Chroma over TLS (issue 34, finding 10): ``MEMWARDEN_BACKEND_URL=https://…`` with
``MEMWARDEN_BACKEND_CA_BUNDLE``. The session's `chroma run` speaks plain HTTP; a small TLS-terminating proxy
(asyncio, its own thread) serves it on ``https://localhost:<port>`` with a certificate from a throw-away CA
(`tests.tls_certs`). A `memwarden serve` that trusts that CA serves the whole governed path (provision, add,
read back) through it, and so does `memwarden adopt`; one that trusts another CA answers 502 naming TLS verification; a missing bundle is
refused at start-up."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from memwarden_eval.harness import Server, start_sidecar
from tests.integration.conftest import POLICIES, Stack, unit_vectors
from tests.tls_certs import Certs, make_certs


class TlsTerminator:
    """TLS on 127.0.0.1 (server context `context`) in front of the plain HTTP server on 127.0.0.1:`target`: each
    accepted connection is piped both ways to a new connection to the target. `handshakes` counts the TLS
    connections accepted."""

    def __init__(self, context: object, target: int) -> None:
        self.target = target
        self.handshakes = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._pipe, "127.0.0.1", 0, ssl=context), self.loop).result(30)
        self.port = self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_chroma(chroma_server: Server, certs: Certs) -> Iterator[TlsTerminator]:
    proxy = TlsTerminator(certs.server_context(), chroma_server.port)
    yield proxy
    proxy.close()


def test_the_sidecar_serves_chroma_over_tls(chroma_server: Server, tls_chroma: TlsTerminator, certs: Certs,
                                            tmp_path: Path) -> None:
    sidecar = start_sidecar(f"https://localhost:{tls_chroma.port}", tmp_path / "ledger.db", POLICIES,
                            extra_env={"MEMWARDEN_BACKEND_CA_BUNDLE": str(certs.ca)})
    try:
        stack = Stack(chroma_server, sidecar, tmp_path / "ledger.db")
        before = tls_chroma.handshakes
        tenant = stack.tenant("tls")  # tenant, database and collection created through the sidecar
        agent = stack.key(tenant.name, fleet="f", agent="a", trust=1)
        coll = stack.client(agent, tenant.name).get_collection(tenant.collection)
        coll.add(ids=["m1"], documents=["over TLS"], embeddings=unit_vectors(1))
        got = coll.get(ids=["m1"], include=["documents"])
        assert got["ids"] == ["m1"] and got["documents"] == ["over TLS"]
        assert tls_chroma.handshakes > before  # the traffic went through the TLS proxy
        with stack.http() as http:  # ready: the backend's heartbeat answered over TLS
            ready = http.get("/_memwarden/readyz")
            assert (ready.status_code, ready.json()) == (200, {"ready": True})
        # `memwarden adopt` reads the backend with the same TLS settings
        rules = tmp_path / "rules.toml"
        rules.write_text(f'tenant = "{tenant.name}"\n[[collection]]\nname = "mem"\nowner = "f/a"\nscope = "fleet"\n')
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MEMWARDEN_")}
        command = [sys.executable, "-m", "sidecar.cli", "adopt", "chroma", "--rules", str(rules), "--dry-run",
                   "--format", "json", "--ledger", str(tmp_path / "ledger.db"),
                   "--backend-url", f"https://localhost:{tls_chroma.port}"]
        done = subprocess.run(command, env={**env, "MEMWARDEN_BACKEND_CA_BUNDLE": str(certs.ca)}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["scanned"] == 1
        done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0 and "ConnectError" in done.stderr  # the system's trust store: not this CA
    finally:
        sidecar.stop()


def test_a_backend_certificate_from_another_ca_is_a_502_naming_tls(chroma_server: Server, tls_chroma: TlsTerminator,
                                                                   certs: Certs, tmp_path: Path) -> None:
    sidecar = start_sidecar(f"https://localhost:{tls_chroma.port}", tmp_path / "ledger.db", POLICIES,
                            extra_env={"MEMWARDEN_BACKEND_CA_BUNDLE": str(certs.stranger_ca)})
    try:
        stack = Stack(chroma_server, sidecar, tmp_path / "ledger.db")
        admin = stack.key("tlsbad")
        with stack.http(admin) as http:
            r = http.get("/api/v2/tenants/tlsbad/databases/default_database/collections")
        assert r.status_code == 502
        assert "TLS verification failed" in r.json()["message"]
        assert "backend_tls_verification_failed" in sidecar.log.read_text()  # the reason, for the operator
    finally:
        sidecar.stop()


def test_a_missing_ca_bundle_is_refused_at_start_up(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MEMWARDEN_")}
    env.update(MEMWARDEN_BACKEND_URL="https://localhost:8443", MEMWARDEN_LEDGER_PATH=str(tmp_path / "ledger.db"),
               MEMWARDEN_BACKEND_CA_BUNDLE=str(tmp_path / "no-such-ca.pem"))
    done = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "MEMWARDEN_BACKEND_CA_BUNDLE" in done.stderr and "no such file" in done.stderr
