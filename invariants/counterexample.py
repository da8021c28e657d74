"""Z3 model → concrete Cedar request and entity list (Cedar JSON formats:
https://docs.cedarpolicy.com/auth/entities-syntax.html).

Only the entities the formula mentions are written out (every registered entity term
that the model says exists), with all their schema attributes and, as parents, every
mentioned entity the model places above them.  Because ``translate.background``
instantiates transitivity over exactly these terms, Cedar's transitive closure of the
written parents agrees with the model on every ``in`` the policies evaluate.

Sets in a Z3 model may be co-finite (``Store(K(True), ...)``); Cedar sets are finite.
``finite_sets_constraint`` pins every free set to a finite literal of fresh elements so
the solver can be asked again; if that fails the check is UNKNOWN, never PROVED.
"""

from __future__ import annotations

from typing import Any

import z3

from .errors import Unsupported
from .schema import CedarType, Schema, TBool, TEntity, TLong, TRecord, TSet, TString
from .translate import Request, Store, Val
from .zstring import Codec, code_points

__all__ = ["request_json", "entities_json", "finite_sets_constraint", "value_json", "set_members"]


def _ev(model: z3.ModelRef, t: z3.ExprRef) -> z3.ExprRef:
    return model.eval(t, model_completion=True)


def _key(v: z3.ExprRef) -> object:
    """A dictionary key for a model value: a string value by its code points (its printed form is
    not injective), anything else by its S-expression."""
    if z3.is_string_value(v):
        return ("str", tuple(code_points(v)))
    return v.sexpr()


def set_members(model: z3.ModelRef, t: z3.ExprRef) -> list[z3.ExprRef]:
    """Members of a finite set in the model; raises ``Unsupported`` if co-finite."""
    v = _ev(model, t)
    writes: list[tuple[z3.ExprRef, z3.ExprRef]] = []
    while z3.is_store(v):
        writes.append((v.arg(1), v.arg(2)))
        v = v.arg(0)
    if z3.is_const_array(v):
        default = v.arg(0)
    elif z3.is_as_array(v):
        interp = model[z3.get_as_array_func(v)]
        for i in range(interp.num_entries()):
            ent = interp.entry(i)
            writes.append((ent.arg_value(0), ent.value()))
        default = interp.else_value()
    else:
        raise Unsupported(f"set value {v} in the model")
    if not z3.is_false(default):
        raise Unsupported("a counterexample needing an infinite set")
    # ``writes`` runs from the outermost (latest) store inwards: the first write wins.
    seen: dict[object, tuple[z3.ExprRef, bool]] = {}
    for key, val in writes:
        seen.setdefault(_key(key), (key, z3.is_true(val)))
    return [key for key, keep in seen.values() if keep]


def _scalar(model: z3.ModelRef, ty: CedarType, t: z3.ExprRef, codec: Codec) -> Any:
    v = _ev(model, t)
    if isinstance(ty, TBool):
        return z3.is_true(v)
    if isinstance(ty, TLong):
        return v.as_long()
    if isinstance(ty, TString):
        return codec.decode(v)
    if isinstance(ty, TEntity):
        return {"__entity": {"type": ty.name, "id": codec.decode(v)}}
    raise Unsupported(f"value of type {ty}")


def value_json(model: z3.ModelRef, v: Val, codec: Codec) -> Any:
    """Cedar JSON value of a symbolic ``Val``; records omit absent optional fields. Strings and entity
    ids are decoded exactly by ``codec`` (the translation's, ``Registry.codec``)."""
    if isinstance(v.ty, TRecord):
        return {n: value_json(model, sub, codec) for n, (pres, sub) in v.term.items()
                if z3.is_true(_ev(model, pres))}
    if isinstance(v.ty, TSet):
        return [_scalar(model, v.ty.elem, m, codec) for m in set_members(model, v.term)]
    return _scalar(model, v.ty, v.term, codec)


def request_json(model: z3.ModelRef, req: Request, codec: Codec) -> dict[str, Any]:
    """{"principal": {"type","id"}, "action": {...}, "resource": {...}, "context": {...}}."""
    return {
        "principal": {"type": req.ptype, "id": codec.decode(_ev(model, req.p))},
        "action": {"type": "Action", "id": req.action},
        "resource": {"type": req.rtype, "id": codec.decode(_ev(model, req.r))},
        "context": value_json(model, req.ctx, codec),
    }


