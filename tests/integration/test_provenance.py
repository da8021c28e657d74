"""Supersession, lineage closure, forgotten content and crash-safe tombstones through the real sidecar."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from memwarden_eval.harness import start_chroma, start_sidecar
from tests.integration.conftest import POLICIES, Stack, Tenant, unit_vectors

pytestmark = pytest.mark.integration
V = unit_vectors(8, seed=21)


def data(t: Tenant, op: str, query: str = "") -> str:
    return f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}/{op}{query}"


def fact(row_id: str, obj: str, scope: str = "fleet", i: int = 0) -> dict:
    return {"ids": [row_id], "embeddings": [V[i]], "documents": [f"service api is {obj} ({row_id})"],
            "metadatas": [{"mw_scope": scope, "mw_subject": "svc-api", "mw_predicate": "status", "mw_object": obj}]}


def new_world(stack: Stack) -> Tenant:
    t = stack.tenant("prov")
    for name, fleet, trust in (("w", "red", 1), ("peer", "red", 1), ("blue", "blue", 1), ("boss", "red", 3)):
        t.keys[name] = stack.key(t.name, fleet, name, trust)
    return t


@pytest.fixture(scope="module")
def world(stack: Stack) -> Tenant:
    return new_world(stack)


@pytest.fixture()
def own_world(stack: Stack) -> Tenant:
    """A tenant of the test's own, for a test that must not depend on rows other tests of the module wrote
    (the suite passes in any order and under any ``-k`` selection)."""
    return new_world(stack)


def test_single_valued_fact_supersedes_and_history_is_opt_in(stack: Stack, own_world: Tenant) -> None:
    world = own_world  # counts the collection's rows: none of other tests
    with stack.http(world.keys["w"]) as http:
        assert http.post(data(world, "add"), json=fact("s1", "paused")).status_code == 200
        assert http.post(data(world, "add"), json=fact("s2", "running", i=1)).status_code == 200
        current = http.post(data(world, "get"), json={"where": {"mw_subject": "svc-api"}}).json()
        assert current["ids"] == ["s2"] and current["metadatas"][0]["mw_supersedes_id"] == "s1"
        both = http.post(data(world, "get", "?include_superseded=true"), json={"where": {"mw_subject": "svc-api"}}).json()
        assert sorted(both["ids"]) == ["s1", "s2"]
        assert dict(zip(both["ids"], both["metadatas"]))["s1"]["mw_superseded_by"] == "s2"
        q = http.post(data(world, "query"), json={"query_embeddings": [V[0]], "n_results": 5}).json()
        assert "s1" not in q["ids"][0] and "s2" in q["ids"][0]
        assert http.get(data(world, "count")).json() == 1
        # as_of a time before s2 existed shows s1 as the fact then
        s2_created = current["metadatas"][0]["mw_created_at"]
        then = http.post(data(world, "get", f"?as_of={s2_created - 1}"), json={"where": {"mw_subject": "svc-api"}}).json()
        assert then["ids"] == ["s1"]
        assert http.post(data(world, "get", "?include_superseded=maybe"), json={}).status_code == 400


def test_supersession_is_per_partition_and_no_oracle(stack: Stack, own_world: Tenant) -> None:
    """Before, blue's write of the (subject, predicate) of red's fleet fact answered 403 while an unused
    pair answered 200 (an oracle for a fact blue cannot read), and the first writer of a fact held it for
    the whole tenant. Now a fact is single-valued within its visibility partition."""
    world = own_world
    with stack.http(world.keys["w"]) as http:  # red's fleet fact, which blue cannot read
        assert http.post(data(world, "add"), json=fact("s2", "running", i=1)).status_code == 200
    with stack.http(world.keys["blue"]) as http:  # blue cannot read red's fleet fact s2: its own fleet is another partition
        taken = http.post(data(world, "add"), json=fact("b-0", "deleted", i=2)).status_code
        fresh = http.post(data(world, "add"), json={**fact("b-fresh", "up", i=2), "metadatas": [
            {"mw_scope": "fleet", "mw_subject": "svc-never-used", "mw_predicate": "status", "mw_object": "up"}]}).status_code
        assert taken == fresh == 200
        # blue's fleet sees its own fact; red's is untouched
        assert http.post(data(world, "get"), json={"where": {"mw_subject": "svc-api"}}).json()["ids"] == ["b-0"]
    with stack.http(world.keys["w"]) as http:
        assert http.post(data(world, "get"), json={"where": {"mw_subject": "svc-api"}}).json()["ids"] == ["s2"]
        # an agent's private fact is its own partition: it neither supersedes nor is superseded by the fleet's
        assert http.post(data(world, "add"), json=fact("w-own", "mine", scope="agent", i=3)).status_code == 200
        assert sorted(http.post(data(world, "get"), json={"where": {"mw_subject": "svc-api"}}).json()["ids"]) == ["s2", "w-own"]
        # a tenant-wide fact is nobody's to hold: w asserts it, blue (who can read it) replaces it
        assert http.post(data(world, "add"), json=fact("t-w", "w-says", scope="tenant", i=4)).status_code == 200
    with stack.http(world.keys["blue"]) as http:
        assert http.post(data(world, "add"), json=fact("t-b", "blue-says", scope="tenant", i=5)).status_code == 200
        got = http.post(data(world, "get"), json={"where": {"$and": [{"mw_subject": "svc-api"}, {"mw_scope": "tenant"}]}}).json()
        assert got["ids"] == ["t-b"] and got["metadatas"][0]["mw_supersedes_id"] == "t-w"


def test_a_rescoped_fact_cannot_make_two_active_in_its_new_partition(stack: Stack, world: Tenant) -> None:
    with stack.http(world.keys["w"]) as http:
        assert http.post(data(world, "add"), json=fact("mv-a", "a", scope="agent", i=6) | {
            "metadatas": [{"mw_scope": "agent", "mw_subject": "svc-move", "mw_predicate": "status", "mw_object": "a"}]}).status_code == 200
        assert http.post(data(world, "add"), json=fact("mv-f", "f", i=6) | {
            "metadatas": [{"mw_scope": "fleet", "mw_subject": "svc-move", "mw_predicate": "status", "mw_object": "f"}]}).status_code == 200
        r = http.post(data(world, "update"), json={"ids": ["mv-a"], "metadatas": [{"mw_scope": "fleet"}]})
        assert r.status_code == 409, r.text
        got = http.post(data(world, "get"), json={"where": {"mw_subject": "svc-move"}}).json()
        assert sorted(zip(got["ids"], (m["mw_scope"] for m in got["metadatas"]))) == [("mv-a", "agent"), ("mv-f", "fleet")]


def test_concurrent_contradicting_writes_leave_exactly_one_active(stack: Stack, world: Tenant) -> None:
    def write(i: int) -> int:
        body = {"ids": [f"c{i}"], "embeddings": [V[i % 8]], "documents": [f"deploy target is region-{i}"],
                "metadatas": [{"mw_subject": "deploy", "mw_predicate": "location", "mw_object": f"region-{i}"}]}
        with stack.http(world.keys["w"]) as http:
            return http.post(data(world, "add"), json=body).status_code
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(write, range(50)))
    assert statuses == [200] * 50
    with stack.http(world.keys["w"]) as http:
        active = http.post(data(world, "get"), json={"where": {"mw_subject": "deploy"}}).json()["ids"]
        everything = http.post(data(world, "get", "?include_superseded=true"), json={"where": {"mw_subject": "deploy"}}).json()["ids"]
    assert len(active) == 1 and sorted(everything) == sorted(f"c{i}" for i in range(50))


def test_regression_concurrent_writers_of_one_partition_chain_their_facts(stack: Stack) -> None:
    """Shrunk by tests/stateful (the memory machine), then re-read for partitions: two agents of one
    fleet write contradicting fleet facts on a fresh (subject, predicate) at once. Both may supersede each
    other (one partition, both read it), so both are accepted, exactly one is active and the other is
    superseded by it — in the ledger and in Chroma's answers — whatever the order of activation."""
    t = stack.tenant("race")
    keys = {a: stack.key(t.name, "red", a, 1) for a in ("a1", "a2")}
    path = f"/api/v2/tenants/{t.name}/databases/default_database/collections/{t.collection_id}/add"
    for n in range(10):
        subject = f"svc-{n}"
        barrier = threading.Barrier(2)

        def write(agent: str) -> int:
            body = {"ids": [f"{subject}-{agent}"], "embeddings": [V[n % 8]], "documents": [f"{subject} by {agent}"],
                    "metadatas": [{"mw_subject": subject, "mw_predicate": "status", "mw_object": agent}]}
            with stack.http(keys[agent]) as http:
                barrier.wait(timeout=30)
                return http.post(path, json=body).status_code

        with ThreadPoolExecutor(max_workers=2) as pool:
            statuses = dict(zip(keys, pool.map(write, keys)))
        ledger = stack.ledger()
        try:
            known = ledger.get_rows("chroma", t.collection_id, [f"{subject}-{a}" for a in keys])
        finally:
            ledger.close()
        assert list(statuses.values()) == [200, 200], f"round {n}: {statuses}"
        active = [r for r in known.values() if r.status == "active"]
        older = [r for r in known.values() if r.status == "superseded"]
        assert len(active) == 1 and len(older) == 1, f"round {n}: {known}"
        assert older[0].superseded_by == (t.collection_id, active[0].row_id) and active[0].supersedes == (t.collection_id, older[0].row_id)
        with stack.http(keys["a1"]) as http:
            assert http.post(f"{path[:-3]}get", json={"where": {"mw_subject": subject}}).json()["ids"] == [active[0].row_id]


