"""Unit tests: schema parsing (both formats), policy location, policy unit-test files,
and translator semantics that the fixtures do not reach (overflow, records, `is ... in`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from invariants.catalog import check_invariants, load_invariants
from invariants.engine import parse_text
from invariants.errors import PolicyInvalid, SchemaSyntaxError, SchemaUnsupported, PolicyTestFileError
from invariants.policytests import run_test_file
from invariants.schema import LONG, STRING, TEntity, TSet, parse_schema

from .conftest import SCHEMA

SCHEMA_TEXT = SCHEMA.read_text()
MODEL = parse_schema(SCHEMA_TEXT)


def test_human_schema_model() -> None:
    agent = MODEL.entities["Agent"]
    assert agent.member_of == ("Fleet",)
    assert agent.attrs.get("trust").type == LONG  # type: ignore[union-attr]
    assert agent.attrs.get("roles").type == TSet(STRING)  # type: ignore[union-attr]
    mem = MODEL.entities["Memory"].attrs
    assert mem.get("subject").required is False and mem.get("owner").type == TEntity("Agent")  # type: ignore[union-attr]
    assert MODEL.ancestor_types("Collection") == {"Namespace", "Tenant"}
    assert MODEL.actions["redistribute"].context.get("target_fleet").type == TEntity("Fleet")  # type: ignore[union-attr]
    assert len(MODEL.applicable_actions()) == 14
    assert MODEL.actions["configure"].principals == ("Operator", "TenantAdmin", "Agent")
    assert MODEL.entities["Operator"].attrs.fields == ()


def test_json_schema_and_action_groups() -> None:
    doc = {"": {"entityTypes": {"User": {"memberOfTypes": ["Group"], "shape": {"type": "Record", "attributes": {
        "level": {"type": "Long"}, "nick": {"type": "String", "required": False}}}}, "Group": {}},
        "actions": {"rw": {}, "read": {"memberOf": [{"id": "rw"}], "appliesTo": {
            "principalTypes": ["User"], "resourceTypes": ["Group"]}}}}}
    s = parse_schema(json.dumps(doc))
    assert s.entities["User"].attrs.get("nick").required is False  # type: ignore[union-attr]
    assert s.action_ancestors("read") == {"rw"}
    assert s.applicable_actions() == ["read"]


def test_human_schema_common_types_groups_and_errors() -> None:
    s = parse_schema('type Ctx = { n?: Long };\nentity U;\naction g;\naction "do it" in [g] '
                     'appliesTo { principal: U, resource: [U], context: Ctx };')
    assert s.actions["do it"].member_of == ("g",)
    assert s.actions["do it"].context.get("n").required is False  # type: ignore[union-attr]
    with pytest.raises(SchemaSyntaxError) as e:
        parse_schema("entity A {\n  x: Nope,\n};")
    assert "Nope" in str(e.value)
    with pytest.raises(SchemaUnsupported):
        parse_schema("namespace N { entity A; }")


def test_policy_lines_and_ids() -> None:
    pf = parse_text('// c\n\npermit (principal, action, resource);\n@id("x")\n// note\n'
                    'forbid (principal, action, resource) when { "a;b" == "}" };\n', "f.cedar")
    assert [(p.line, p.id) for p in pf.policies] == [(3, "f.cedar:3"), (4, "x")]
    with pytest.raises(PolicyInvalid) as e:
        parse_text('permit (principal, action, resource);\n\nforbid (principal action resource);', "g.cedar")
    assert e.value.problems[0][:2] == ("g.cedar", 3)


def test_policy_test_file_errors(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text('{"cases": [{"principal": {"type": "Agent", "id": "a"}}]}')
    with pytest.raises(PolicyTestFileError):
        run_test_file(f, [], SCHEMA_TEXT)
    f.write_text("not json")
    with pytest.raises(PolicyTestFileError):
        run_test_file(f, [], SCHEMA_TEXT)


def _check(policies: str, invariants: str) -> dict[tuple[str, str], object]:
    pols = parse_text(policies, "p.cedar").policies
    invs = load_invariants(parse_text(invariants, "i.cedar").policies)
    return {(r.invariant, r.action): r for r in check_invariants(MODEL, SCHEMA_TEXT, pols, invs, 10)}


NEVER = '@id("never-errors") @kind("never-errors") permit (principal, action, resource);'


def test_long_overflow_is_an_error_caught_by_never_errors() -> None:
    res = _check('@id("bump") forbid (principal is Agent, action == Action::"read", resource is Memory)\n'
                 'when { principal.trust + 1 > 3 };', NEVER)
    r = res[("never-errors", "read")]
    assert r.status == "VIOLATED"  # type: ignore[attr-defined]
    cex = r.counterexample  # type: ignore[attr-defined]
    agent = next(e for e in cex["entities"] if e["uid"] == cex["request"]["principal"])
    assert agent["attrs"]["trust"] == 2 ** 63 - 1
    assert cex["cedar"]["errors"] == ["bump"]
    assert res[("never-errors", "write")].status == "PROVED"  # type: ignore[attr-defined]


def test_context_record_and_is_in() -> None:
    inv = ('@id("same-tenant-target") permit (principal, action == Action::"redistribute", resource)\n'
           'when { context.target_fleet is Fleet in principal.tenant };')
    ok = ('@id("p") permit (principal is Agent, action == Action::"redistribute", resource is Memory)\n'
          'when { context.target_fleet in principal.tenant && context.target_scope like "f*" };')
    assert _check(ok, inv)[("same-tenant-target", "redistribute")].status == "PROVED"  # type: ignore[attr-defined]
    bad = ok.replace("context.target_fleet in principal.tenant", "context.target_fleet in resource.tenant")
    r = _check(bad, inv)[("same-tenant-target", "redistribute")]
    assert r.status == "VIOLATED"  # type: ignore[attr-defined]
    assert r.counterexample["request"]["context"]["target_scope"].startswith("f")  # type: ignore[attr-defined]


def test_hierarchy_is_transitive_in_counterexamples() -> None:
    # Allowed only through Agent -> Fleet -> Tenant; the counterexample must carry both edges.
    pols = ('@id("p") permit (principal is Agent, action == Action::"read", resource is Memory)\n'
            'when { principal in resource.tenant };')
    inv = '@id("never") permit (principal, action == Action::"read", resource) when { false };'
    r = _check(pols, inv)[("never", "read")]
    assert r.status == "VIOLATED"  # type: ignore[attr-defined]
    assert r.counterexample["cedar"]["decision"] == "allow"  # type: ignore[attr-defined]


GROUPS_SCHEMA = {"": {
    "entityTypes": {
        "User": {"memberOfTypes": ["Team"], "shape": {"type": "Record", "attributes": {
            "profile": {"type": "Record", "attributes": {
                "level": {"type": "Long"}, "nick": {"type": "String", "required": False}}},
            "team": {"type": "Entity", "name": "Team"}}}},
        "Team": {},
        "Doc": {"shape": {"type": "Record", "attributes": {"owner": {"type": "Entity", "name": "User"}}}}},
    "actions": {
        "readish": {},
        "view": {"memberOf": [{"id": "readish"}], "appliesTo": {
            "principalTypes": ["User"], "resourceTypes": ["Doc"],
            "context": {"type": "Record", "attributes": {"reason": {"type": "String", "required": False}}}}},
        "edit": {"appliesTo": {"principalTypes": ["User"], "resourceTypes": ["Doc"]}}}}}


def test_records_optional_context_and_action_groups_replay() -> None:
    text = json.dumps(GROUPS_SCHEMA)
    schema = parse_schema(text)
    pols = parse_text(
        '@id("p") permit (principal, action in Action::"readish", resource)\n'
        'when { principal.profile.level >= 2 && principal.profile has nick && '
        'context has reason && context.reason like "audit*" };\n'
        '@id("e") permit (principal, action == Action::"edit", resource) when { resource.owner == principal };',
        "p.cedar").policies
    invs = load_invariants(parse_text(
        '@id("level-3") permit (principal, action in Action::"readish", resource) '
        'when { principal.profile.level >= 3 };\n'
        '@id("owners") permit (principal, action == Action::"edit", resource) when { resource.owner == principal };\n'
        '@id("ne") @kind("never-errors") permit (principal, action, resource);', "i.cedar").policies)
    res = {(r.invariant, r.action): r for r in check_invariants(schema, text, pols, invs, 10)}
    r = res[("level-3", "view")]
    assert r.status == "VIOLATED", r
    cex = r.counterexample
    assert cex is not None
    user = next(e for e in cex["entities"] if e["uid"] == cex["request"]["principal"])
    assert user["attrs"]["profile"]["level"] == 2 and "nick" in user["attrs"]["profile"]
    assert cex["request"]["context"]["reason"].startswith("audit")
    assert res[("owners", "edit")].status == "PROVED"
    assert res[("ne", "view")].status == "PROVED"


def test_unsupported_schema_is_unknown_exit_3(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from invariants.cli import app

    (tmp_path / "s.cedarschema").write_text("namespace App { entity U; }")
    (tmp_path / "p.cedar").write_text("permit (principal, action, resource);")
    assert CliRunner().invoke(app, [str(tmp_path)]).exit_code == 3
