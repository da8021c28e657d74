"""The default policy set through the PDP adapter, and fail-closed loading/evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import PolicyLoadError
from sidecar.governance import Principal, Row, fleet_entity, row_entities
from sidecar.policy import CedarRequest, PolicyEngine

POLICIES = Path(__file__).resolve().parents[2] / "policies"


@pytest.fixture(scope="module")
def engine() -> PolicyEngine:
    return PolicyEngine.load(POLICIES)


def agent(name: str, fleet: str = "red", trust: int = 1, tenant: str = "t") -> Principal:
    return Principal("agent", "k", tenant, fleet, name, trust)


def row(scope: str, owner: str = "t/red/o", fleet: str = "red", status: str = "active", tenant: str = "t",
        readers: tuple[str, ...] = ()) -> Row:
    return Row("chroma", "c", "r", tenant, fleet, owner, scope, owner, 0, status=status, readers=readers)


def allowed(engine: PolicyEngine, p: Principal, action: str, r: Row, ctx: dict | None = None) -> bool:
    entities = row_entities(p, [r], {})
    target = (ctx or {}).get("target_fleet", {}).get("__entity")
    if target:  # as the Authorizer does: a fleet named in the context comes with its tenant
        tenant, _, fleet = target["id"].partition("/")
        entities.append(fleet_entity(tenant, fleet))
    return engine.decide([CedarRequest(p.uid, action, r.uid, ctx)], entities)[0].allowed


@pytest.mark.parametrize("scope,reader,expected", [
    ("agent", agent("o"), True), ("agent", agent("x"), False), ("agent", agent("x", trust=3), False),
    ("fleet", agent("x", trust=0), True), ("fleet", agent("x", "blue", 1), False), ("fleet", agent("x", "blue", 2), True),
    ("tenant", agent("x", "blue", 0), True), ("tenant", agent("x", tenant="u"), False),
    ("restricted", agent("x"), False), ("restricted", agent("o"), False),
])
def test_read_scopes(engine: PolicyEngine, scope: str, reader: Principal, expected: bool) -> None:
    assert allowed(engine, reader, "read", row(scope)) is expected


def test_restricted_readers_and_deleted_rows(engine: PolicyEngine) -> None:
    assert allowed(engine, agent("x", "blue", 0), "read", row("restricted", readers=("t/blue/x",)))
    for scope in ("agent", "fleet", "tenant"):
        assert not allowed(engine, agent("o"), "read", row(scope, status="deleted"))
    admin = Principal("admin", "k", "t")
    assert allowed(engine, admin, "read", row("agent"))
    assert not allowed(engine, admin, "read", row("agent", status="deleted"))
    assert not allowed(engine, admin, "read", row("agent", tenant="u"))


def test_trust_ladder(engine: PolicyEngine) -> None:
    def write(trust: int, fleet: str) -> bool:
        p = agent("o", "red", trust)
        return allowed(engine, p, "write", row("fleet", owner=p.uid[1], fleet=fleet))
    assert [write(t, "red") for t in range(4)] == [False, True, True, True]
    assert [write(t, "blue") for t in range(4)] == [False, False, False, True]
    p = agent("o", "red", 1)
    ctx_home = {"target_fleet": {"__entity": {"type": "Fleet", "id": "t/red"}}, "target_scope": "tenant"}
    ctx_blue = {"target_fleet": {"__entity": {"type": "Fleet", "id": "t/blue"}}, "target_scope": "fleet"}
    assert allowed(engine, p, "redistribute", row("fleet", owner="t/red/o"), ctx_home)
    assert not allowed(engine, p, "redistribute", row("fleet", owner="t/red/o"), ctx_blue)
    assert allowed(engine, agent("o", "red", 3), "redistribute", row("fleet", owner="t/red/o"), ctx_blue)
    ctx_other_tenant = {"target_fleet": {"__entity": {"type": "Fleet", "id": "u/red"}}, "target_scope": "fleet"}
    assert not allowed(engine, agent("o", "red", 3), "redistribute", row("fleet", owner="t/red/o"), ctx_other_tenant)


def test_policy_ids_are_the_annotations(engine: PolicyEngine) -> None:
    p = agent("x", trust=0)
    d = engine.decide([CedarRequest(p.uid, "read", row("tenant").uid)], row_entities(p, [row("tenant")], {}))[0]
    assert d.allowed and d.policies == ("read-tenant-scope",)


def test_engine_errors_deny(engine: PolicyEngine) -> None:
    p = agent("o")
    r = row("agent", owner="t/red/o")
    bad = row_entities(p, [r], {})
    bad[0]["attrs"]["trust"] = "high"  # violates the schema
    decisions = engine.decide([CedarRequest(p.uid, "read", r.uid)] * 3, bad)
    assert [d.allowed for d in decisions] == [False, False, False]
    assert all(d.errors for d in decisions)


def test_load_failures_are_clear(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="does not exist"):
        PolicyEngine.load(tmp_path / "missing")
    (tmp_path / "s.cedarschema").write_text((POLICIES / "memwarden.cedarschema").read_text())
    with pytest.raises(PolicyLoadError, match="no \\*.cedar"):
        PolicyEngine.load(tmp_path)
    (tmp_path / "p.cedar").write_text("permit(principal, action, resource) when { resource.nope == 1 };")
    with pytest.raises(PolicyLoadError, match="validate"):
        PolicyEngine.load(tmp_path)
    (tmp_path / "p.cedar").write_text("permit(principal, action, resource) when {")
    with pytest.raises(PolicyLoadError, match="parse"):
        PolicyEngine.load(tmp_path)
    (tmp_path / "s.cedarschema").write_text("entity ???")
    with pytest.raises(PolicyLoadError, match="schema"):
        PolicyEngine.load(tmp_path)
