"""Constructs the translation does not model answer UNKNOWN (exit 3) naming the construct and its file:line —
never PROVED, and a valid template is never "invalid" (issue 12, part 1)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from invariants.engine import authorize, parse_text

from .conftest import POLICIES, SCHEMA
from .test_policy_check import run_json


def _dir(tmp_path: Path, name: str, text: str, schema: str | None = None) -> Path:
    d = tmp_path / "pol"
    shutil.copytree(POLICIES, d)
    shutil.rmtree(d / "tests")
    (d / name).write_text(text, encoding="utf-8")
    if schema is not None:
        (d / "memwarden.cedarschema").write_text(schema, encoding="utf-8")
    return d


def _by_action(rep: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in rep["results"]:
        out.setdefault(r["action"], set()).add(r["status"])
    return out


TEMPLATE = ('// sharing links\n@id("share-row")\npermit (principal == ?principal, action == Action::"read", '
            'resource in ?resource);\n')


def test_template_is_unknown_not_invalid(tmp_path: Path) -> None:
    d = _dir(tmp_path, "zz-template.cedar", TEMPLATE)
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 3, rep
    by = _by_action(rep)
    assert by["read"] == {"UNKNOWN"}  # every invariant on read; never PROVED
    assert by["write"] == {"PROVED"}  # the template is about read only
    msgs = {r["message"] for r in rep["results"] if r["status"] == "UNKNOWN"}
    assert msgs and all("template slot ?principal" in m and "zz-template.cedar:2" in m and "share-row" in m
                        for m in msgs), msgs


def test_template_without_action_constraint_is_unknown_everywhere(tmp_path: Path) -> None:
    d = _dir(tmp_path, "zz-template.cedar", 'forbid (principal, action, resource == ?resource);\n')
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 3
    assert {s for ss in _by_action(rep).values() for s in ss} == {"UNKNOWN"}
    assert all("?resource" in r["message"] and "zz-template.cedar:1" in r["message"] for r in rep["results"])


def test_unlinked_template_is_replayed_as_cedar_does() -> None:
    """cedarpy accepts a policy set with a template and ignores it until linked; so does the replay."""
    pols = parse_text(TEMPLATE + 'permit (principal, action, resource);\n', "x.cedar").policies
    assert [p.template for p in pols] == [True, False] and pols[0].id == "share-row" and pols[0].line == 2
    req = {"principal": {"type": "Agent", "id": "a"}, "action": {"type": "Action", "id": "read"},
           "resource": {"type": "Memory", "id": "m"}, "context": {}}
    assert authorize(req, pols, [], None).allow


EXTENSIONS = [
    ("ip", 'forbid (principal, action, resource) when { ip("10.0.0.1").isLoopback() };', "isLoopback()"),
    ("ip-range", 'forbid (principal, action, resource) when { ip("10.0.0.1").isInRange(ip("10.0.0.0/8")) };',
     "isInRange()"),
    ("decimal", 'forbid (principal, action, resource) when { decimal("1.5").lessThan(decimal("2.0")) };',
     "lessThan()"),
    ("datetime", 'forbid (principal, action, resource) when { datetime("2024-01-01").toDate() == '
                 'datetime("2024-01-01") };', "toDate()"),
    ("duration", 'forbid (principal, action, resource) when { duration("1h").toMinutes() == 60 };', "toMinutes()"),
]


@pytest.mark.parametrize("name,text,construct", EXTENSIONS, ids=[e[0] for e in EXTENSIONS])
def test_extension_function_is_unknown(name: str, text: str, construct: str, tmp_path: Path) -> None:
    d = _dir(tmp_path, "zz-ext.cedar", "\n" + text + "\n")
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 3, rep.get("invalid")
    assert {s for ss in _by_action(rep).values() for s in ss} == {"UNKNOWN"}
    r = rep["results"][0]["message"]
    assert "extension function" in r and construct in r and "zz-ext.cedar:2" in r, r


def _tagged_schema() -> str:
    text = SCHEMA.read_text(encoding="utf-8")
    start = text.index("entity Memory in [Fleet] {")
    end = text.index("};", start)
    return text[:end] + "} tags String;" + text[end + 2:]


@pytest.mark.parametrize("expr,construct", [('resource.hasTag("pii")', "hasTag"),
                                            ('resource.hasTag("pii") && resource.getTag("pii") == "x"', "hasTag")])
def test_entity_tags_are_unknown(expr: str, construct: str, tmp_path: Path) -> None:
    text = f'\n\n@id("pii-forbid")\nforbid (principal, action, resource is Memory) when {{ {expr} }};\n'
    d = _dir(tmp_path, "zz-tags.cedar", text, _tagged_schema())
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 3, rep.get("invalid")
    unknown = [r for r in rep["results"] if r["status"] == "UNKNOWN"]
    assert unknown and all(f"entity tags ({construct})" in r["message"] and "zz-tags.cedar:3" in r["message"]
                           for r in unknown)
    # the forbid is about rows: request-level actions are still proved, row actions never are
    by = _by_action(rep)
    assert by["read"] == {"UNKNOWN"} and by["search"] == {"PROVED"}


def test_schema_with_tags_but_no_policy_using_them_proves(tmp_path: Path) -> None:
    d = _dir(tmp_path, "zz-none.cedar", "// nothing\n", _tagged_schema())
    code, rep = run_json(str(d), "--counterexamples", str(tmp_path / "c"))
    assert code == 0 and {r["status"] for r in rep["results"]} == {"PROVED"}


def test_enumerated_entity_type_is_unknown_with_schema_line(tmp_path: Path) -> None:
    from .test_policy_check import run

    schema = SCHEMA.read_text(encoding="utf-8") + '\nentity Colour enum ["red", "blue"];\n'
    d = _dir(tmp_path, "zz-none.cedar", "// nothing\n", schema)
    code, out = run(str(d), "--counterexamples", str(tmp_path / "c"))
    lines = schema.count("\n")
    assert code == 3 and "enumerated entity type" in out and f"memwarden.cedarschema:{lines}" in out, out
