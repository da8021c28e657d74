"""`memwarden authz check` against cedarpy on generated requests: for seeded random principals, rows and
actions, the answer's decision and determining policies are Cedar's on the request and entities it
prints, those entities are the ledger's rows, and the rows the sidecar never sends to Cedar (unknown,
deleted, another tenant's collection) are answered as the sidecar answers them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from invariants.engine import authorize, parse_text
from sidecar.authzcheck import Checker, CheckError
from sidecar.config import Settings
from sidecar.governance import Row
from sidecar.ledger import CollectionRecord, SQLiteLedger

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
SCHEMA = (POLICIES / "memwarden.cedarschema").read_text()
CEDAR = [p for f in sorted(POLICIES.glob("*.cedar")) for p in parse_text(f.read_text(), str(f)).policies]
ACTIONS = ("read", "update", "delete", "redistribute")
SCOPES = ("agent", "fleet", "tenant", "restricted")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Checker, SQLiteLedger, list[str], dict[str, Row]]:
    tmp = tmp_path_factory.mktemp("authz")
    led = SQLiteLedger(tmp / "l.db")
    led.register_collection(CollectionRecord("chroma", "C", "t", "db", "mem", "x", 1))
    led.register_collection(CollectionRecord("chroma", "D", "u", "db", "mem", "x", 1))
    rnd = random.Random(13)
    keys = []
    agents = []
    for tenant in ("t", "u"):
        for fleet in ("red", "blue"):
            for trust in range(4):
                rec, _ = led.create_key("agent", tenant, fleet, f"a{trust}", trust)
                keys.append(rec.key_id)
                agents.append(f"{tenant}/{fleet}/a{trust}")
        keys.append(led.create_key("admin", tenant, None, None, 0)[0].key_id)
    revoked, _ = led.create_key("agent", "t", "red", "gone", 1)
    led.revoke_key(revoked.key_id)
    keys.append(revoked.key_id)
    rows: dict[str, Row] = {}
    for i in range(40):
        owner = rnd.choice([a for a in agents if a.startswith("t/")] + ["t/red/never-had-a-key"])
        fleet = rnd.choice(["red", "blue"])
        readers = tuple(rnd.sample([a for a in agents if a.startswith("t/")], rnd.randint(0, 2)))
        row = Row("chroma", "C", f"r{i}", "t", fleet, owner, rnd.choice(SCOPES), owner, 1, readers=readers)
        led.reserve_rows([row])
        led.activate_rows("chroma", "C", [row.row_id])
        rows[row.row_id] = row
    led.tombstone("chroma", "C", ["r0", "r1"], "t/red/a1", "req")
    checker = Checker(Settings(policies_dir=POLICIES, ledger_path=tmp / "l.db"), led)
    return checker, led, keys, rows


def test_answers_are_cedars_on_the_entities_they_print(world: tuple[Checker, SQLiteLedger, list[str], dict[str, Row]]) -> None:
    checker, led, keys, rows = world
    rnd = random.Random(7)
    seen = {"allow": 0, "deny": 0}
    for _ in range(150):
        key_id, action = rnd.choice(keys), rnd.choice(ACTIONS)
        row_id = rnd.choice([*rows, "never-written"])
        item: dict[str, Any] = {"row": row_id, "collection": "C", "actions": [action]}
        if action == "redistribute":
            item["context"] = {"target_fleet": rnd.choice(["red", "blue"]), "target_scope": rnd.choice(SCOPES)}
        answer = checker.check({"key_id": key_id, "resources": [item]})
        (res,) = answer["results"]
        p = checker.principal(key_id)
        if p is None:
            assert (res["decision"], res["reason"], answer["principal"]) == ("deny", "not_authenticated", None)
            continue
        stored = led.get_rows("chroma", "C", [row_id]).get(row_id)
        if p.tenant != "t":
            assert (res["decision"], res["reason"], res["request"]) == ("deny", "unknown_collection", None)
            continue
        if stored is None or stored.status == "deleted":
            assert res["decision"] == "deny" and res["request"] is None
            assert res["reason"] == ("unknown_row" if stored is None else "deleted_row")
            continue
        # The entities Cedar saw hold the ledger's row as it is ...
        ents = {(e["uid"]["type"], e["uid"]["id"]): e for e in res["entities"]}
        mem = ents[("Memory", f"chroma:C:{row_id}")]["attrs"]
        assert (mem["tenant"]["__entity"]["id"], mem["fleet"]["__entity"]["id"], mem["owner"]["__entity"]["id"],
                mem["scope"], mem["status"]) == (stored.tenant, f"t/{stored.fleet}", stored.owner, stored.scope, "active")
        assert sorted(r["__entity"]["id"] for r in mem["readers"]) == sorted(stored.readers)
        assert res["request"]["principal"] == {"type": p.uid[0], "id": p.uid[1]}
        # ... and the decision and determining policies are Cedar's on them.
        cedar = authorize(res["request"], CEDAR, res["entities"], SCHEMA)
        assert res["decision"] == ("allow" if cedar.allow else "deny"), (res, cedar)
        assert sorted(res["policies"]) == sorted(cedar.reasons) and not cedar.errors
        if res["decision"] == "deny":
            assert res["reason"] == ("forbid" if cedar.reasons else "no_permit")
        seen[res["decision"]] += 1
    assert seen["allow"] >= 10 and seen["deny"] >= 10, seen  # neither degenerate


def test_request_level_and_write_checks(world: tuple[Checker, SQLiteLedger, list[str], dict[str, Row]]) -> None:
    checker, led, keys, _ = world
    t_red_1 = next(k.key_id for k in led.list_keys("t") if k.agent == "a1" and k.fleet == "red")
    t_red_0 = next(k.key_id for k in led.list_keys("t") if k.agent == "a0" and k.fleet == "red")
    answer = checker.check({"key_id": t_red_1, "resources": [
        {"collection": "C", "actions": ["search", "list", "admin"]},
        {"database": "db", "tenant": "u", "actions": ["list"]},
        {"row": "brand-new", "collection": "C", "actions": ["write"], "scope": "agent"},
        {"row": "r5", "collection": "C", "actions": ["write"]}]})
    got = [(r["action"], r["resource"], r["decision"], r["reason"]) for r in answer["results"]]
    assert got[:2] == [("search", "Collection::chroma:C", "allow", None), ("list", "Collection::chroma:C", "allow", None)]
    assert got[2][2:] == ("deny", "no_permit")  # admin needs a tenant admin key
    assert got[3] == ("list", "Namespace::u/db", "deny", "forbid")
    assert got[4][2] == "allow" and answer["results"][4]["policies"] == ["write-trust-ladder"]
    assert got[5][2:] == ("error", "conflict")  # write names a new row; this one exists
    denied = checker.check({"key_id": t_red_0, "resources": [{"row": "n", "collection": "C", "actions": ["write"]}]})
    assert denied["results"][0]["decision"] == "deny"  # trust 0 is read-only
    # A new row's labels reach Cedar as they would be stored; the principal's roles are its key's.
    labelled = checker.check({"key_id": t_red_1, "resources": [
        {"row": "n2", "collection": "C", "actions": ["write"], "labels": ["pii", "finance", "pii"]}]})["results"][0]
    ents = {(e["uid"]["type"], e["uid"]["id"]): e for e in labelled["entities"]}
    assert ents[("Memory", "chroma:C:n2")]["attrs"]["labels"] == ["finance", "pii"]
    assert ents[("Agent", "t/red/a1")]["attrs"]["roles"] == []
    with pytest.raises(CheckError):
        checker.check({"key_id": t_red_1, "resources": [{"row": "n3", "collection": "C", "actions": ["write"], "labels": ["p ii"]}]})


def test_the_command_line(world: tuple[Checker, SQLiteLedger, list[str], dict[str, Row]]) -> None:
    checker, led, keys, rows = world
    owner_row = next(r for r in rows.values() if r.scope == "agent" and r.owner.endswith("/a1") and r.row_id not in ("r0", "r1"))
    owner_key = next(k.key_id for k in led.list_keys("t") if k.agent == "a1" and f"t/{k.fleet}/a1" == owner_row.owner)
    ledger_file = str(checker.settings.ledger_path)
    doc = {"key_id": owner_key, "resources": [{"row": owner_row.row_id, "collection": "C", "actions": ["read"]}]}
    run = [sys.executable, "-m", "sidecar.cli", "authz", "check", "--policies", str(POLICIES), "--ledger", ledger_file]
    proc = subprocess.run([*run, "--request", "-", "--format", "json"], input=json.dumps(doc), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["results"][0]["decision"] == "allow" and out["results"][0]["policies"] == ["read-agent-scope"]
    assert out["policy_sha256"] == checker.policy.digest
    other = next(k.key_id for k in led.list_keys("u") if k.kind == "admin")
    proc = subprocess.run([*run, "--key-id", other, "--action", "read", "--row", owner_row.row_id, "--collection", "C"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "DENY  read Memory::chroma:C:" in proc.stdout and "unknown_collection" in proc.stdout
