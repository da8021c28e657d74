"""Governance classes: when may rows share one Cedar decision?

The sidecar decides a batch of rows (`read` of a query's candidates, `write` of an add's rows) once per
*governance class* instead of once per row: rows whose entity data agree on every attribute the policy
set reads, and on their ancestors (fleet, tenant), get the decision of one of them. That is sound when
no policy can tell two such rows apart, i.e. when the decision on ``Memory::"x"`` is a function of the
principal, action, context and those attributes. `analyse` checks this on the policy set (Cedar's JSON
policy format, EST) and the schema, and returns the attributes the class key must hold:

- every use of the ``resource`` variable is an attribute access or ``has`` test (the attribute joins
  the key), an ``is`` test (one type for all rows), or the left side of ``in`` (which depends on the
  row's ancestors only, part of every key) whose right side names no ``Memory`` entity;
- no ``Memory`` entity literal appears anywhere (a policy naming one row distinguishes it), and no
  scope constraint ``resource == Memory::…`` / ``resource in Memory::…``;
- no policy is a template (slots are filled per link, not known here);
- the schema declares no attribute (of any entity or context) whose type holds ``Memory``, so no
  expression reaches another row than the resource, and a row's decision does not depend on which
  other rows share its entity store.

When an attribute whose value is an entity (``owner``) is read, the key holds that entity's data as
well (its attributes and parents), since policies may read through it (``resource.owner.trust``).
Anything else — a policy outside these forms — makes `analyse` answer ``sound=False`` with the
reason, and the sidecar falls back to one decision per row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import cedarpy

from invariants.schema import CedarType, Schema, TEntity, TRecord, TSet, parse_schema

RESOURCE_TYPE = "Memory"


@dataclass(frozen=True)
class ClassAnalysis:
    """`sound`: rows agreeing on `attributes` (and ancestors) may share a decision; else `reason` says why not."""

    sound: bool
    attributes: frozenset[str] = frozenset()
    reason: str = ""

    def describe(self) -> str:
        if not self.sound:
            return f"per row ({self.reason})"
        return "per class of " + (", ".join(sorted(self.attributes)) or "ancestors only")


class _Unsound(Exception):
    pass


def _is_resource(node: Any) -> bool:
    return isinstance(node, dict) and node.get("Var") == "resource"


def _literal_memory(value: Any) -> bool:
    """Whether a JSON value (an EST ``Value``) holds a Memory entity reference."""
    if isinstance(value, dict):
        ent = value.get("__entity")
        if isinstance(ent, dict) and ent.get("type") == RESOURCE_TYPE:
            return True
        if value.get("type") == RESOURCE_TYPE and "id" in value and len(value) == 2:
            return True
        return any(_literal_memory(v) for v in value.values())
    if isinstance(value, list):
        return any(_literal_memory(v) for v in value)
    return False


def _walk(node: Any, read: set[str], where: str) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, read, where)
        return
    if not isinstance(node, dict):
        return
    if _is_resource(node):
        raise _Unsound(f"{where} uses the resource itself, not one of its attributes")
    if "Value" in node:
        if _literal_memory(node["Value"]):
            raise _Unsound(f"{where} names a {RESOURCE_TYPE} entity")
        return
    if "Slot" in node:
        raise _Unsound(f"{where} is a template")
    for op in (".", "has"):
        if op in node and isinstance(node[op], dict) and _is_resource(node[op].get("left")):
            read.add(str(node[op].get("attr")))
            return
    if "is" in node and isinstance(node["is"], dict) and _is_resource(node["is"].get("left")):
        if "in" in node["is"]:
            _walk(node["is"]["in"], read, where)
        return
    if "in" in node and isinstance(node["in"], dict) and _is_resource(node["in"].get("left")):
        _walk(node["in"].get("right"), read, where)
        return
    for value in node.values():
        _walk(value, read, where)


def _holds_resource_type(t: CedarType) -> bool:
    if isinstance(t, TEntity):
        return t.name == RESOURCE_TYPE
    if isinstance(t, TSet):
        return _holds_resource_type(t.elem)
    if isinstance(t, TRecord):
        return any(_holds_resource_type(a.type) for _, a in t.fields)
    return False


def _schema_reason(schema: Schema) -> str | None:
    for name, decl in schema.entities.items():
        for attr, a in decl.attrs.fields:
            if _holds_resource_type(a.type):
                return f"the schema's {name}.{attr} holds {RESOURCE_TYPE} entities"
    for name, act in schema.actions.items():
        for attr, a in act.context.fields:
            if _holds_resource_type(a.type):
                return f"the context of action {name} ({attr}) holds {RESOURCE_TYPE} entities"
    return None


def analyse(policies_text: str, schema_text: str) -> ClassAnalysis:
    """Whether rows may be decided per governance class under this policy set and schema, and the
    resource attributes the class key must hold. Never raises: a policy set or schema it cannot read
    is answered ``sound=False``."""
    try:
        est = json.loads(cedarpy.policies_to_json_str(policies_text))
        schema = parse_schema(schema_text)
    except Exception as exc:  # unparsable: no claim
        return ClassAnalysis(False, reason=f"not analysed: {type(exc).__name__}")
    reason = _schema_reason(schema)
    if reason:
        return ClassAnalysis(False, reason=reason)
    if est.get("templates") or est.get("templateLinks"):
        return ClassAnalysis(False, reason="the policy set has templates")
    read: set[str] = set()
    try:
        for name, policy in (est.get("staticPolicies") or {}).items():
            where = f"policy {(policy.get('annotations') or {}).get('id') or name}"
            scope = policy.get("resource") or {}
            if scope.get("slot"):
                raise _Unsound(f"{where} is a template")
            for key in ("entity", "entities"):
                if _literal_memory(scope.get(key)):
                    raise _Unsound(f"{where} constrains the resource to a {RESOURCE_TYPE} entity")
            if scope.get("in") and _literal_memory(scope["in"]):
                raise _Unsound(f"{where} constrains the resource to a {RESOURCE_TYPE} entity")
            for part in ("principal", "action"):
                if _literal_memory(policy.get(part)):
                    raise _Unsound(f"{where} names a {RESOURCE_TYPE} entity")
            for cond in policy.get("conditions") or []:
                _walk(cond.get("body"), read, where)
    except _Unsound as exc:
        return ClassAnalysis(False, reason=str(exc))
    return ClassAnalysis(True, frozenset(read))
