"""Mem0 profile: bad input is a 400 naming the limit, nothing is forwarded, and a memory nested too
deep for Mem0 to serve can no longer be written — before, one such memory (300 levels of metadata,
written by a trust-1 agent) made every agent's ``GET /memories`` and search in the tenant answer 502."""

from __future__ import annotations

import pytest

from tests.integration.mem0.conftest import Mem0Stack

pytestmark = pytest.mark.integration


def deep_metadata(levels: int) -> dict[str, object]:
    value: object = "leaf"
    for _ in range(levels):
        value = {"d": value}
    return {"mw_scope": "tenant", "n": value}


def test_deep_metadata_is_refused_and_lists_keep_working(mem0_stack: Mem0Stack) -> None:
    w = mem0_stack.world([("f1", "writer", 1), ("f2", "reader", 1)], prefix="deep")
    fine = mem0_stack.add(w.keys["reader"], "a fine tenant memory", metadata={"mw_scope": "tenant"})
    with mem0_stack.http(w.keys["writer"]) as h:
        r = h.post("/memories", json={"messages": [{"role": "user", "content": "deep memory"}], "infer": False,
                                      "metadata": deep_metadata(300)})
    assert r.status_code == 400 and "MEMWARDEN_MAX_JSON_DEPTH" in r.json()["message"], r.text
    with mem0_stack.direct() as d:  # nothing reached Mem0
        assert not [m for m in d.get("/memories", params={"agent_id": w.uid("writer")}).json()["results"]]
    for agent in ("writer", "reader"):
        with mem0_stack.http(w.keys[agent]) as h:
            listed = h.get("/memories")
            found = h.post("/search", json={"query": "fine tenant memory"})
        assert listed.status_code == 200 and fine in [m["id"] for m in listed.json()["results"]], listed.text
        assert found.status_code == 200 and fine in [m["id"] for m in found.json()["results"]], found.text


@pytest.mark.parametrize("path,body,names", [
    ("/memories", '{"messages":[{"role":"user","content":"x"}],"infer":false,"metadata":{"n":1e999}}', "finite"),
    ("/memories", '{"messages":[{"role":"user","content":"lone \\ud800"}],"infer":false}', "surrogate"),
    ("/search", '{"query":"x","filters":{"AND":[' + ",".join('{"k%d":1}' % i for i in range(400)) + ']}}',
     "MEMWARDEN_MAX_FILTER_CLAUSES"),
])
def test_bad_input_is_a_400_naming_it(mem0_stack: Mem0Stack, path: str, body: str, names: str) -> None:
    w = mem0_stack.world([("f1", "a", 1)], prefix="bad")
    with mem0_stack.http(w.keys["a"]) as h:
        r = h.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400 and names in r.json()["message"], r.text
    with mem0_stack.direct() as d:
        assert d.get("/memories", params={"agent_id": w.uid("a")}).json()["results"] == []
