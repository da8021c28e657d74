"""Hypothesis strategies: schema-conforming Cedar policies, entity stores and requests
for the memwarden schema (policies/memwarden.cedarschema).

Policies are generated as Cedar source text from a typed expression grammar, so that
(almost) every generated policy passes Cedar's strict validation; the differential
test discards the rare invalid one.  Entity ids come from a small fixed universe so
that literals, attribute values and the request collide often, and some referenced
entities are deliberately absent from the store (dangling references).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from invariants.schema import Schema, TBool, TEntity, TLong, TRecord, TSet, TString, CedarType

IDS: dict[str, list[str]] = {
    "Tenant": ["t1", "t2"],
    "Fleet": ["t1/f1", "t1/f2", "t2/f1"],
    "Agent": ["t1/f1/a1", "t1/f2/a2", "t2/f1/a3"],
    "TenantAdmin": ["t1/admin/k1", "t2/admin/k2"],
    "Namespace": ["t1/db", "t2/db"],
    "Collection": ["chroma:c1", "chroma:c2"],
    "Memory": ["m1", "m2", "m3"],
    "Operator": ["op1", "op2"],
    "Deployment": ["chroma", "mem0:default"],
}
STRINGS = ["", "agent", "fleet", "tenant", "restricted", "deleted", "active", "t1", "t1/x", "t10/x", "a*b", "ü"]
LONGS = [0, 1, 2, 3, -1, 9223372036854775807, -9223372036854775807, 4611686018427387904]
PATTERNS = ["t1*", "*", "*leet", "a\\*b", "t1/*", "", "*e*", "deleted"]


def q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


@dataclass(frozen=True)
class Env:
    action: str
    ptype: str
    rtype: str


def envs(schema: Schema) -> list[Env]:
    return [Env(a, p, r) for a in schema.applicable_actions()
            for p in schema.actions[a].principals for r in schema.actions[a].resources]


# ------------------------------------------------------------------ expressions
def _paths(schema: Schema, env: Env) -> list[tuple[str, CedarType, str | None]]:
    """(expression, type, guard) for variables and attribute chains (depth <= 2);
    guard is a Bool expression that must hold before the access is safe."""
    out: list[tuple[str, CedarType, str | None]] = [
        ("principal", TEntity(env.ptype), None), ("resource", TEntity(env.rtype), None)]
    for n, a in schema.actions[env.action].context.fields:
        out.append((f"context.{n}", a.type, None if a.required else f"context has {n}"))
    frontier = list(out)
    for _ in range(2):
        nxt = []
        for expr, ty, guard in frontier:
            if isinstance(ty, TEntity) and ty.name in schema.entities:
                for n, a in schema.entities[ty.name].attrs.fields:
                    g = guard
                    if not a.required:
                        g = f"{guard} && {expr} has {n}" if guard else f"{expr} has {n}"
                    nxt.append((f"{expr}.{n}", a.type, g))
        out += nxt
        frontier = nxt
    return out


def _literal(ty: CedarType, draw: Any) -> str:
    if isinstance(ty, TBool):
        return draw(st.sampled_from(["true", "false"]))
    if isinstance(ty, TLong):
        return str(draw(st.sampled_from(LONGS)))
    if isinstance(ty, TString):
        return q(draw(st.sampled_from(STRINGS)))
    if isinstance(ty, TEntity):
        return f"{ty.name}::{q(draw(st.sampled_from(IDS[ty.name])))}"
    if isinstance(ty, TSet):
        n = draw(st.integers(1, 3))
        return "[" + ", ".join(_literal(ty.elem, draw) for _ in range(n)) + "]"
    raise AssertionError(ty)


class ExprGen:
    def __init__(self, schema: Schema, env: Env, draw: Any) -> None:
        self.schema, self.env, self.draw = schema, env, draw
        self.paths = _paths(schema, env)

    def _typed_paths(self, ty: CedarType) -> list[tuple[str, str | None]]:
        return [(e, g) for e, t, g in self.paths if t == ty]

    def _path(self, ty: CedarType) -> str | None:
        cands = self._typed_paths(ty)
        if not cands:
            return None
        e, g = self.draw(st.sampled_from(cands))
        if g is None:
            return e
        return f"(if {g} then {e} else {_literal(ty, self.draw)})"

    def of(self, ty: CedarType, depth: int) -> str:
        d = self.draw
        if depth <= 0 or d(st.integers(0, 3)) == 0:
            p = self._path(ty) if d(st.booleans()) else None
            return p if p is not None else _literal(ty, d)
        if isinstance(ty, TBool):
            return self.boolean(depth)
        if isinstance(ty, TLong):
            k = d(st.integers(0, 4))
            if k == 0:
                return f"({self.of(ty, depth - 1)} {d(st.sampled_from(['+', '-', '*']))} {self.of(ty, depth - 1)})"
            if k == 1:
                return f"(-{self.of(ty, depth - 1)})"
            if k == 2:
                return f"(if {self.boolean(depth - 1)} then {self.of(ty, depth - 1)} else {self.of(ty, depth - 1)})"
        if isinstance(ty, (TEntity, TString, TSet)) and d(st.integers(0, 3)) == 0:
            return f"(if {self.boolean(depth - 1)} then {self.of(ty, depth - 1)} else {self.of(ty, depth - 1)})"
        p = self._path(ty)
        return p if p is not None else _literal(ty, d)

    def _entity_type(self) -> str:
        return self.draw(st.sampled_from(sorted(IDS)))

    def boolean(self, depth: int) -> str:
        d = self.draw
        if depth <= 0:
            return d(st.sampled_from(["true", "false"])) if d(st.booleans()) else self._atom(0)
        k = d(st.integers(0, 5))
        if k == 0:
            return f"({self.boolean(depth - 1)} {d(st.sampled_from(['&&', '||']))} {self.boolean(depth - 1)})"
        if k == 1:
            return f"(!{self.boolean(depth - 1)})"
        if k == 2:
            return f"(if {self.boolean(depth - 1)} then {self.boolean(depth - 1)} else {self.boolean(depth - 1)})"
        return self._atom(depth - 1)

    def _atom(self, depth: int) -> str:
        d = self.draw
        k = d(st.integers(0, 13))
        if k == 0:
            op = d(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
            return f"({self.of(TLong(), depth)} {op} {self.of(TLong(), depth)})"
        if k == 1:
            return f"({self.of(TString(), depth)} {d(st.sampled_from(['==', '!=']))} {self.of(TString(), depth)})"
        if k == 2:
            t = TEntity(self._entity_type())
            return f"({self.of(t, depth)} {d(st.sampled_from(['==', '!=']))} {self.of(t, depth)})"
        if k == 3:
            t = self._entity_type()
            ups = sorted(self.schema.ancestor_types(t) | {t})
            u = d(st.sampled_from(ups))
            if d(st.booleans()):
                return f"({self.of(TEntity(t), depth)} in {self.of(TEntity(u), depth)})"
            return f"({self.of(TEntity(t), depth)} in {_literal(TSet(TEntity(u)), d)})"
        if k == 4:
            elem = d(st.sampled_from([TString(), TEntity("Agent"), TLong()]))
            return f"{self.of(TSet(elem), depth)}.contains({self.of(elem, depth)})"
        if k == 5:
            elem = d(st.sampled_from([TString(), TEntity("Agent")]))
            m = d(st.sampled_from(["containsAll", "containsAny"]))
            return f"{self.of(TSet(elem), depth)}.{m}({self.of(TSet(elem), depth)})"
        if k == 6:
            pat = d(st.sampled_from(PATTERNS))
            return f"({self.of(TString(), depth)} like {q(pat)})"
        if k == 7:
            cands = [(e, t) for e, t, g in self.paths if isinstance(t, TEntity) and g is None]
            e, t = d(st.sampled_from(cands))
            attrs = [n for n, _ in self.schema.entities[t.name].attrs.fields] if t.name in self.schema.entities else []
            return f"({e} has {d(st.sampled_from(attrs + ['nope']))})"
        if k == 8:
            cands = [e for e, t, g in self.paths if isinstance(t, TEntity) and g is None]
            e = d(st.sampled_from(cands))
            t = self._entity_type()
            if d(st.booleans()):
                u = d(st.sampled_from(sorted(IDS)))
                return f"({e} is {t} in {_literal(TEntity(u), d)})"
            return f"({e} is {t})"
        if k == 9:
            elem = d(st.sampled_from([TString(), TEntity("Agent")]))
            return f"{self.of(TSet(elem), depth)}.isEmpty()"
        if k == 10:  # records: literals, equality, attribute access, has
            a, b = self.of(TLong(), depth), self.of(TString(), depth)
            c, e = self.of(TLong(), depth), self.of(TString(), depth)
            form = d(st.integers(0, 3))
            if form == 0:
                return f"({{n: {a}, s: {b}}} == {{n: {c}, s: {e}}})"
            if form == 1:
                return f"({{n: {a}, s: {b}}} != {{s: {e}, n: {c}}})"
            if form == 2:
                return f"({{n: {a}, s: {b}}}.n == {c})"
            return f"({{n: {a}, s: {b}}} has s)"
        if k == 11:  # action in conditions
            acts = d(st.lists(st.sampled_from(self.schema.applicable_actions()), min_size=1, max_size=3))
            if len(acts) == 1:
                return f'(action == Action::"{acts[0]}")'
            return "(action in [" + ", ".join(f'Action::"{a}"' for a in acts) + "])"
        if k == 12:  # `in` a non-literal set of entities (no ancestry between them)
            if self.env.rtype == "Memory":
                return f"({self.of(TEntity('Agent'), depth)} in resource.readers)"
            return f"({self.of(TEntity('Agent'), depth)} in {_literal(TSet(TEntity('Agent')), d)})"
        cands = [e for e, t, g in self.paths if e.startswith("context") and g is None]
        if cands and self.env.action == "redistribute":
            return f"(context has {d(st.sampled_from(['target_fleet', 'target_scope', 'nope']))})"
        return f"(resource has {d(st.sampled_from(['tenant', 'subject', 'nope']))})"


@st.composite
def policy_text(draw: Any, schema: Schema, idx: int, env: Env | None = None) -> str:
    if env is None or draw(st.integers(0, 3)) == 0:
        env = draw(st.sampled_from(envs(schema)))
    g = ExprGen(schema, env, draw)
    effect = draw(st.sampled_from(["permit", "forbid"]))
    ps = draw(st.sampled_from(["is", "is", "eq", "in", "isin"]))
    pscope = {"is": f"principal is {env.ptype}",
              "eq": f"principal == {_literal(TEntity(env.ptype), draw)}",
              "in": f"principal in {_literal(TEntity(draw(st.sampled_from(sorted(schema.ancestor_types(env.ptype) | {env.ptype})))), draw)}",
              "isin": f"principal is {env.ptype} in {_literal(TEntity(draw(st.sampled_from(sorted(schema.ancestor_types(env.ptype) | {env.ptype})))), draw)}"}[ps]
    if ps == "in":
        pscope = f"principal is {env.ptype}"  # keep the type pinned for attribute access
        extra = f" && principal in {_literal(TEntity(draw(st.sampled_from(sorted(schema.ancestor_types(env.ptype) | {env.ptype})))), draw)}"
    else:
        extra = ""
    same = [a for a in schema.applicable_actions()
            if env.ptype in schema.actions[a].principals and env.rtype in schema.actions[a].resources]
    acts = draw(st.lists(st.sampled_from(same), min_size=1, max_size=3, unique=True))
    if env.action not in acts:
        acts.append(env.action)
    ascope = f'action == Action::"{acts[0]}"' if len(acts) == 1 else \
        "action in [" + ", ".join(f'Action::"{a}"' for a in acts) + "]"
    # An action list must keep the context type fixed: only mix actions with equal context.
    if len({schema.actions[a].context for a in acts}) > 1:
        ascope = f'action == Action::"{env.action}"'
    clauses = []
    for _ in range(draw(st.integers(0, 2))):
        kw = draw(st.sampled_from(["when", "when", "unless"]))
        clauses.append(f"{kw} {{ {g.boolean(draw(st.integers(0, 3)))}{extra if kw == 'when' else ''} }}")
    if extra and not any(c.startswith("when") for c in clauses):
        clauses.append(f"when {{ true{extra} }}")
    return (f'@id("p{idx}")\n{effect} ({pscope}, {ascope}, resource is {env.rtype})\n'
            + "\n".join(clauses) + ";")


def _value(ty: CedarType, draw: Any) -> Any:
    if isinstance(ty, TBool):
        return draw(st.booleans())
    if isinstance(ty, TLong):
        return draw(st.sampled_from(LONGS))
    if isinstance(ty, TString):
        return draw(st.sampled_from(STRINGS))
    if isinstance(ty, TEntity):
        return {"__entity": {"type": ty.name, "id": draw(st.sampled_from(IDS[ty.name]))}}
    if isinstance(ty, TSet):
        return [_value(ty.elem, draw) for _ in range(draw(st.integers(0, 3)))]
    if isinstance(ty, TRecord):
        return {n: _value(a.type, draw) for n, a in ty.fields if a.required or draw(st.booleans())}
    raise AssertionError(ty)


def _dedupe(v: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in v:
        if x not in out:
            out.append(x)
    return out


@st.composite
def entity_store(draw: Any, schema: Schema) -> list[dict[str, Any]]:
    ents = []
    for typ, ids in IDS.items():
        decl = schema.entities[typ]
        for eid in ids:
            if not draw(st.integers(0, 3)):
                continue  # absent: references to it dangle
            attrs = {}
            for n, a in decl.attrs.fields:
                if a.required or draw(st.booleans()):
                    v = _value(a.type, draw)
                    attrs[n] = _dedupe(v) if isinstance(v, list) else v
            parents = []
            for ptyp in decl.member_of:
                for pid in IDS[ptyp]:
                    if draw(st.integers(0, 2)) == 0:
                        parents.append({"type": ptyp, "id": pid})
            ents.append({"uid": {"type": typ, "id": eid}, "attrs": attrs, "parents": parents})
    return ents


@st.composite
def request_for(draw: Any, schema: Schema, env: Env) -> dict[str, Any]:
    ctx = _value(schema.actions[env.action].context, draw)
    return {"principal": {"type": env.ptype, "id": draw(st.sampled_from(IDS[env.ptype]))},
            "action": {"type": "Action", "id": env.action},
            "resource": {"type": env.rtype, "id": draw(st.sampled_from(IDS[env.rtype]))},
            "context": ctx}


@st.composite
def scenario(draw: Any, schema: Schema) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(policy text, entities, request): principal and resource are in the store."""
    n = draw(st.integers(1, 4))
    env = draw(st.sampled_from(envs(schema)))
    text = "\n".join(draw(policy_text(schema, i, env)) for i in range(n))
    ents = draw(entity_store(schema))
    req = draw(request_for(schema, env))
    for role in ("principal", "resource"):
        uid = req[role]
        if not any(e["uid"] == uid for e in ents):
            decl = schema.entities[uid["type"]]
            attrs = {n: _value(a.type, draw) for n, a in decl.attrs.fields if a.required}
            attrs = {k: _dedupe(v) if isinstance(v, list) else v for k, v in attrs.items()}
            ents.append({"uid": uid, "attrs": attrs, "parents": []})
    return text, ents, req
