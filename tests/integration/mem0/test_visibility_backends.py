"""Each backend's translation of the one visibility predicate, run by the real backend: Chroma's ``where``
(`sidecar.backends.chroma.where_of`) through a real `chroma run`, Mem0's ``filters`` with ``OR``
(`sidecar.backends.mem0.or_of`) through the real `mem0ai` Memory behind our Mem0 REST server. Rows are written
straight into each backend with the metadata the sidecar stamps (`sidecar.backends.chroma.stamp`,
`Mem0Profile._stamp`); for every principal and mode, the ids the backend's filter selects must be exactly the rows
`Visibility.admits` admits (and those are checked against cedarpy by ``tests/property/test_visibility.py``)."""

from __future__ import annotations

import itertools
import uuid
from typing import Iterator

import pytest

from sidecar.backends.chroma import stamp, where_of
from sidecar.backends.mem0 import Mem0Profile, or_of
from sidecar.core.visibility import visibility
from sidecar.governance import Principal, Row
from memwarden_eval.harness import Server
from tests.integration.conftest import chroma_client, unit_vectors
from tests.integration.mem0.conftest import Mem0Stack

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
TENANTS = [f"vt{RUN}", f"vu{RUN}"]


def corpus() -> list[Row]:
    """Rows of every scope, of two tenants, two fleets, three owners, with and without a named reader."""
    t, u = TENANTS
    owners = [f"{t}/red/a", f"{t}/blue/b", f"{u}/red/a"]
    out: list[Row] = []
    for i, (owner, fleet, scope, readers) in enumerate(itertools.product(
            owners, ("red", "blue"), ("agent", "fleet", "tenant", "restricted"), ((), (f"{t}/red/c",)))):
        tenant = owner.split("/")[0]
        readers = tuple(r.replace(t + "/", tenant + "/") for r in readers)
        out.append(Row("chroma", "c", f"v{i}", tenant, fleet, owner, scope, owner, 1, "active", readers=readers))
    return out


PRINCIPALS = [Principal("agent", "k", TENANTS[0], fleet, agent, trust)
              for fleet, agent in (("red", "a"), ("red", "c"), ("blue", "b"), ("blue", "c")) for trust in (0, 1, 2, 3)] \
    + [Principal("admin", "k", TENANTS[0]), Principal("admin", "k", TENANTS[1]), Principal("operator", "k", "")]
CASES = [(p, mode) for p in PRINCIPALS for mode in ("scope", "tenant")]


def expected(rows: list[Row], p: Principal, mode: str) -> set[str]:
    v = visibility(p, mode)
    return {r.row_id for r in rows if v.admits(r.tenant, r.scope, r.fleet, r.owner, r.readers)}


def test_cases_are_not_degenerate() -> None:
    rows = corpus()
    sizes = {len(expected(rows, p, mode)) for p, mode in CASES}
    tenant_t = sum(1 for r in rows if r.tenant == TENANTS[0])
    assert 0 in sizes and tenant_t in sizes and len(sizes) > 4 and len(rows) not in sizes


@pytest.fixture(scope="module")
def chroma_rows(chroma_server: Server) -> Iterator[tuple[object, list[Row]]]:
    client = chroma_client(chroma_server.port, "default_tenant")
    col = client.create_collection(f"vis{RUN}")
    rows = corpus()
    col.add(ids=[r.row_id for r in rows], embeddings=unit_vectors(len(rows)),
            metadatas=[stamp({"n": i}, r) for i, r in enumerate(rows)])
    yield col, rows
    client.delete_collection(f"vis{RUN}")


@pytest.mark.parametrize("p,mode", CASES, ids=[f"{p.kind}-{p.fleet}-{p.agent}-{p.trust}-{p.tenant[:2]}-{m}" for p, m in CASES])
def test_chroma_where_selects_what_the_predicate_admits(chroma_rows: tuple[object, list[Row]], p: Principal,
                                                         mode: str) -> None:
    col, rows = chroma_rows
    got = set(col.get(where=where_of(visibility(p, mode)), include=[])["ids"])  # type: ignore[attr-defined]
    assert got == expected(rows, p, mode)


@pytest.fixture(scope="module")
def mem0_rows(mem0_stack: Mem0Stack) -> Iterator[tuple[Mem0Stack, dict[str, str], list[Row]]]:
    """The corpus as Mem0 memories (``infer=false``, ``agent_id`` the owner), stamped as the sidecar stamps them;
    row id → Mem0 memory id."""
    rows = corpus()
    ids: dict[str, str] = {}
    with mem0_stack.direct() as h:
        for r in rows:
            resp = h.post("/memories", json={"messages": [{"role": "user", "content": f"visibility fact {r.row_id}"}],
                                             "agent_id": r.owner, "infer": False,
                                             "metadata": Mem0Profile._stamp({}, r)})
            assert resp.status_code == 200, resp.text
            ids[resp.json()["results"][0]["id"]] = r.row_id
    yield mem0_stack, ids, rows


@pytest.mark.parametrize("p,mode", CASES, ids=[f"{p.kind}-{p.fleet}-{p.agent}-{p.trust}-{p.tenant[:2]}-{m}" for p, m in CASES])
def test_mem0_filters_select_what_the_predicate_admits(mem0_rows: tuple[Mem0Stack, dict[str, str], list[Row]],
                                                       p: Principal, mode: str) -> None:
    stack, ids, rows = mem0_rows
    v = visibility(p, mode)
    filters: dict[str, object] = {"agent_id": "*", "mw_tenant": v.tenant}
    ors = or_of(v)
    if ors is not None:
        filters["OR"] = ors
    with stack.direct() as h:
        resp = h.post("/search", json={"query": "visibility fact", "filters": filters, "top_k": 500})
    assert resp.status_code == 200, resp.text
    got = {ids[m["id"]] for m in resp.json()["results"] if m["id"] in ids}
    assert got == expected(rows, p, mode)
