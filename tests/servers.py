"""The session's real servers, shared by every test directory (registered by tests/conftest.py, so that
tests/integration, tests/stateful and the conformance suite use one `chroma run`, one Mem0 REST server and one
sidecar in front of each per session, not one per directory)."""

from __future__ import annotations

from typing import Iterator

import pytest

from memwarden_eval.harness import Server, start_chroma, start_mem0, start_sidecar
from tests.integration.conftest import POLICIES, Stack, _start_stack
from tests.integration.mem0.conftest import MEM0_KEY, Mem0Stack, sidecar_env


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_chroma(tmp_path_factory.mktemp("chroma") / "data")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[Stack]:
    s, _ = _start_stack(tmp_path_factory.mktemp("stack"), chroma_server)
    yield s
    s.sidecar.stop()


@pytest.fixture(scope="session")
def mem0_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_mem0(tmp_path_factory.mktemp("mem0") / "data", MEM0_KEY)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mem0_stack(tmp_path_factory: pytest.TempPathFactory, mem0_server: Server) -> Iterator[Mem0Stack]:
    tmp = tmp_path_factory.mktemp("mem0stack")
    sidecar = start_sidecar(mem0_server.url, tmp / "ledger.db", POLICIES, extra_env=sidecar_env())
    yield Mem0Stack(mem0_server, sidecar, tmp / "ledger.db")
    sidecar.stop()
