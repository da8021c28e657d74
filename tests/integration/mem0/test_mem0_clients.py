"""Which Mem0 clients work through the sidecar. mem0ai's `MemoryClient` speaks Mem0's hosted Platform API
(``Authorization: Token``, ``/v1/ping/``, ``/v3/memories/add/``, ``/v3/memories/search/``, … — mem0ai
``mem0/client/main.py``), not the self-hosted REST server's (``X-API-Key``, ``/memories``, ``/search``), so it
cannot talk to a self-hosted Mem0, with or without memwarden: it fails at construction and nothing is forwarded.
Raw HTTP to the REST API works (here with httpx, as the rest of tests/integration/mem0 does)."""

from __future__ import annotations

import os

import pytest

from tests.integration.mem0.conftest import Mem0Stack

pytestmark = pytest.mark.integration


def test_memory_client_speaks_the_platform_api_not_the_rest_server(mem0_stack: Mem0Stack) -> None:
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    from mem0 import MemoryClient

    w = mem0_stack.world([("red", "a1", 1)], prefix="cli")
    with pytest.raises(Exception):
        MemoryClient(api_key=w.keys["a1"], host=mem0_stack.sidecar.url)
    with mem0_stack.http(w.keys["a1"]) as h:
        # its first call, with a valid memwarden key: not a route of the Mem0 REST server, never forwarded
        assert h.get("/v1/ping/").status_code == 404
        assert h.post("/v3/memories/add/", json={"messages": [{"role": "user", "content": "x"}]}).status_code == 404


def test_raw_http_to_the_rest_api_works(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("red", "a1", 1), ("blue", "b1", 1)], prefix="raw")
    mid = mem0_stack.add(w.keys["a1"], "raw http clients keep working", user_id="u1", metadata={"mw_scope": "agent"})
    with mem0_stack.http(w.keys["a1"]) as h:
        assert h.get(f"/memories/{mid}").json()["memory"] == "raw http clients keep working"
        hits = h.post("/search", json={"query": "raw http clients", "user_id": "u1", "top_k": 5}).json()["results"]
        assert mid in {r["id"] for r in hits}
    with mem0_stack.http(w.keys["b1"]) as h:
        assert h.get(f"/memories/{mid}").status_code == 404
