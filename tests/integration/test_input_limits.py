"""Bad input is a 400/413 naming the problem, and nothing reaches Chroma (checked on Chroma directly).

Each body below made the sidecar answer 500 or 502 before: numbers Python reads as infinity (1e999)
or Chroma cannot store (2^70), lone surrogates, hundreds of nested or listed ``$and``, 100k ids.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


def nested_and(depth: int) -> str:
    where = '{"k":{"$eq":1}}'
    for _ in range(depth):
        where = '{"$and":[' + where + ',{"k":{"$eq":1}}]}'
    return where


CASES = [
    ("add", '{"ids":["r1"],"embeddings":[[1e999,0.5]],"documents":["x"]}', 400, "finite"),
    ("add", '{"ids":["r1"],"embeddings":[[0.1,0.5]],"documents":["x"],"metadatas":[{"n":1180591620717411303424}]}', 400, "64-bit"),
    ("add", '{"ids":["r1"],"embeddings":[[0.1,0.5]],"documents":["bad \\ud800 text"]}', 400, "surrogate"),
    ("add", '{"ids":["r1"],"embeddings":[[0.1,0.5]],"documents":["x"],"metadatas":[{"\\udfff":1}]}', 400, "surrogate"),
    ("add", '{"ids":["r1"],"embeddings":[[NaN,0.5]],"documents":["x"]}', 400, "NaN"),
    ("get", '{"where":' + nested_and(300) + '}', 400, "MEMWARDEN_MAX_JSON_DEPTH"),
    ("get", '{"where":{"$and":[' + ",".join('{"k%d":{"$eq":1}}' % i for i in range(400)) + ']}}', 400, "MEMWARDEN_MAX_FILTER_CLAUSES"),
    ("query", '{"query_embeddings":[[0.1,0.5]],"where":' + nested_and(100) + '}', 400, "MEMWARDEN_MAX_JSON_DEPTH"),
    ("delete", '{"where":{"$or":[' + ",".join('{"k%d":{"$eq":1}}' % i for i in range(400)) + ']}}', 400, "MEMWARDEN_MAX_FILTER_CLAUSES"),
    ("get", json.dumps({"ids": [f"id-{i}" for i in range(100_000)]}), 413, "MEMWARDEN_MAX_IDS"),
]


@pytest.mark.parametrize("op,body,status,names", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_refused_and_nothing_is_forwarded(stack: Stack, op: str, body: str, status: int, names: str) -> None:
    t = stack.tenant("lim")
    key = stack.key(t.name, "f1", "a1", 1)
    path = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}/{op}"
    with stack.http(key) as h:
        r = h.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == status, r.text[:300]
    assert names in r.json()["message"]
    assert stack.direct(t.name).get_collection(t.collection).count() == 0  # nothing was written
