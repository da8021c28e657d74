"""Evaluate a policy set on a *concrete* request and entity store with the Z3 model.

Used by the differential tests (tests/invariants/test_differential.py): the Z3 model's
decision, determining policies and erroring policies must equal cedarpy's.  The symbolic
store of ``translate`` is pinned to the given entities: existence, every attribute, and
the ancestor relation (Cedar's transitive closure of ``parents``; an absent entity has
no parents) for every entity id mentioned anywhere — in the store, in attribute values,
in the request (its principal, resource and every entity its context names) or as an entity literal
of the policies (``extra_ids``).

``evaluate`` returns {"decision": "allow"|"deny", "reasons": [...], "errors": [...]}
(display ids, as ``engine.Replay.to_json``) and raises ``AssertionError`` if the pinned
constraints do not determine the decision (a gap in the pinning, not in Cedar).
"""

from __future__ import annotations

from typing import Any, Iterable

import z3

from .engine import Policy
from .schema import CedarType, Schema, TBool, TEntity, TLong, TRecord, TSet, TString
from .translate import Registry, Request, Store, Translator, Val, background, policy_set_terms
from .zstring import Codec

__all__ = ["evaluate"]


def _lit(ty: CedarType, v: Any, codec: Codec) -> z3.ExprRef:
    if isinstance(ty, TBool):
        return z3.BoolVal(bool(v))
    if isinstance(ty, TLong):
        return z3.IntVal(int(v))
    if isinstance(ty, TString):
        return codec.encode(v)
    if isinstance(ty, TEntity):
        return codec.encode(v["__entity"]["id"])
    if isinstance(ty, TSet):
        from .translate import sort_of
        arr = z3.K(sort_of(ty).domain(), z3.BoolVal(False))
        for x in v:
            arr = z3.Store(arr, _lit(ty.elem, x, codec), z3.BoolVal(True))
        return arr
    raise TypeError(f"no literal for {ty}")


def _pin(val: Val, v: Any, codec: Codec) -> list[z3.BoolRef]:
    if isinstance(val.ty, TRecord):
        out: list[z3.BoolRef] = []
        for n, (pres, sub) in val.term.items():
            if n in v:
                out.append(pres)
                out.extend(_pin(sub, v[n], codec))
            else:
                out.append(z3.Not(pres))
        return out
    return [val.term == _lit(val.ty, v, codec)]


def _closure(entities: list[dict[str, Any]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    parents = {(e["uid"]["type"], e["uid"]["id"]): {(p["type"], p["id"]) for p in e.get("parents", [])}
               for e in entities}
    out: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for k in parents:
        seen: set[tuple[str, str]] = set()
        todo = list(parents[k])
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(parents.get(p, ()))
        out[k] = seen
    return out


def evaluate(schema: Schema, policies: list[Policy], request: dict[str, Any], entities: list[dict[str, Any]],
             extra_ids: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """Decision of the Z3 model for one concrete request (see module docstring)."""
    reg = Registry()
    store = Store(schema, reg)
    action = request["action"]["id"]
    req = Request.make(schema, reg, action, request["principal"]["type"], request["resource"]["type"])
    q = policy_set_terms(Translator(schema, store, req), policies)
    axioms = background(schema, store, [req])  # before pinning adds terms of its own
    # Only the store functions the formula uses need pinning (an attribute, presence test or ancestor
    # relation nothing mentions cannot change the decision); existence is pinned for every id.
    used = set(reg.functions)

    def mentioned(typ: str, name: str) -> bool:
        path = f"{typ}.{name}"
        return any(f == path or f.startswith(path + ".") or f == f"has:{path}" or f.startswith(f"has:{path}.")
                   for f in used)
    codec = reg.codec
    pins: list[z3.BoolRef] = [req.p == codec.encode(request["principal"]["id"]),
                              req.r == codec.encode(request["resource"]["id"])]
    pins += _pin(req.ctx, request.get("context", {}), codec)
    ids: set[tuple[str, str]] = set(extra_ids)
    for typ, terms in reg.entities.items():  # entity literals of the policies
        for t in terms.values():
            if z3.is_string_value(t):
                ids.add((typ, codec.decode(t)))
    ids.add((request["principal"]["type"], request["principal"]["id"]))
    ids.add((request["resource"]["type"], request["resource"]["id"]))

    def collect(v: Any) -> None:
        if isinstance(v, dict):
            if "__entity" in v:
                ids.add((v["__entity"]["type"], v["__entity"]["id"]))
            else:
                for x in v.values():
                    collect(x)
        elif isinstance(v, list):
            for x in v:
                collect(x)

    # Entities the context names may be absent from the store; unpinned, the solver was free to make one
    # exist with attributes and ancestors (bench/differential.py found `context.target_fleet has tenant`
    # true on an absent fleet: tests/invariants/regressions/context-names-an-absent-entity.json).
    collect(request.get("context", {}))
    by_uid = {(e["uid"]["type"], e["uid"]["id"]): e for e in entities}
    for e in entities:
        ids.add((e["uid"]["type"], e["uid"]["id"]))
        collect(e.get("attrs", {}))
        for p in e.get("parents", []):
            ids.add((p["type"], p["id"]))
    tc = _closure(entities)
    for typ, eid in sorted(ids):
        if typ not in schema.entities:
            continue
        x = codec.encode(eid)
        ent = by_uid.get((typ, eid))
        pins.append(store.exists(typ, x) == z3.BoolVal(ent is not None))
        if ent is not None:
            for name, a in schema.entities[typ].attrs.fields:
                if not mentioned(typ, name):
                    continue
                present = name in ent.get("attrs", {})
                if not a.required:
                    pins.append(store.has(typ, name, x) == z3.BoolVal(present))
                if present:
                    pins += _pin(store.attr(typ, name, x), ent["attrs"][name], codec)
        for u in schema.ancestor_types(typ):
            if f"anc:{typ}:{u}" not in used:
                continue
            for utyp, uid in ids:
                if utyp == u:
                    pins.append(store.anc(typ, u, x, codec.encode(uid)) ==
                                z3.BoolVal((u, uid) in tc.get((typ, eid), set())))
    s = z3.Solver()
    s.add(*axioms)
    s.add(*pins)
    assert s.check() == z3.sat, "pinned store is inconsistent with the background axioms"
    m = s.model()
    allow = _decide(s, m, q.allow)
    sat = [t for t in q.terms if _decide(s, m, t.sat)]
    eff = "permit" if allow else "forbid"
    return {"decision": "allow" if allow else "deny",
            "reasons": sorted(t.policy.id for t in sat if t.policy.ast.effect == eff),
            "errors": sorted(t.policy.id for t in q.terms if _decide(s, m, t.err))}


def _decide(s: z3.Solver, m: z3.ModelRef, term: z3.BoolRef) -> bool:
    """Value of ``term`` under the pins.  Z3's model evaluator leaves set operations
    (``subset``, ``map``) unreduced, so fall back to asking the solver both ways."""
    v = m.eval(term, model_completion=True)
    if z3.is_true(v) or z3.is_false(v):
        return bool(z3.is_true(v))
    answers = []
    for t in (term, z3.Not(term)):
        s.push()
        s.add(t)
        answers.append(s.check())
        s.pop()
    if answers.count(z3.sat) != 1:
        raise AssertionError(f"pinned store does not determine {term}: {answers}")
    return bool(answers[0] == z3.sat)