def test_derived_from_needs_a_readable_parent_and_deletion_cascades(stack: Stack, world: Tenant) -> None:
    with stack.http(world.keys["w"]) as http:
        assert http.post(data(world, "add"), json={"ids": ["obs"], "embeddings": [V[3]], "documents": ["observation 17"],
                                                   "metadatas": [{"mw_scope": "agent"}]}).status_code == 200
    with stack.http(world.keys["peer"]) as http:  # cannot read w's agent-scoped row
        r = http.post(data(world, "add"), json={"ids": ["hyp-x"], "embeddings": [V[4]], "metadatas": [{"mw_derived_from": "obs"}]})
        assert r.status_code == 403
        r = http.post(data(world, "add"), json={"ids": ["hyp-y"], "embeddings": [V[4]], "metadatas": [{"mw_derived_from": "nope"}]})
        assert r.status_code == 403
    with stack.http(world.keys["w"]) as http:
        assert http.post(data(world, "add"), json={"ids": ["hyp"], "embeddings": [V[4]], "documents": ["hypothesis from 17"],
                                                   "metadatas": [{"mw_derived_from": "obs"}]}).status_code == 200
        got = http.post(data(world, "get"), json={"ids": ["hyp"]}).json()
        assert got["metadatas"][0]["mw_derived_from"] == "obs" and got["metadatas"][0]["mw_source"].startswith("chroma:add:")
        assert http.post(data(world, "delete"), json={"ids": ["obs"]}).json() == {"deleted": 1}
        assert http.post(data(world, "get"), json={"ids": ["obs", "hyp"]}).json()["ids"] == []
    # the derived row is gone from the backend too
    assert stack.direct(world.name).get_collection(world.collection).get(ids=["obs", "hyp"])["ids"] == []