def entities_json(model: z3.ModelRef, schema: Schema, store: Store) -> list[dict[str, Any]]:
    """Every mentioned entity that exists in the model, with attributes and parents."""
    codec = store.reg.codec
    ids: dict[str, dict[str, z3.ExprRef]] = {}
    for typ, terms in store.reg.entities.items():
        for t in terms.values():
            v = _ev(model, t)
            ids.setdefault(typ, {}).setdefault(codec.decode(v), v)
    out: list[dict[str, Any]] = []
    for typ in sorted(ids):
        decl = schema.entities.get(typ)
        if decl is None:
            continue
        for eid, term in sorted(ids[typ].items()):
            if not z3.is_true(_ev(model, store.exists(typ, term))):
                continue
            attrs: dict[str, Any] = {}
            for name, a in decl.attrs.fields:
                if not a.required and not z3.is_true(_ev(model, store.has(typ, name, term))):
                    continue
                attrs[name] = value_json(model, store.attr(typ, name, term), codec)
            parents = []
            for u in sorted(schema.ancestor_types(typ)):
                for pid, pterm in sorted(ids.get(u, {}).items()):
                    if z3.is_true(_ev(model, store.anc(typ, u, term, pterm))):
                        parents.append({"type": u, "id": pid})
            out.append({"uid": {"type": typ, "id": eid}, "attrs": attrs, "parents": parents})
    return out


def finite_sets_constraint(store: Store, extra: int = 4) -> list[z3.BoolRef]:
    """Pin every registered free set term to a finite set of fresh elements (size:
    number of mentioned terms of the element sort + ``extra``)."""
    out: list[z3.BoolRef] = []
    n_entities = sum(len(v) for v in store.reg.entities.values())
    for i, (t, ty) in enumerate(store.reg.sets.values()):
        assert isinstance(ty, TSet)
        srt = t.sort().domain()
        arr = z3.K(srt, z3.BoolVal(False))
        for j in range(n_entities + len(store.reg.sets) + extra):
            arr = z3.Store(arr, z3.FreshConst(srt, f"elem{i}_{j}"), z3.FreshBool(f"in{i}_{j}"))
        out.append(t == arr)
    return out


def readable_ids(store: Store, request: dict[str, Any], entities: list[dict[str, Any]]
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Rename solver-chosen entity ids (often ``""`` or ``"!0!"``) to ``agent1``,
    ``tenant1``…  Cedar can observe an id only by comparing it with an entity literal,
    so ids equal to a literal of the policies are kept and every other id is renamed
    injectively: the decision is unchanged (and the replay re-checks it)."""
    reserved: set[tuple[str, str]] = set()
    for typ, terms in store.reg.entities.items():
        for t in terms.values():
            if z3.is_string_value(t):
                reserved.add((typ, store.reg.codec.decode(t)))
    mapping: dict[tuple[str, str], str] = {}
    counters: dict[str, int] = {}

    def ren(typ: str, eid: str) -> str:
        if typ == "Action" or (typ, eid) in reserved:
            return eid
        if (typ, eid) not in mapping:
            while True:
                counters[typ] = counters.get(typ, 0) + 1
                cand = f"{typ.lower()}{counters[typ]}"
                if (typ, cand) not in reserved:
                    break
            mapping[(typ, eid)] = cand
        return mapping[(typ, eid)]

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            if set(v) == {"type", "id"} and isinstance(v.get("id"), str):
                return {"type": v["type"], "id": ren(v["type"], v["id"])}
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    # principal first, then resource, so the names read naturally
    req = {k: walk(v) for k, v in request.items()}
    return req, walk(entities)


def model_finite_sets(model: z3.ModelRef, store: Store) -> list[z3.BoolRef]:
    """For each free set term: equal to the finite set of its members in ``model`` among
    the explicit model keys and every mentioned term of the element sort."""
    out: list[z3.BoolRef] = []
    cands: dict[str, list[z3.ExprRef]] = {}
    pool = [t for terms in store.reg.entities.values() for t in terms.values()] + \
        list(store.reg.elems.values())
    for t, _ in store.reg.sets.values():
        srt = t.sort().domain()
        v = _ev(model, t)
        keys = []
        while z3.is_store(v):
            keys.append(v.arg(1))
            v = v.arg(0)
        elems: dict[object, z3.ExprRef] = {}
        for k in keys + [x for x in pool if x.sort() == srt]:
            kv = _ev(model, k)
            if z3.is_true(_ev(model, z3.Select(t, kv))):
                elems.setdefault(_key(kv), kv)
        arr = z3.K(srt, z3.BoolVal(False))
        for e in elems.values():
            arr = z3.Store(arr, e, z3.BoolVal(True))
        out.append(t == arr)
        cands[str(t)] = list(elems.values())
    return out
