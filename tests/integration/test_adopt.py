"""`memwarden adopt chroma` against a real Chroma and the sidecar in front of it: rows written straight into
Chroma are brought under governance by declared rules — dry run, stamping, idempotence, a kill -9 half-way
and a re-run, never widening a governed row, tombstoned rows and deleted content never coming back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Stack, Tenant, unit_vectors

pytestmark = pytest.mark.integration

# (metadata pattern, expected governance) — the patterns the rules below are written for.
PATTERNS: list[tuple[dict[str, Any], tuple[str, str, str, tuple[str, ...]] | str]] = [
    ({"author": "r1", "visibility": "private"}, ("red/r1", "red", "agent", ())),
    ({"author": "b1", "visibility": "team"}, ("blue/b1", "blue", "fleet", ())),
    ({"visibility": "public"}, ("red/importer", "red", "tenant", ())),
    ({"author": "r1", "visibility": "shared", "shared_with": "blue/b2"}, ("red/r1", "red", "restricted", ("blue/b2",))),
    ({"author": "b1"}, ("blue/b1", "blue", "fleet", ())),
    ({"visibility": "weird"}, "visibility='weird' maps to no scope"),
    # forged governed keys written around memwarden: ignored by the rules, removed by the stamp
    ({"author": "r1", "visibility": "private", "mw_scope": "tenant", "mw_tenant": "x", "mw_r:x/red/r0": True},
     ("red/r1", "red", "agent", ())),
]
N = 35


def rules_text(tenant: str, collection: str, default_scope: str = "fleet") -> str:
    return f'''
tenant = "{tenant}"

[[collection]]
name = "{collection}"
owner = "red/importer"
scope = "{default_scope}"

[scope_from]
key = "visibility"
values = {{ private = "agent", team = "fleet", public = "tenant", shared = "restricted" }}
readers_key = "shared_with"

[[map]]
metadata = {{ author = "r1" }}
owner = "red/r1"

[[map]]
metadata = {{ author = "b1" }}
owner = "blue/b1"
'''


def memwarden(stack: Stack, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("memwarden")
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")}
    return subprocess.run([str(exe), *args, "--ledger", str(stack.ledger_path), "--backend-url", stack.chroma.url],
                          capture_output=True, text=True, timeout=600, env={**base, **(env or {})})


def adopt(stack: Stack, rules: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = memwarden(stack, "adopt", "chroma", "--rules", str(rules), "--format", "json", *args, env=env)
    assert r.returncode == 0, r.stderr
    docs = json.loads(r.stdout)
    assert len(docs) == 1
    return dict(docs[0])


def write_legacy(stack: Stack, t: Tenant, name: str) -> list[str]:
    """N rows written straight into a new Chroma collection (no sidecar), cycling through PATTERNS."""
    coll = stack.direct(t.name).create_collection(name)
    ids = [f"row-{i:02d}" for i in range(N)]
    coll.add(ids=ids, embeddings=unit_vectors(N, seed=3), documents=[f"legacy note {i}" for i in range(N)],
             metadatas=[{**PATTERNS[i % len(PATTERNS)][0], "n": i} for i in range(N)])
    return ids


def expected(t: Tenant, i: int) -> tuple[str, str, str, tuple[str, ...]] | str:
    want = PATTERNS[i % len(PATTERNS)][1]
    if isinstance(want, str):
        return want
    owner, fleet, scope, readers = want
    return f"{t.name}/{owner}", fleet, scope, tuple(f"{t.name}/{r}" for r in readers)


def readable(agent: str, fleet: str, trust: int, want: tuple[str, str, str, tuple[str, ...]] | str) -> bool:
    """The scope rules of the default policies (README "Governance model") for an agent of the tenant."""
    if isinstance(want, str):
        return False
    owner, row_fleet, scope, readers = want
    return ((scope == "agent" and owner == agent) or (scope == "fleet" and (row_fleet == fleet or trust >= 2))
            or scope == "tenant" or (scope == "restricted" and agent in readers))


def ledger_state(stack: Stack, collection_id: str, ids: list[str]) -> dict[str, tuple[Any, ...]]:
    ledger = stack.ledger()
    try:
        rows = ledger.get_rows("chroma", collection_id, ids)
    finally:
        ledger.close()
    return {i: (r.tenant, r.owner, r.fleet, r.scope, r.readers, r.status, r.writer, r.content_hmac, r.source.split(":")[:2])
            for i, r in rows.items()}


def chroma_state(stack: Stack, t: Tenant, name: str) -> dict[str, dict[str, Any]]:
    got = stack.direct(t.name).get_collection(name).get(include=["metadatas"])
    return {i: {k: v for k, v in (m or {}).items() if k not in ("mw_created_at", "mw_source")}
            for i, m in zip(got["ids"], got["metadatas"])}


def new_world(stack: Stack) -> Tenant:
    t = stack.tenant("adopt")
    for fleet, agent, trust in (("red", "r1", 1), ("red", "r0", 0), ("blue", "b1", 1), ("blue", "b2", 2),
                                ("red", "importer", 1)):
        t.keys[agent] = stack.key(t.name, fleet, agent, trust)
    return t


@pytest.fixture(scope="module")
def world(stack: Stack) -> Tenant:
    return new_world(stack)


@pytest.fixture()
def own_world(stack: Stack) -> Tenant:
    """A tenant of the test's own: a test that deletes content makes it forgotten tenant-wide, and the other
    tests write the same legacy texts (the suite passes in any order)."""
    return new_world(stack)


def test_dry_run_reports_and_writes_nothing(stack: Stack, world: Tenant, tmp_path: Path) -> None:
    ids = write_legacy(stack, world, "dry")
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text(world.name, "dry"))
    before = chroma_state(stack, world, "dry")
    rep = adopt(stack, rules, "--dry-run")
    covered = [i for i in range(N) if not isinstance(expected(world, i), str)]
    assert rep["dry_run"] and rep["scanned"] == N and rep["adopted"] == len(covered)
    assert sum(rep["by_scope"].values()) == len(covered)
    assert rep["by_scope"] == {s: sum(1 for i in covered if expected(world, i)[2] == s) for s in rep["by_scope"]}
    assert rep["by_owner"][f"{world.name}/red/r1"] == sum(1 for i in covered if expected(world, i)[0] == f"{world.name}/red/r1")
    assert {u["id"] for u in rep["uncovered"]} == {ids[i] for i in range(N) if isinstance(expected(world, i), str)}
    assert chroma_state(stack, world, "dry") == before
    assert ledger_state(stack, rep["collection"], ids) == {}
    ledger = stack.ledger()
    try:
        assert ledger.get_collection("chroma", rep["collection"]) is None
    finally:
        ledger.close()
    # the text report says the same, for a person
    text = memwarden(stack, "adopt", "chroma", "--rules", str(rules), "--dry-run")
    assert text.returncode == 0 and "dry run, nothing written" in text.stdout
    assert f"would adopt {len(covered)}" in text.stdout and "visibility='weird' maps to no scope" in text.stdout


def test_adopt_stamps_governs_and_is_idempotent(stack: Stack, world: Tenant, tmp_path: Path) -> None:
    ids = write_legacy(stack, world, "legacy")
    with pytest.raises(Exception, match="adopt it first"):
        stack.client(world.keys["r1"], world.name).get_collection("legacy")
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text(world.name, "legacy"))
    rep = adopt(stack, rules)
    cid = rep["collection"]
    state = ledger_state(stack, cid, ids)
    for i, row_id in enumerate(ids):
        want = expected(world, i)
        if isinstance(want, str):
            assert row_id not in state and {"id": row_id, "reason": want} in rep["uncovered"]
        else:
            assert state[row_id][:5] == (world.name, *want) and state[row_id][5:7] == ("active", "adopt")
            assert state[row_id][8] == ["chroma", "adopt"] and state[row_id][7]
    stamped = chroma_state(stack, world, "legacy")
    for i, row_id in enumerate(ids):
        want = expected(world, i)
        meta = stamped[row_id]
        assert meta["n"] == i  # plain metadata kept
        if isinstance(want, str):
            assert not any(k.startswith("mw_") for k in meta)
            continue
        assert (meta["mw_tenant"], meta["mw_owner"], meta["mw_fleet"], meta["mw_scope"]) == (world.name, *want[:3])
        assert "mw_r:x/red/r0" not in meta  # a forged governed key is gone
        assert {k for k in meta if k.startswith("mw_r:")} == {f"mw_r:{r}" for r in want[3]}
    # agents open the collection now and read what the rules gave them, through every read path
    r1 = stack.client(world.keys["r1"], world.name).get_collection("legacy")
    mine = {ids[i] for i in range(N) if readable(f"{world.name}/red/r1", "red", 1, expected(world, i))}
    assert set(r1.get()["ids"]) == mine and r1.count() == len(mine)
    assert set(r1.get(ids=ids)["ids"]) == mine
    assert set(r1.query(query_embeddings=unit_vectors(1, seed=9), n_results=N)["ids"][0]) == mine
    admin = stack.client(world.admin_key, world.name).get_collection("legacy")
    uncovered = [u["id"] for u in rep["uncovered"]]
    assert admin.get(ids=uncovered)["ids"] == []  # rows no rule covers stay denied, even to the tenant admin
    # a second run changes nothing
    again = adopt(stack, rules)
    assert (again["adopted"], again["already_governed"], again["restamped"]) == (0, rep["adopted"], 0)
    assert ledger_state(stack, cid, ids) == state and chroma_state(stack, world, "legacy") == stamped


def test_rerun_never_widens_a_governed_row(stack: Stack, world: Tenant, tmp_path: Path) -> None:
    ids = write_legacy(stack, world, "narrow")
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text(world.name, "narrow"))
    cid = adopt(stack, rules)["collection"]
    before = ledger_state(stack, cid, ids)
    private = ids[0]  # pattern 0: agent scope of red/r1
    direct = stack.direct(world.name).get_collection("narrow")
    # someone widens it straight in Chroma (metadata only), and the rules are changed to make everything public
    direct.update(ids=[private], metadatas=[{"mw_scope": "tenant", "visibility": "public"}])
    wide = tmp_path / "wide.toml"
    wide.write_text(rules_text(world.name, "narrow", default_scope="tenant").replace('private = "agent"', 'private = "tenant"'))
    direct.add(ids=["late"], embeddings=unit_vectors(1, seed=5), documents=["late note"], metadatas=[{"author": "b1"}])
    rep = adopt(stack, wide)
    # The widened stamp carries the row's own mw_source: it cannot be told from the stamp of an update that wrote
    # Chroma and never reached the ledger, whose content stamping the old governance would serve on the old. So it
    # is reported, not re-stamped, and reads withhold the row (its stamp disagrees with the ledger) from everyone.
    assert rep["adopted"] == 1 and rep["restamped"] == 0 and rep["changing"] == [private]
    assert ledger_state(stack, cid, ids) == before  # the governed rows keep their governance
    assert direct.get(ids=[private])["metadatas"][0]["mw_scope"] == "tenant"
    b2 = stack.client(world.keys["b2"], world.name).get_collection("narrow")
    assert private not in b2.get()["ids"] and "late" in b2.get()["ids"]  # late: fleet blue (b1), read by b2
    r1 = stack.client(world.keys["r1"], world.name).get_collection("narrow")
    assert r1.get(ids=[private])["ids"] == []  # its owner too, until it writes the row again


def test_tombstoned_rows_and_deleted_content_never_come_back(stack: Stack, own_world: Tenant, tmp_path: Path) -> None:
    world = own_world
    ids = write_legacy(stack, world, "forget")
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text(world.name, "forget"))
    cid = adopt(stack, rules)["collection"]
    r1 = stack.client(world.keys["r1"], world.name).get_collection("forget")
    r1.delete(ids=[ids[0]])  # r1's own private row
    direct = stack.direct(world.name).get_collection("forget")
    # written back around the sidecar: the same id, and a copy of its text under a new id
    direct.upsert(ids=[ids[0]], embeddings=unit_vectors(1, seed=1), documents=["legacy note 0"], metadatas=[{"author": "r1"}])
    direct.add(ids=["copy"], embeddings=unit_vectors(1, seed=2), documents=["Legacy note 0."], metadatas=[{"author": "r1"}])
    rep = adopt(stack, rules)
    # (the sidecar's reconciler may have deleted the reappeared row from Chroma again before the scan)
    assert rep["adopted"] == 0 and rep["tombstoned"] in (0, 1) and ids[0] not in {u["id"] for u in rep["uncovered"]}, rep
    assert {"id": "copy", "reason": "its text is deleted content of this tenant"} in rep["uncovered"]
    assert ledger_state(stack, cid, [ids[0]])[ids[0]][5] == "deleted"
    admin = stack.client(world.admin_key, world.name).get_collection("forget")
    assert admin.get(ids=[ids[0], "copy"])["ids"] == []


def test_deleted_content_with_invisible_marks_is_not_adopted(stack: Stack, own_world: Tenant, tmp_path: Path) -> None:
    world = own_world
    """Issue 34, finding 9: a deleted text written back around the sidecar with a default-ignorable code point in
    it (U+034F, U+FE0F, U+180B: not format characters, which the normalisation removed before) was adopted."""
    ids = write_legacy(stack, world, "forget-marks")
    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text(world.name, "forget-marks"))
    adopt(stack, rules)
    stack.client(world.keys["r1"], world.name).get_collection("forget-marks").delete(ids=[ids[0]])  # "legacy note 0"
    direct = stack.direct(world.name).get_collection("forget-marks")
    marked = {"cgj": "legacy\u034f note 0", "vs16": "legacy note 0\ufe0f", "fvs1": "leg\u180bacy note\u180b 0",
              "plain": "legacy note 00"}
    direct.add(ids=list(marked), embeddings=unit_vectors(len(marked), seed=4), documents=list(marked.values()),
               metadatas=[{"author": "r1"}] * len(marked))
    rep = adopt(stack, rules)
    assert rep["adopted"] == 1, rep  # only the other text
    for name in ("cgj", "vs16", "fvs1"):
        assert {"id": name, "reason": "its text is deleted content of this tenant"} in rep["uncovered"], rep
    r1 = stack.client(world.keys["r1"], world.name).get_collection("forget-marks")
    assert r1.get(ids=list(marked))["ids"] == ["plain"]


def test_kill_9_half_way_then_rerun_ends_as_an_uninterrupted_run(stack: Stack, world: Tenant, tmp_path: Path) -> None:
    ids = write_legacy(stack, world, "whole")
    write_legacy(stack, world, "crashed")
    whole, crashed = tmp_path / "whole.toml", tmp_path / "crashed.toml"
    whole.write_text(rules_text(world.name, "whole"))
    crashed.write_text(rules_text(world.name, "crashed"))
    adopt(stack, whole, "--page", "7")
    # SIGKILL after the second page is in the ledger and before it is stamped into Chroma
    r = memwarden(stack, "adopt", "chroma", "--rules", str(crashed), "--page", "7", "--format", "json",
                  env={"MEMWARDEN_FAILPOINTS": "adopt-after-ledger:2"})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    ledger = stack.ledger()
    try:
        cid = next(c.collection_id for c in ledger.list_collections("chroma", world.name, "default_database")
                   if c.name == "crashed")
    finally:
        ledger.close()
    half = ledger_state(stack, cid, ids)
    covered = sum(1 for i in range(N) if not isinstance(expected(world, i), str))
    assert 0 < len(half) <= 14 < covered  # two pages of 7 in the ledger, not all
    not_stamped = [i for i, m in chroma_state(stack, world, "crashed").items() if i in half and "mw_owner" not in m]
    assert not_stamped  # the crash window: governed in the ledger, not yet stamped
    rep = adopt(stack, crashed, "--page", "7")
    assert rep["restamped"] == len(not_stamped) and rep["already_governed"] == len(half)
    whole_cid = adopt(stack, whole)["collection"]
    assert ledger_state(stack, cid, ids) == ledger_state(stack, whole_cid, ids)
    assert chroma_state(stack, world, "crashed") == chroma_state(stack, world, "whole")


def test_refusals(stack: Stack, world: Tenant, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(f'tenant = "{world.name}"\n[[collection]]\nname = "dry"\nowner = "red/nobody"\n')
    r = memwarden(stack, "adopt", "chroma", "--rules", str(bad))
    assert r.returncode == 2 and f"{world.name}/red/nobody" in r.stderr and "create their keys" in r.stderr
    bad.write_text(f'tenant = "{world.name}"\n[[collection]]\nname = "no-such-collection"\n')
    r = memwarden(stack, "adopt", "chroma", "--rules", str(bad))
    assert r.returncode == 1 and "404" in r.stderr
    bad.write_text('tenant = "x"\n[[collection]]\nname = "c"\nscope = "public"\n')
    r = memwarden(stack, "adopt", "chroma", "--rules", str(bad))
    assert r.returncode == 2 and "collection.0.scope" in r.stderr