def test_forgotten_content_cannot_return_but_is_no_oracle(stack: Stack, world: Tenant) -> None:
    secret = "the vault PIN is 4711"
    with stack.http(world.keys["w"]) as http:
        body = {"ids": ["pin"], "embeddings": [V[5]], "documents": [secret], "metadatas": [{"mw_scope": "agent"}]}
        assert http.post(data(world, "add"), json=body).status_code == 200
        assert http.post(data(world, "delete"), json={"ids": ["pin"]}).json() == {"deleted": 1}
        again = {"ids": ["pin2"], "embeddings": [V[5]], "documents": ["The  Vault PIN is 4711 "]}
        assert http.post(data(world, "add"), json=again).status_code == 409  # normalised text matches
    with stack.http(world.keys["blue"]) as http:  # never could read it: its write is not refused
        assert http.post(data(world, "add"), json={"ids": ["pin3"], "embeddings": [V[5]], "documents": [secret]}).status_code == 200


def test_forgotten_content_binds_its_lineage_only_and_every_spelling(stack: Stack, world: Tenant) -> None:
    """Before, w could ban a text for the whole tenant (write it tenant-wide, delete it: everyone who
    could read it got 409), and a zero-width space or a trailing full stop got past the ban."""
    text = "the quarterly target is 12 percent"
    with stack.http(world.keys["w"]) as http:
        body = {"ids": ["qt"], "embeddings": [V[6]], "documents": [text], "metadatas": [{"mw_scope": "tenant"}]}
        assert http.post(data(world, "add"), json=body).status_code == 200
        assert http.post(data(world, "delete"), json={"ids": ["qt"]}).json() == {"deleted": 1}
        for n, spelling in enumerate(("The quarterly target is 12 percent.", "the quarterly\u200b target is 12 percent",
                                      "\ufeff  THE QUARTERLY TARGET IS 12 PERCENT!  ", "\"the quarterly target is 12 percent\"")):
            r = http.post(data(world, "add"), json={"ids": [f"qt-w{n}"], "embeddings": [V[6]], "documents": [spelling]})
            assert r.status_code == 409, (spelling, r.text)
    with stack.http(world.keys["peer"]) as http:  # same fleet, could read it: the deleted memory stays deleted
        assert http.post(data(world, "add"), json={"ids": ["qt-p"], "embeddings": [V[6]], "documents": [text]}).status_code == 409
    with stack.http(world.keys["blue"]) as http:  # another fleet's own knowledge is not censored by w's delete
        r = http.post(data(world, "add"), json={"ids": ["qt-b"], "embeddings": [V[6]], "documents": [text + "."]})
        assert r.status_code == 200, r.text
        # a different text is a different text
        assert http.post(data(world, "add"), json={"ids": ["qt-b2"], "embeddings": [V[6]],
                                                   "documents": ["the quarterly target is 13 percent"]}).status_code == 200


