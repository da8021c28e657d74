"""Provenance, supersession, deletion closure and forgotten content on the Mem0 profile, through the real
sidecar in front of our Mem0 REST test server (real `mem0ai` `Memory`), checked through the API, Mem0
itself and the ledger."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import pytest

from sidecar.app import Services
from sidecar.config import Settings
from sidecar.ledger import SQLiteLedger
from sidecar.provenance import content_digest
from tests.integration.conftest import POLICIES
from tests.integration.mem0.conftest import MEM0_KEY, Mem0Stack, World

pytestmark = pytest.mark.integration
COLL = "default"  # MEMWARDEN_MEM0_DEPLOYMENT of the fixture sidecar


@pytest.fixture
def world(mem0_stack: Mem0Stack) -> World:
    # w owns the facts; peer shares its fleet (reads fleet rows, may not update w's); blue is another fleet.
    return mem0_stack.world([("red", "w", 1), ("red", "peer", 1), ("blue", "blue", 1)], prefix="prov")


@pytest.fixture
def ledger(mem0_stack: Mem0Stack) -> Iterator[SQLiteLedger]:
    led = SQLiteLedger(mem0_stack.ledger_path)
    yield led
    led.close()


def add(h: httpx.Client, text: str, user: str, **meta: Any) -> httpx.Response:
    return h.post("/memories", json={"messages": [{"role": "user", "content": text}], "user_id": user,
                                     "infer": False, "metadata": meta})


def added_id(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 1 and results[0]["event"] == "ADD"
    return str(results[0]["id"])


def fact(h: httpx.Client, user: str, obj: str, subject: str = "svc-api", predicate: str = "status",
         **meta: Any) -> httpx.Response:
    return add(h, f"{subject} {predicate} is {obj}", user, mw_subject=subject, mw_predicate=predicate, mw_object=obj, **meta)


def listed(h: httpx.Client, user: str, **params: str) -> set[str]:
    r = h.get("/memories", params={"user_id": user, "top_k": "100", **params})
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["results"]}


def searched(h: httpx.Client, user: str, query: str, path: str = "/search") -> set[str]:
    r = h.post(path, json={"query": query, "filters": {"user_id": user}, "threshold": 0.0, "top_k": 50})
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["results"]}


def in_mem0(stack: Mem0Stack, mid: str) -> bool:
    with stack.direct() as d:
        return d.get(f"/memories/{mid}").json() is not None


def test_derived_from_needs_an_existing_readable_parent(mem0_stack: Mem0Stack, world: World, ledger: SQLiteLedger) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    other = mem0_stack.world([("red", "x", 1)], prefix="provo")
    foreign = mem0_stack.add(other.keys["x"], "another tenant's observation", metadata={"mw_scope": "tenant"})
    with mem0_stack.http(world.keys["w"]) as h:
        obs = added_id(add(h, "observation 17: latency spike on the api", user, mw_scope="agent"))
        withdrawn = added_id(add(h, "an observation that was withdrawn", user))
        assert h.delete(f"/memories/{withdrawn}").status_code == 200
    with mem0_stack.http(world.keys["peer"]) as h:
        answers = []
        for parents in (obs, withdrawn, foreign, str(uuid.uuid4()), f"{obs},{withdrawn}"):
            r = add(h, "a hypothesis the peer may not base on that", user, mw_derived_from=parents)
            answers.append((r.status_code, r.json()))
        assert answers[0][0] == 403 and all(a == answers[0] for a in answers), answers  # missing/foreign/deleted alike
        assert listed(h, user) == set()  # nothing was written
    with mem0_stack.http(world.keys["w"]) as h:
        hyp = added_id(add(h, "hypothesis: the spike comes from the cache", user, mw_derived_from=obs))
        meta = h.get(f"/memories/{hyp}").json()["metadata"]
        assert meta["mw_derived_from"] == obs and meta["mw_source"].startswith("mem0:add:")
        assert add(h, "two parents, one deleted", user, mw_derived_from=f"{obs},{withdrawn}").status_code == 403
        assert add(h, "no parent at all", user, mw_derived_from=" , ").status_code == 400
    chain = ledger.lineage("mem0", COLL, hyp)  # the edge is in the ledger, under the deployment's collection
    assert [(depth, key, parents) for depth, _, key, parents in chain] == [(0, (COLL, hyp), [(COLL, obs)]), (1, (COLL, obs), [])]
    assert chain[0][1] is not None and chain[0][1].writer == world.uid("w")


def test_deleting_a_parent_cascades_to_derived_memories_and_copies(mem0_stack: Mem0Stack, world: World,
                                                                   ledger: SQLiteLedger) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    copied = "the cache warmer runs every five minutes"
    with mem0_stack.http(world.keys["w"]) as h:
        obs = added_id(add(h, "observation 42: cache misses doubled", user))
        hyp = added_id(add(h, "hypothesis from observation 42", user, mw_derived_from=obs))
        copy_mine = added_id(add(h, copied, user))
        copy_mine2 = added_id(add(h, copied.upper() + "  ", user))  # same normalised text
        unrelated = added_id(add(h, "lunch is at noon", user))
    with mem0_stack.http(world.keys["peer"]) as h:
        mitigation = added_id(add(h, "mitigation for observation 42", user, mw_derived_from=hyp))  # peer's own row
        copy_peer = added_id(add(h, copied, user))  # a copy w may not delete
    with mem0_stack.http(world.keys["w"]) as h:
        assert h.delete(f"/memories/{obs}").status_code == 200
        assert h.delete(f"/memories/{copy_mine}").status_code == 200
    closed = (obs, hyp, mitigation, copy_mine, copy_mine2)
    for key in (world.keys["w"], world.keys["peer"]):
        with mem0_stack.http(key) as h:
            for mid in closed:
                assert h.get(f"/memories/{mid}").status_code == 404, mid
            assert listed(h, user) == {unrelated, copy_peer}
    assert not any(in_mem0(mem0_stack, mid) for mid in closed)
    assert in_mem0(mem0_stack, unrelated) and in_mem0(mem0_stack, copy_peer)
    rows = ledger.get_rows("mem0", COLL, list(closed))
    assert {r.status for r in rows.values()} == {"deleted"} and len(rows) == len(closed)
    assert not set(closed) & {rid for _, rid in ledger.pending_tombstones("mem0")}


def test_superseded_memories_are_hidden_unless_asked_for(mem0_stack: Mem0Stack, world: World, ledger: SQLiteLedger) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    with mem0_stack.http(world.keys["w"]) as h:
        s1 = added_id(fact(h, user, "paused"))
        s2 = added_id(fact(h, user, "running"))
        other = added_id(fact(h, user, "blue", predicate="colour"))  # not single-valued: stays active
        assert h.get(f"/memories/{s1}").status_code == 404
        old = h.get(f"/memories/{s1}", params={"include_superseded": "true"})
        assert old.status_code == 200 and old.json()["metadata"]["mw_superseded_by"] == s2
        new = h.get(f"/memories/{s2}").json()["metadata"]
        assert new["mw_supersedes_id"] == s1 and "mw_superseded_by" not in new
        assert listed(h, user) == {s2, other}
        assert listed(h, user, include_superseded="true") == {s1, s2, other}
        assert searched(h, user, "svc-api status") == {s2, other}
        assert searched(h, user, "svc-api status", "/search?include_superseded=true") == {s1, s2, other}
        every = h.get("/memories", params={"user_id": user, "include_superseded": "true"}).json()["results"]
        links = {m["id"]: m["metadata"] for m in every}
        assert links[s1]["mw_superseded_by"] == s2 and links[s2]["mw_supersedes_id"] == s1
        hits = h.post("/search", json={"query": "svc-api status", "filters": {"user_id": user}, "threshold": 0.0}).json()
        assert {m["id"]: m["metadata"] for m in hits["results"]}[s2]["mw_supersedes_id"] == s1
        assert h.get(f"/memories/{s1}/history").status_code == 404
        hist = h.get(f"/memories/{s1}/history", params={"include_superseded": "true"})
        assert hist.status_code == 200 and hist.json() and hist.json()[0]["memory_id"] == s1
        before = str(new["mw_created_at"] - 1)  # the facts as they were just before s2 was written
        assert h.get(f"/memories/{s1}", params={"as_of": before}).status_code == 200
        assert h.get(f"/memories/{s2}", params={"as_of": before}).status_code == 404
        assert listed(h, user, as_of=before) == {s1}  # `other` did not exist yet either
        assert searched(h, user, "svc-api status", f"/search?as_of={before}") == {s1}
        assert h.get(f"/memories/{s1}", params={"include_superseded": "maybe"}).status_code == 400
        assert h.get("/memories", params={"user_id": user, "as_of": "yesterday"}).status_code == 400
    rows = ledger.get_rows("mem0", COLL, [s1, s2, other])
    assert (rows[s1].status, rows[s1].superseded_by) == ("superseded", (COLL, s2))
    assert (rows[s2].status, rows[s2].supersedes) == ("active", (COLL, s1))
    assert rows[other].status == "active" and not rows[other].single_valued
    active = ledger.active_fact("mem0", world.name, "svc-api", "status")
    assert active is not None and active.row_id == s2


def test_supersession_is_per_partition_and_no_oracle(mem0_stack: Mem0Stack, world: World, ledger: SQLiteLedger) -> None:
    """Before, blue (who cannot read w's fleet fact) and peer (who can, but may not update it) both got 403
    where an unused (subject, predicate) answered 200, and w held the fact for the tenant."""
    user = "u-" + uuid.uuid4().hex[:8]
    with mem0_stack.http(world.keys["w"]) as h:
        current = added_id(fact(h, user, "green", subject="release-7", predicate="pipeline_status"))
    with mem0_stack.http(world.keys["blue"]) as h:  # another fleet: another partition, the same answer as for a new pair
        theirs = added_id(fact(h, user, "red", subject="release-7", predicate="pipeline_status"))
        assert fact(h, user, "red", subject="release-never", predicate="pipeline_status").status_code == 200
        assert listed(h, user, include_superseded="true") >= {theirs} and current not in listed(h, user, include_superseded="true")
    with mem0_stack.http(world.keys["peer"]) as h:  # w's fleet: one partition, peer reads w's fact and replaces it
        newer = added_id(fact(h, user, "amber", subject="release-7", predicate="pipeline_status"))
        assert current not in listed(h, user) and newer in listed(h, user)
        assert h.get(f"/memories/{newer}").json()["metadata"]["mw_supersedes_id"] == current
    assert ledger.get_rows("mem0", COLL, [current])[current].status == "superseded"
    assert ledger.get_rows("mem0", COLL, [theirs])[theirs].status == "active"
    assert ledger.active_fact("mem0", world.name, "release-7", "pipeline_status", collection=COLL,
                              partition=f"fleet:{world.name}/{world.fleets['w']}").row_id == newer


def test_concurrent_contradicting_writes_leave_exactly_one_active(mem0_stack: Mem0Stack, world: World,
                                                                  ledger: SQLiteLedger) -> None:
    user = "u-" + uuid.uuid4().hex[:8]

    def write(i: int) -> httpx.Response:
        with mem0_stack.http(world.keys["w"]) as h:
            return fact(h, user, f"region-{i}", subject="deploy", predicate="location")

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(write, range(20)))
    ids = [added_id(r) for r in answers]
    rows = ledger.get_rows("mem0", COLL, ids)
    statuses = sorted(r.status for r in rows.values())
    assert statuses == ["active"] + ["superseded"] * 19
    (winner,) = [i for i, r in rows.items() if r.status == "active"]
    active = ledger.active_fact("mem0", world.name, "deploy", "location")
    assert active is not None and active.row_id == winner
    assert all(rows[i].superseded_by is not None and rows[i].superseded_by[1] in rows for i in ids if i != winner)
    with mem0_stack.http(world.keys["w"]) as h:
        assert listed(h, user) == {winner}
        assert listed(h, user, include_superseded="true") == set(ids)
        assert searched(h, user, "deploy location") == {winner}
        assert sum(h.get(f"/memories/{i}").status_code == 200 for i in ids) == 1


def test_forgotten_content_is_refused_only_to_who_could_read_it(mem0_stack: Mem0Stack, world: World,
                                                                ledger: SQLiteLedger) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    fleet_secret = "the vault PIN is 4711"
    private_secret = "my locker code is 2323"
    with mem0_stack.http(world.keys["w"]) as h:
        pin = added_id(add(h, fleet_secret, user))  # fleet scope: peer could read it, blue could not
        locker = added_id(add(h, private_secret, user, mw_scope="agent"))  # only w could read it
        note = added_id(add(h, "an innocent note", user))
        assert ledger.get_rows("mem0", COLL, [pin])[pin].content_hmac == content_digest(ledger.content_key(), fleet_secret)
        assert h.delete(f"/memories/{pin}").status_code == 200
        assert h.delete(f"/memories/{locker}").status_code == 200
        assert add(h, "The  Vault PIN is 4711 ", user).status_code == 409  # normalised text matches
        assert add(h, private_secret, user).status_code == 409
        assert h.put(f"/memories/{note}", json={"text": fleet_secret}).status_code == 409
        assert h.get(f"/memories/{note}").json()["memory"] == "an innocent note"
    with mem0_stack.http(world.keys["peer"]) as h:
        assert add(h, fleet_secret, user).status_code == 409
        assert add(h, private_secret, user).status_code == 200  # never could read it: no oracle
    with mem0_stack.http(world.keys["blue"]) as h:
        assert add(h, fleet_secret, user).status_code == 200
    # A tenant-wide text deleted by w binds w's lineage (w, its fleet) in every spelling, not other fleets.
    shared = "the offsite is on the 14th"
    with mem0_stack.http(world.keys["w"]) as h:
        assert h.delete(f"/memories/{added_id(add(h, shared, user, mw_scope='tenant'))}").status_code == 200
        for spelling in ("The offsite is on the 14th.", "the offsite\u200b is on the 14th", " THE OFFSITE IS ON THE 14TH!"):
            assert add(h, spelling, user).status_code == 409, spelling
    with mem0_stack.http(world.keys["peer"]) as h:
        assert add(h, shared, user).status_code == 409
    with mem0_stack.http(world.keys["blue"]) as h:
        assert add(h, shared, user).status_code == 200


def test_supersession_links_only_to_readable_memories(mem0_stack: Mem0Stack, world: World) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    with mem0_stack.http(world.keys["w"]) as h:
        f1 = added_id(fact(h, user, "team-a", subject="svc-billing", predicate="owner"))
        f2 = added_id(fact(h, user, "team-b", subject="svc-billing", predicate="owner"))  # one fleet partition
        assert h.get(f"/memories/{f2}").json()["metadata"]["mw_supersedes_id"] == f1
        # the superseded f1 is taken out of peer's sight (its owner re-scopes it to itself)
        assert h.put(f"/memories/{f1}", json={"metadata": {"mw_scope": "agent"}}).status_code == 200
        assert h.get(f"/memories/{f1}", params={"include_superseded": "true"}).json()["metadata"]["mw_superseded_by"] == f2
    with mem0_stack.http(world.keys["peer"]) as h:
        meta = h.get(f"/memories/{f2}").json()["metadata"]
        assert "mw_supersedes_id" not in meta and f1 not in str(meta)
        for rows in (h.get("/memories", params={"user_id": user}).json()["results"],
                     h.post("/search", json={"query": "svc-billing owner", "filters": {"user_id": user},
                                             "threshold": 0.0}).json()["results"]):
            assert [r["id"] for r in rows] == [f2] and f1 not in str(rows)
        assert h.get(f"/memories/{f1}", params={"include_superseded": "true"}).status_code == 404
        f3 = added_id(fact(h, user, "team-c", subject="svc-billing", predicate="owner"))
    with mem0_stack.http(world.keys["w"]) as h:
        assert h.get(f"/memories/{f2}", params={"include_superseded": "true"}).json()["metadata"]["mw_superseded_by"] == f3


def test_provenance_and_triples_are_write_once(mem0_stack: Mem0Stack, world: World, ledger: SQLiteLedger) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    with mem0_stack.http(world.keys["w"]) as h:
        parent = added_id(add(h, "a parent", user))
        mid = added_id(fact(h, user, "v1", subject="svc-x", predicate="current_version"))
        mine = added_id(add(h, "private", user, mw_scope="agent"))
        for meta in ({"mw_derived_from": parent}, {"mw_subject": "svc-y"}, {"mw_object": "v2"},
                     {"mw_subject": "svc-x", "mw_predicate": "current_version", "mw_object": "v2"}):
            assert h.put(f"/memories/{mid}", json={"metadata": meta}).status_code == 400, meta
        # The triple sent back as a read shows it changes nothing (sidecar.core.echo, as on Chroma).
        same = {"mw_subject": "svc-x", "mw_predicate": "current_version", "mw_object": "v1"}
        assert h.put(f"/memories/{mid}", json={"metadata": same}).status_code == 200
        assert h.put(f"/memories/{mid}", json={"text": "svc-x current_version is v1 (checked)"}).status_code == 200
        assert h.get(f"/memories/{mid}").json()["metadata"]["mw_object"] == "v1"
    row = ledger.get_rows("mem0", COLL, [mid])[mid]  # the content HMAC follows the text
    assert row.content_hmac == content_digest(ledger.content_key(), "svc-x current_version is v1 (checked)")
    assert (row.subject, row.predicate, row.object) == ("svc-x", "current_version", "v1")
    with mem0_stack.http(world.keys["peer"]) as h:  # an unreadable memory is 404 before any 400
        assert h.put(f"/memories/{mine}", json={"metadata": {"mw_derived_from": parent}}).status_code == 404


def test_reconciler_deletes_tombstoned_memories_that_reappear_in_mem0(mem0_stack: Mem0Stack, world: World,
                                                                       ledger: SQLiteLedger) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    with mem0_stack.http(world.keys["w"]) as h:
        mid = added_id(add(h, "a memory whose delete gets lost", user))
    # A lost delete: the ledger holds a confirmed tombstone, but the memory is still in Mem0.
    ledger.tombstone("mem0", COLL, [mid], by="test", request_id="lost-delete")
    ledger.mark_backend_deleted("mem0", COLL, [mid])
    with mem0_stack.direct() as d:
        assert d.get(f"/memories/{mid}").json()["id"] == mid
    with mem0_stack.http(world.keys["w"]) as h:  # never served meanwhile
        assert h.get(f"/memories/{mid}").status_code == 404
        assert mid not in listed(h, user) and mid not in searched(h, user, "a memory whose delete gets lost")
    services = Services(Settings(backend="mem0", backend_url=mem0_stack.mem0.url, backend_token=MEM0_KEY,
                                 ledger_path=mem0_stack.ledger_path, policies_dir=POLICIES, policy_watch_interval_s=0))
    try:
        issued = asyncio.run(services.profile.reconcile())
    finally:
        services.ledger.close()
    assert issued >= 1
    with mem0_stack.direct() as d:
        assert d.get(f"/memories/{mid}").json() is None  # Mem0 answers 200 null for a missing id


def test_history_redacts_a_past_text_that_is_deleted_content(mem0_stack: Mem0Stack, world: World) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    secret = "Alice's SSN is 078-05-1120"
    with mem0_stack.http(world.keys["w"]) as h:
        m = added_id(add(h, secret, user, mw_scope="tenant"))  # later edited: its history keeps the text
        d = added_id(add(h, secret, user, mw_scope="agent"))  # a copy only w can read
        assert h.put(f"/memories/{m}", json={"text": "Alice's SSN is on file"}).status_code == 200
        assert h.delete(f"/memories/{d}").status_code == 200
        assert add(h, secret, user).status_code == 409  # deleted content w could read
        history = h.get(f"/memories/{m}/history").json()
    assert secret not in str(history)
    assert [(e["event"], e["old_memory"], e["new_memory"]) for e in history] == [
        ("ADD", None, None), ("UPDATE", None, "Alice's SSN is on file")]
    with mem0_stack.http(world.keys["blue"]) as h:  # never could read d: sees m's history as it was
        seen = h.get(f"/memories/{m}/history").json()
    assert [(e["event"], e["new_memory"]) for e in seen] == [("ADD", secret), ("UPDATE", "Alice's SSN is on file")]


def test_returned_metadata_names_only_readable_parents(mem0_stack: Mem0Stack, world: World) -> None:
    user = "u-" + uuid.uuid4().hex[:8]
    with mem0_stack.http(world.keys["w"]) as h:
        open_parent = added_id(add(h, "an open parent", user))
        private = added_id(add(h, "a private parent", user, mw_scope="agent"))
        child = added_id(add(h, "the child", user, mw_derived_from=f"{open_parent},{private}"))
        lone = added_id(add(h, "a child of the private one only", user, mw_derived_from=private))
        assert h.get(f"/memories/{child}").json()["metadata"]["mw_derived_from"] == f"{open_parent},{private}"
    with mem0_stack.http(world.keys["peer"]) as h:
        assert h.get(f"/memories/{child}").json()["metadata"]["mw_derived_from"] == open_parent
        assert "mw_derived_from" not in h.get(f"/memories/{lone}").json()["metadata"]
        rows = h.get("/memories", params={"user_id": user}).json()["results"]
        found = h.post("/search", json={"query": "the child", "filters": {"user_id": user}, "threshold": 0.0}).json()["results"]
        for listing in (rows, found):
            assert private not in str(listing)
