"""`Agent.roles` (set with the key) and `Memory.labels` (requested as ``mw_labels``) end to end: a real
sidecar in front of a real `chroma run` with the default policies plus examples/labels-and-roles (rows
labelled "pii" need the role "pii-reader" to be read; rows labelled "legal-hold" are not deleted or
relabelled without "records-manager"), driven by the official client and raw HTTP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import chromadb
import httpx
import pytest

from memwarden_eval.harness import Server, start_sidecar
from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES, admin_client, chroma_client, unit_vectors
from tests.integration.logutil import decision, file_sink

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "labels-and-roles"


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory, chroma_server: Server) -> Iterator[tuple[Server, Path, Path]]:
    tmp = tmp_path_factory.mktemp("labels")
    policies = tmp / "policies"
    shutil.copytree(POLICIES, policies)
    shutil.copy(EXAMPLE / "labels.cedar", policies / "labels.cedar")
    shutil.copy(EXAMPLE / "tests" / "labels.json", policies / "tests" / "labels.json")
    side = start_sidecar(chroma_server.url, tmp / "ledger.db", policies, extra_env=file_sink(tmp / "decisions.jsonl"))
    yield side, tmp / "ledger.db", tmp / "decisions.jsonl"
    side.stop()


def _cli_key(ledger: Path, *args: str) -> str:
    """A key made by `memwarden keys create` (the way an operator gives roles)."""
    proc = subprocess.run([sys.executable, "-m", "sidecar.cli", "keys", "create", "--ledger", str(ledger), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_labels_and_roles_are_enforced(labelled: tuple[Server, Path, Path]) -> None:
    side, ledger_path, _ = labelled
    tenant = f"lab{uuid.uuid4().hex[:8]}"
    ledger = SQLiteLedger(ledger_path)
    try:
        admin = ledger.create_key("admin", tenant, None, None, 0)[1]
        owner = ledger.create_key("agent", tenant, "red", "owner", 1, roles=["pii-reader"])[1]
        plain = ledger.create_key("agent", tenant, "red", "plain", 1)[1]
    finally:
        ledger.close()
    cleared = _cli_key(ledger_path, "--tenant", tenant, "--fleet", "red", "--agent", "cleared", "--trust", "1",
                       "--role", "pii-reader", "--role", "oncall")
    listed = subprocess.run([sys.executable, "-m", "sidecar.cli", "keys", "list", "--ledger", str(ledger_path),
                             "--tenant", tenant], capture_output=True, text=True, timeout=60, env={"COLUMNS": "200"})
    assert "oncall,pii-reader" in listed.stdout, listed.stdout

    adm = admin_client(side.port, {"X-API-Key": admin})
    adm.create_tenant(tenant)
    adm.create_database("default_database", tenant=tenant)
    chroma_client(side.port, tenant, {"X-API-Key": admin}).create_collection("mem")

    def coll(key: str) -> chromadb.api.models.Collection.Collection:
        return chroma_client(side.port, tenant, {"X-API-Key": key}).get_collection("mem")

    vec = unit_vectors(5, seed=3)
    coll(owner).add(ids=["pii", "fin", "none"], embeddings=vec[:3], documents=["ssn 123", "q3 budget", "lunch menu"],
                    metadatas=[{"mw_labels": "pii"}, {"mw_labels": "finance, quarterly"}, None])
    everything = ["fin", "none", "pii"]
    # Without the role: the pii row is hidden on get, query and count; with it (from the key) it is not.
    assert sorted(coll(plain).get()["ids"]) == ["fin", "none"]
    assert sorted(coll(plain).query(query_embeddings=[vec[0]], n_results=3)["ids"][0]) == ["fin", "none"]
    assert coll(plain).count() == 2
    assert coll(plain).get(ids=["pii"])["ids"] == []
    got = coll(cleared).get(include=["metadatas"])
    assert sorted(got["ids"]) == everything and coll(cleared).count() == 3
    labels = {i: m.get("mw_labels") for i, m in zip(got["ids"], got["metadatas"])}
    assert labels == {"pii": "pii", "fin": "finance,quarterly", "none": None}   # stored sorted, deduplicated
    assert sorted(coll(admin).get()["ids"]) == everything                        # tenant-wide by design

    # A bad label is 400 and writes nothing.
    with httpx.Client(base_url=side.url, headers={"X-API-Key": owner}, trust_env=False, timeout=30) as http:
        cid = str(coll(owner).id)
        base = f"/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}"
        r = http.post(base + "/add", json={"ids": ["bad"], "embeddings": [vec[3]], "metadatas": [{"mw_labels": "p ii"}]})
        assert r.status_code == 400 and "label" in r.json()["message"], r.text
        assert coll(owner).get(ids=["bad"])["ids"] == []

    # The pii label binds the row's own writer too: without the role it writes the row, then cannot read it,
    # so for it the row does not exist (an update is 404). The owner with the role drops the label (a
    # redistribute it may make); then the fleet reads the row, and no stale mw_labels is left in its metadata.
    coll(plain).add(ids=["mine"], embeddings=[vec[3]], documents=["my pii"], metadatas=[{"mw_labels": "pii"}])
    assert coll(plain).get(ids=["mine"])["ids"] == []
    with httpx.Client(base_url=side.url, headers={"X-API-Key": plain}, trust_env=False, timeout=30) as http:
        r = http.post(base + "/update", json={"ids": ["mine"], "metadatas": [{"mw_labels": ""}]})
        assert r.status_code == 404, r.text
    coll(owner).update(ids=["pii"], metadatas=[{"mw_labels": ""}])
    row = coll(plain).get(ids=["pii"], include=["metadatas"])
    assert row["ids"] == ["pii"] and "mw_labels" not in row["metadatas"][0]
    coll(owner).update(ids=["pii"], metadatas=[{"mw_labels": "pii"}])
    assert coll(plain).get(ids=["pii"])["ids"] == []
    assert coll(cleared).get(ids=["pii"])["ids"] == ["pii"]


def test_a_label_change_is_decided_as_redistribute(labelled: tuple[Server, Path, Path]) -> None:
    """A row on legal hold: its owner may update its content but not delete it or change its labels (a
    redistribute, forbidden by legal-hold-stays) — until it uses a key of the same agent that carries the
    role records-manager. Roles belong to the key that authenticates the request."""
    side, ledger_path, log = labelled
    tenant = f"lab{uuid.uuid4().hex[:8]}"
    ledger = SQLiteLedger(ledger_path)
    try:
        admin = ledger.create_key("admin", tenant, None, None, 0)[1]
        owner = ledger.create_key("agent", tenant, "red", "owner", 1)[1]
        keeper = ledger.create_key("agent", tenant, "red", "owner", 1, roles=["records-manager"])[1]
    finally:
        ledger.close()
    adm = admin_client(side.port, {"X-API-Key": admin})
    adm.create_tenant(tenant)
    adm.create_database("default_database", tenant=tenant)
    cid = str(chroma_client(side.port, tenant, {"X-API-Key": admin}).create_collection("mem").id)
    base = f"/api/v2/tenants/{tenant}/databases/default_database/collections/{cid}"
    with httpx.Client(base_url=side.url, trust_env=False, timeout=30) as http:
        def post(key: str, op: str, body: dict[str, object]) -> httpx.Response:
            return http.post(f"{base}/{op}", headers={"X-API-Key": key}, json=body)

        r = post(owner, "add", {"ids": ["held"], "embeddings": [[1.0, 0.0]], "documents": ["contract v1"],
                                "metadatas": [{"mw_labels": "legal-hold"}]})
        assert r.status_code == 200, r.text
        r = post(owner, "update", {"ids": ["held"], "documents": ["contract v2"]})
        assert r.status_code == 200, r.text
        r = post(owner, "update", {"ids": ["held"], "metadatas": [{"mw_labels": ""}]})
        event = decision(log, r.headers["x-request-id"])
        assert r.status_code == 403, r.text
        assert (event["action"], event["deny_action"], event["reason"], event["deny_policies"]) == (
            "update", "redistribute", "forbid", ["legal-hold-stays"])
        r = post(owner, "update", {"ids": ["held"], "metadatas": [{"mw_scope": "agent", "mw_labels": "legal-hold"}]})
        assert r.status_code == 403, r.text                                 # a re-scope is redistribute too
        r = post(owner, "delete", {"ids": ["held"]})          # readable, not deletable: 403 (tests/conformance)
        assert r.status_code == 403, r.text
        event = decision(log, r.headers["x-request-id"])
        assert (event["decision"], event["deny_policies"]) == ("deny", ["legal-hold-stays"]), event
        # Restating the same labels changes nothing: no redistribute is asked for.
        r = post(owner, "update", {"ids": ["held"], "metadatas": [{"mw_labels": "legal-hold"}]})
        assert r.status_code == 200, r.text                                 # (a redistribute would be 403)
        got = post(owner, "get", {"ids": ["held"], "include": ["documents", "metadatas"]}).json()
        assert got["documents"] == ["contract v2"] and got["metadatas"][0]["mw_labels"] == "legal-hold"
        # The same agent through its records-manager key lifts the hold, then the row can be deleted.
        r = post(keeper, "update", {"ids": ["held"], "metadatas": [{"mw_labels": ""}]})
        assert r.status_code == 200, r.text
        assert "redistribute-trust-ladder" in decision(log, r.headers["x-request-id"])["policies"]
        r = post(owner, "delete", {"ids": ["held"]})
        assert r.status_code == 200 and r.json() == {"deleted": 1}, r.text
        assert post(owner, "get", {"ids": ["held"]}).json()["ids"] == []


def test_adopt_rules_assign_labels_a_policy_reads(labelled: tuple[Server, Path, Path], chroma_server: Server,
                                                   tmp_path: Path) -> None:
    """`memwarden adopt` rules give adopted rows labels — from a [[map]] entry, the collection's layer, or a
    metadata key (`[scope_from] labels_key`) — and the labels policy of examples/labels-and-roles then decides
    reads of the adopted rows as it does for rows written through the sidecar."""
    side, ledger_path, _ = labelled
    tenant = f"lab{uuid.uuid4().hex[:8]}"
    ledger = SQLiteLedger(ledger_path)
    try:
        admin = ledger.create_key("admin", tenant, None, None, 0)[1]
        plain = ledger.create_key("agent", tenant, "red", "plain", 1)[1]
        cleared = ledger.create_key("agent", tenant, "red", "cleared", 1, roles=["pii-reader"])[1]
        ledger.create_key("agent", tenant, "red", "importer", 1)
    finally:
        ledger.close()
    direct = admin_client(chroma_server.port)  # straight into Chroma, as an application without memwarden
    direct.create_tenant(tenant)
    direct.create_database("default_database", tenant=tenant)
    legacy = chroma_client(chroma_server.port, tenant).create_collection("legacy")
    vec = unit_vectors(4, seed=9)
    legacy.add(ids=["hr", "tagged", "menu", "bad"], embeddings=vec, documents=["salary of r2", "ssn of r3", "lunch", "x"],
               metadatas=[{"kind": "hr"}, {"kind": "note", "tags": "pii, finance"}, {"kind": "note"},
                          {"kind": "note", "tags": "p ii"}])
    rules = tmp_path / "rules.toml"
    rules.write_text(f'''tenant = "{tenant}"

[[collection]]
name = "legacy"
owner = "red/importer"
scope = "fleet"
labels = ["imported"]

[scope_from]
key = "visibility"
labels_key = "tags"

[[map]]
metadata = {{ kind = "hr" }}
owner = "red/importer"
labels = ["pii", "imported"]
''')
    exe = Path(sys.executable).with_name("memwarden")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")}
    r = subprocess.run([str(exe), "adopt", "chroma", "--rules", str(rules), "--ledger", str(ledger_path),
                        "--backend-url", chroma_server.url, "--format", "json"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    (rep,) = json.loads(r.stdout)
    assert rep["adopted"] == 3 and rep["by_label"] == {"finance": 1, "imported": 2, "pii": 2}, rep
    assert [u["id"] for u in rep["uncovered"]] == ["bad"]

    def coll(key: str) -> chromadb.api.models.Collection.Collection:
        return chroma_client(side.port, tenant, {"X-API-Key": key}).get_collection("legacy")

    got = coll(cleared).get(include=["metadatas"])
    assert {i: m.get("mw_labels") for i, m in zip(got["ids"], got["metadatas"])} == {
        "hr": "imported,pii", "tagged": "finance,pii", "menu": "imported"}
    assert sorted(coll(plain).get()["ids"]) == ["menu"]  # pii-read-needs-role: the labelled rows are hidden
    assert coll(plain).query(query_embeddings=[vec[0]], n_results=4)["ids"][0] == ["menu"]
    assert coll(plain).count() == 1 and coll(cleared).count() == 3
    assert sorted(coll(admin).get()["ids"]) == ["hr", "menu", "tagged"]