def test_a_principal_that_may_not_write_learns_nothing_from_a_write(stack: Stack, world: Tenant) -> None:
    with stack.http(world.keys["w"]) as http:
        body = {"ids": ["hidden-fact"], "embeddings": [V[7]], "documents": ["bob is on leave"],
                "metadatas": [{"mw_scope": "agent", "mw_subject": "employee:bob", "mw_predicate": "status", "mw_object": "leave"}]}
        assert http.post(data(world, "add"), json=body).status_code == 200
    reader = stack.key(world.name, "red", "ro", 0)  # trust 0: may not write
    answers = set()
    with stack.http(reader) as http:
        for row_id, subject, parent in (("x1", "employee:bob", None), ("x2", "employee:carol", None),
                                        ("hidden-fact", "employee:dave", None), ("x3", "employee:erin", "hidden-fact"),
                                        ("x4", "employee:erin", "never-existed")):
            meta = {"mw_subject": subject, "mw_predicate": "status", "mw_object": "x"}
            if parent:
                meta["mw_derived_from"] = parent
            for op in ("add", "upsert"):
                r = http.post(data(world, op), json={"ids": [row_id], "embeddings": [V[7]], "documents": ["bob is on leave"],
                                                      "metadatas": [meta]})
                answers.add((r.status_code, r.text))
    assert answers == {(403, '{"error":"forbidden","message":"write is not permitted for 1 of 1 rows"}')}


def test_subject_and_predicate_spellings_name_one_fact(stack: Stack, world: Tenant) -> None:
    spellings = [("Service:API", "status"), ("service:api", "Status"), ("service:api ", "status"), ("SERVICE:API", " STATUS ")]
    with stack.http(world.keys["w"]) as http:
        for i, (subject, predicate) in enumerate(spellings):
            body = {"ids": [f"sp{i}"], "embeddings": [V[i]], "documents": [f"spelling {i}"],
                    "metadatas": [{"mw_subject": subject, "mw_predicate": predicate, "mw_object": f"v{i}"}]}
            assert http.post(data(world, "add"), json=body).status_code == 200
        active = http.post(data(world, "get"), json={"where": {"mw_subject": "service:api"}}).json()
        assert active["ids"] == ["sp3"] and active["metadatas"][0]["mw_predicate"] == "status"
        assert http.post(data(world, "get"), json={"where": {"mw_subject": "Service:API"}}).json()["ids"] == []
        empty = {"ids": ["sp-empty"], "embeddings": [V[0]], "metadatas": [{"mw_subject": " ", "mw_predicate": "status", "mw_object": "x"}]}
        assert http.post(data(world, "add"), json=empty).status_code == 400


def test_limit_zero_returns_no_rows(stack: Stack, world: Tenant) -> None:
    with stack.http(world.keys["w"]) as http:
        assert http.post(data(world, "get"), json={"limit": 0}).json()["ids"] == []


def test_crash_between_tombstone_and_backend_delete_never_resurrects(tmp_path: Path) -> None:
    chroma = start_chroma(tmp_path / "chroma")
    try:
        side = start_sidecar(chroma.url, tmp_path / "ledger.db", POLICIES, extra_env={"MEMWARDEN_FAILPOINTS": "after-tombstone"})
        stack = Stack(chroma, side, tmp_path / "ledger.db")
        t = stack.tenant("crash")
        key = stack.key(t.name, "red", "w", 1)
        with stack.http(key) as http:
            assert http.post(data(t, "add"), json={"ids": ["doomed"], "embeddings": [V[6]], "documents": ["doomed"]}).status_code == 200
            with pytest.raises(httpx.TransportError):
                http.post(data(t, "delete"), json={"ids": ["doomed"]})  # the sidecar is SIGKILLed mid-delete
        side.proc.wait(timeout=30)
        assert side.proc.returncode == -signal.SIGKILL
        direct = stack.direct(t.name).get_collection(t.collection)
        assert direct.get(ids=["doomed"])["ids"] == ["doomed"]  # still in the backend: the crash window
        side = start_sidecar(chroma.url, tmp_path / "ledger.db", POLICIES)  # restart, no failpoint
        stack = Stack(chroma, side, tmp_path / "ledger.db")
        with stack.http(key) as http:
            assert http.post(data(t, "get"), json={"ids": ["doomed"]}).json()["ids"] == []
            assert http.get(data(t, "count")).json() == 0
            q = http.post(data(t, "query"), json={"query_embeddings": [V[6]], "n_results": 3}).json()
            assert "doomed" not in q["ids"][0]
        deadline = time.monotonic() + 20  # the start-up reconciler completes the backend delete
        while direct.get(ids=["doomed"])["ids"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert direct.get(ids=["doomed"])["ids"] == []
        side.stop()
    finally:
        chroma.stop()
