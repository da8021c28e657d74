"""The Mem0 profile's reads on a PostgreSQL ledger, where they read the ledger in one trip off the event loop
(`Authorizer.prefetch` before each batch of get, list, search and history): the conformance suite's reads
(tests/conformance, cedarpy as the oracle) and the search refill of `test_mem0_profile` run again here against a
sidecar whose ledger is a fresh PostgreSQL schema."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger.postgres import PostgresLedger
from tests.integration.conftest import POLICIES
from tests.integration.mem0.conftest import Mem0Stack, sidecar_env
from tests.conformance.corpus import PRINCIPALS
from tests.conformance.drivers import Mem0Driver, World
from tests.conformance import test_conformance as conformance
from tests.integration.mem0.test_mem0_profile import test_search_refills_to_top_k, world  # noqa: F401
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


class PgMem0Stack(Mem0Stack):
    url: str = ""
    schema: str = ""

    def key(self, tenant: str, fleet: str | None = None, agent: str | None = None, trust: int = 0) -> str:
        ledger = PostgresLedger(self.url, schema=self.schema, min_size=0, max_size=1)
        try:
            _, plaintext = ledger.create_key("agent" if agent else "admin", tenant, fleet, agent, trust)
        finally:
            ledger.close()
        return plaintext


@pytest.fixture(scope="module")
def mem0_stack(tmp_path_factory: pytest.TempPathFactory, mem0_server: Server, pg_url: str) -> Iterator[Mem0Stack]:  # noqa: F811
    tmp: Path = tmp_path_factory.mktemp("mem0pg")
    schema = fresh_schema()
    sidecar = start_sidecar(mem0_server.url, tmp / "unused.db", POLICIES, extra_env=sidecar_env({
        "MEMWARDEN_LEDGER_URL": pg_url, "MEMWARDEN_LEDGER_SCHEMA": schema, "MEMWARDEN_LEDGER_POOL_MIN": "0",
        "MEMWARDEN_LEDGER_POOL_MAX": "2", "MEMWARDEN_POLICY_WATCH_INTERVAL_S": "0"}))
    stack = PgMem0Stack(mem0_server, sidecar, tmp / "unused.db")
    stack.url, stack.schema = pg_url, schema
    try:
        yield stack
    finally:
        sidecar.stop()
    assert not (tmp / "unused.db").exists()


@pytest.fixture(scope="module")
def conformance_world(mem0_stack: Mem0Stack) -> World:
    return Mem0Driver(mem0_stack).world("pgconf")


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_conformance_reads_on_postgres(mem0_stack: Mem0Stack, conformance_world: World, principal: str) -> None:
    conformance.test_every_read_path_serves_what_cedar_allows(Mem0Driver(mem0_stack), conformance_world, principal)


def test_reads_make_one_ledger_trip_per_batch(mem0_stack: Mem0Stack, world: tuple) -> None:  # noqa: F811
    """get, list and search read the ledger through `read_rows` (one statement per batch), never row by row
    on the event loop (`get_rows` / `agent_entities` of their own)."""
    from tests.integration.test_ledger_one_trip import ledger_calls

    w, ids = world
    with mem0_stack.http(w.keys["b1"]) as h:
        h.get("/memories")  # warms the caches (keys, listing keys) before counting
        before = ledger_calls(mem0_stack.sidecar)
        assert h.get(f"/memories/{next(iter(ids.values()))}").status_code in (200, 404)
        assert h.get("/memories").status_code == 200
        assert h.post("/search", json={"query": "budget", "top_k": 3, "threshold": 0.0}).status_code == 200
        after = ledger_calls(mem0_stack.sidecar)
    delta = {m: after.get(m, 0) - before.get(m, 0) for m in after if after.get(m, 0) != before.get(m, 0)}
    assert delta.get("read_rows", 0) >= 3 and "get_rows" not in delta and "agent_entities" not in delta, delta
