"""Cedar policies (typed AST, ``cedarpy.pst``) → Z3 formulas.

Model (Cedar reference: https://docs.cedarpolicy.com/policies/syntax-operators.html and
the authorization algorithm, https://docs.cedarpolicy.com/auth/authorization.html):

* A **request environment** fixes the action and the principal and resource entity
  *types* (the validator typechecks each policy per environment the same way); ids and
  the context are symbolic.  Entity values are Z3 strings (their id) whose type is known
  statically; equality of different entity types is ``false``.
* The **entity store** is symbolic and typed by the schema: per entity type an existence
  predicate, one uninterpreted function per attribute (and a presence predicate per
  optional attribute), and one ancestor relation per pair of types connected by
  ``memberOf``.  Entity references may dangle (an attribute naming an entity absent from
  the store), and an absent entity has no ancestors — as in Cedar.  Transitivity and the
  "absent ⇒ no parents" rule are instantiated over every entity term of the formula, so
  any model can be written out as a finite entity list whose Cedar transitive closure
  agrees with the model (``counterexample.py``).  A recursive ``memberOf`` in the schema
  is not modelled (``Unsupported``).
* **Errors**: every expression yields ``(value, err)``.  Attribute access on an absent
  entity or a missing optional attribute/record field, and ``Long`` overflow outside
  [-2^63, 2^63-1] on ``+ - *`` and negation, are errors.  ``&&``, ``||`` and
  ``if-then-else`` short-circuit exactly as Cedar does.  A policy whose condition errors
  is not satisfied; it is reported in ``PolicyTerm.err``.
* **Strings** and entity ids are Z3 string values built from their code points by the registry's
  ``zstring.Codec`` (never through Z3's string-literal parser, which interprets escape text), with the
  characters above Z3's range mapped one-to-one onto reserved code points; ``like`` patterns are
  regular expressions over the same encoding (``*`` any sequence, Cedar's ``\\*`` a literal star).
* **Decision**: Allow iff some permit is satisfied and no forbid is satisfied.
* Not modelled (raise ``Unsupported`` naming the construct, the policy and its file:line, which the
  caller reports as UNKNOWN): extension types and functions (ip, decimal, datetime, duration),
  entity tags (``hasTag``/``getTag``), template slots (``?principal``/``?resource``), sets of sets or
  records, ``in`` against a non-literal set whose elements may be ancestors, operations on ``Action``
  other than ``==``/``in`` with literals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import z3
from cedarpy import pst

from .engine import Policy
from .errors import Unsupported
from .schema import (BOOL, LONG, STRING, Attr, CedarType, Schema, TBool, TEntity, TExt, TLong,
                     TRecord, TSet, TString)
from .zstring import Codec

__all__ = ["Val", "Registry", "Store", "Request", "Translator", "PolicyTerm", "LONG_MIN", "LONG_MAX",
           "sort_of", "policy_set_terms", "Query", "like"]

LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1
ACTION = "Action"


def sort_of(ty: CedarType) -> z3.SortRef:
    """Z3 sort representing a Cedar type (records have no single sort)."""
    if isinstance(ty, TBool):
        return z3.BoolSort()
    if isinstance(ty, TLong):
        return z3.IntSort()
    if isinstance(ty, (TString, TEntity)):
        return z3.StringSort()
    if isinstance(ty, TSet):
        if isinstance(ty.elem, (TSet, TRecord)):
            raise Unsupported(f"set of {ty.elem}")
        return z3.ArraySort(sort_of(ty.elem), z3.BoolSort())
    raise Unsupported(f"type {ty}")


@dataclass
class Val:
    """A typed symbolic value. ``term`` is a Z3 expression, or for records a dict
    field -> (present: BoolRef, Val).  ``elems`` lists the members of a set literal."""

    ty: CedarType
    term: Any
    elems: list["Val"] | None = None


def _in_range(t: z3.ArithRef) -> z3.BoolRef:
    return z3.And(t >= LONG_MIN, t <= LONG_MAX)


@dataclass
class Registry:
    """Ground terms collected while translating: entity terms per type (for the
    hierarchy axioms and the counterexample), Long terms (range axioms) and free set
    terms (finiteness of counterexamples)."""

    entities: dict[str, dict[int, z3.ExprRef]] = field(default_factory=dict)
    longs: dict[int, z3.ArithRef] = field(default_factory=dict)
    sets: dict[int, tuple[z3.ExprRef, CedarType]] = field(default_factory=dict)
    elems: dict[int, z3.ExprRef] = field(default_factory=dict)  # scalars that may be set members
    codec: Codec = field(default_factory=Codec)  # Cedar strings <-> Z3 string values (``zstring``)
    functions: set[str] = field(default_factory=set)  # store functions used (``concrete`` pins only these)

    def entity(self, typ: str, t: z3.ExprRef) -> None:
        if typ != ACTION:
            self.entities.setdefault(typ, {})[t.get_id()] = t

    def terms(self, typ: str) -> list[z3.ExprRef]:
        return list(self.entities.get(typ, {}).values())


_DECLS: dict[tuple[str, ...], z3.FuncDeclRef] = {}


class Store:
    """Schema-typed symbolic entity store (see module docstring).

    ``overrides`` maps (entity type, attribute) to a function (id term, base value) ->
    value; ``invariants.catalog`` uses it for the raised-trust store of the
    monotonicity check.  Stores with the same ``tag`` share all functions."""

    def __init__(self, schema: Schema, registry: Registry, tag: str = "",
                 overrides: dict[tuple[str, str], Callable[[z3.ExprRef, Val], Val]] | None = None) -> None:
        self.schema, self.reg, self.tag = schema, registry, tag
        self.overrides = overrides or {}
        for t in schema.entities:
            if t in schema.ancestor_types(t):
                raise Unsupported(f"recursive entity hierarchy in the schema ({t} in {t})")

    def with_overrides(self, overrides: dict[tuple[str, str], Callable[[z3.ExprRef, Val], Val]]) -> "Store":
        return Store(self.schema, self.reg, self.tag, {**self.overrides, **overrides})

    def _f(self, name: str, *sorts: z3.SortRef) -> z3.FuncDeclRef:
        self.reg.functions.add(name)
        key = (f"{self.tag}{name}", *(str(x.get_id()) for x in sorts))
        f = _DECLS.get(key)
        if f is None:  # declaring is costly in z3's Python API; a name and sorts always give the same decl
            f = _DECLS[key] = z3.Function(key[0], *sorts)
        return f

    def exists(self, typ: str, x: z3.ExprRef) -> z3.BoolRef:
        return self._f(f"exists:{typ}", z3.StringSort(), z3.BoolSort())(x)

    def has(self, typ: str, path: str, x: z3.ExprRef) -> z3.BoolRef:
        return self._f(f"has:{typ}.{path}", z3.StringSort(), z3.BoolSort())(x)

    def anc(self, t: str, u: str, x: z3.ExprRef, y: z3.ExprRef) -> z3.BoolRef:
        return self._f(f"anc:{t}:{u}", z3.StringSort(), z3.StringSort(), z3.BoolSort())(x, y)

    def attr_decl(self, typ: str, name: str) -> Attr | None:
        decl = self.schema.entities.get(typ)
        return decl.attrs.get(name) if decl else None

    def attr(self, typ: str, name: str, x: z3.ExprRef) -> Val:
        a = self.attr_decl(typ, name)
        assert a is not None
        v = self._value(a.type, f"{typ}.{name}", x, typ)
        ov = self.overrides.get((typ, name))
        return ov(x, v) if ov else v

    def _value(self, ty: CedarType, path: str, x: z3.ExprRef, owner: str) -> Val:
        if isinstance(ty, TRecord):
            fields = {}
            for n, a in ty.fields:
                pres = self.has(owner, f"{path[len(owner) + 1:]}.{n}", x) if not a.required else z3.BoolVal(True)
                fields[n] = (pres, self._value(a.type, f"{path}.{n}", x, owner))
            return Val(ty, fields)
        if isinstance(ty, TExt):
            raise Unsupported(f"extension type {ty.name} (attribute {path})")
        t = self._f(path, z3.StringSort(), sort_of(ty))(x)
        register(self.reg, ty, t)
        return Val(ty, t)


def register(reg: Registry, ty: CedarType, t: z3.ExprRef) -> None:
    if isinstance(ty, (TString, TLong, TEntity)):
        reg.elems[t.get_id()] = t
    if isinstance(ty, TEntity):
        reg.entity(ty.name, t)
    elif isinstance(ty, TLong):
        reg.longs[t.get_id()] = t
    elif isinstance(ty, TSet):
        reg.sets[t.get_id()] = (t, ty)


@dataclass
class Request:
    """A symbolic request in one environment (action, principal type, resource type)."""

    action: str
    ptype: str
    rtype: str
    p: z3.ExprRef
    r: z3.ExprRef
    ctx: Val

    @staticmethod
    def make(schema: Schema, reg: Registry, action: str, ptype: str, rtype: str, tag: str = "") -> "Request":
        p = z3.String(f"{tag}principal")
        r = z3.String(f"{tag}resource")
        reg.entity(ptype, p)
        reg.entity(rtype, r)
        ctx = _free_value(schema.actions[action].context, f"{tag}context", reg)
        return Request(action, ptype, rtype, p, r, ctx)


def _free_value(ty: CedarType, name: str, reg: Registry) -> Val:
    if isinstance(ty, TRecord):
        return Val(ty, {n: (z3.BoolVal(True) if a.required else z3.Bool(f"has:{name}.{n}"),
                            _free_value(a.type, f"{name}.{n}", reg)) for n, a in ty.fields})
    if isinstance(ty, TExt):
        raise Unsupported(f"extension type {ty.name} in the context ({name})")
    t = z3.Const(name, sort_of(ty))
    register(reg, ty, t)
    return Val(ty, t)


@dataclass
class PolicyTerm:
    """One policy in one environment: ``sat`` (condition true, no error) and ``err``."""

    policy: Policy
    sat: z3.BoolRef
    err: z3.BoolRef


F, T = z3.BoolVal(False), z3.BoolVal(True)


def _static_false(b: z3.BoolRef) -> bool:
    return bool(z3.is_false(b) or z3.is_false(z3.simplify(b)))


def _static_true(b: z3.BoolRef) -> bool:
    return bool(z3.is_true(b) or z3.is_true(z3.simplify(b)))


class Translator:
    """Translate expressions and policies for one request environment.

    ``expr`` returns ``(Val, err)``; raises ``Unsupported`` naming the construct."""

    def __init__(self, schema: Schema, store: Store, req: Request) -> None:
        self.schema, self.store, self.req = schema, store, req
        self.where = ""

    # ---- policies
    def policy(self, pol: Policy) -> PolicyTerm | None:
        """None when the scope statically excludes this environment."""
        self.where = pol.id
        a = pol.ast
        try:
            if not self._action_scope(a.action):
                return None
            conds: list[Any] = []
            for var, sc in (("principal", a.principal), ("resource", a.resource)):
                c = self._scope(var, sc)
                if c is None:
                    return None
                conds.append(c)
            if pol.unmodelled:
                raise Unsupported(pol.unmodelled)
            val, err = Val(BOOL, z3.And(*conds) if conds else T), F
            for cl in a.clauses:
                body: Any = cl.expr
                if isinstance(cl, pst.Unless):
                    body = pst.UnaryOp("not", cl.expr)
                val, err = self._and((val, err), body)
            return PolicyTerm(pol, z3.And(val.term, z3.Not(err)), err)
        except Unsupported as exc:
            raise Unsupported(exc.construct, pol.id, pol.where) from None

    def _entity_of(self, e: Any) -> Val:
        if isinstance(e, pst.Slot):
            raise Unsupported(_slot(e))
        return self._lit_entity(e)

    def _scope(self, var: str, sc: Any) -> z3.BoolRef | None:
        typ = self.req.ptype if var == "principal" else self.req.rtype
        me = self._var(var)
        if isinstance(sc, pst.ScopeAny):
            return T
        if isinstance(sc, (pst.ScopeIs, pst.ScopeIsIn)):
            if str(sc.entity_type) != typ:
                return None
            if isinstance(sc, pst.ScopeIs):
                return T
            return self._in(me, self._entity_of(sc.entity))
        if isinstance(sc, pst.ScopeEq):
            other = self._entity_of(sc.entity)
            if other.ty != me.ty:
                return None
            return me.term == other.term
        if isinstance(sc, pst.ScopeIn):
            return self._in(me, self._entity_of(sc.entity))
        raise Unsupported(f"scope {type(sc).__name__}")

    def _action_scope(self, sc: Any) -> bool:
        act = self.req.action
        if isinstance(sc, pst.ScopeAny):
            return True
        if isinstance(sc, pst.ActionEq):
            return sc.entity.id == act
        if isinstance(sc, pst.ActionIn):
            groups = self.schema.action_ancestors(act) | {act}
            return any(e.id in groups for e in sc.entities)
        raise Unsupported(f"action scope {type(sc).__name__}")

    # ---- expressions
    def _var(self, name: str) -> Val:
        if name == "principal":
            return Val(TEntity(self.req.ptype), self.req.p)
        if name == "resource":
            return Val(TEntity(self.req.rtype), self.req.r)
        if name == "action":
            return Val(TEntity(ACTION), self.store.reg.codec.encode(self.req.action))
        return self.req.ctx

    def _lit_entity(self, uid: pst.EntityUid) -> Val:
        typ = str(uid.type)
        t = self.store.reg.codec.encode(uid.id)
        if typ != ACTION:
            if typ not in self.schema.entities:
                raise Unsupported(f"entity type {typ} not in the schema")
            self.store.reg.entity(typ, t)
        return Val(TEntity(typ), t)

    def expr(self, e: Any) -> tuple[Val, z3.BoolRef]:
        if isinstance(e, pst.Var):
            return self._var(e.name), F
        if isinstance(e, pst.BoolLit):
            return Val(BOOL, z3.BoolVal(e.value)), F
        if isinstance(e, pst.LongLit):
            return Val(LONG, z3.IntVal(e.value)), F
        if isinstance(e, pst.StringLit):
            t = self.store.reg.codec.encode(e.value)
            self.store.reg.elems[t.get_id()] = t  # a candidate member of a set in a counterexample
            return Val(STRING, t), F
        if isinstance(e, pst.EntityLit):
            return self._lit_entity(e.value), F
        if isinstance(e, pst.Slot):
            raise Unsupported(_slot(e))
        if isinstance(e, pst.UnaryOp):
            return self._unary(e)
        if isinstance(e, pst.BinaryOp):
            return self._binary(e)
        if isinstance(e, pst.GetAttr):
            base, err = self.expr(e.base)
            v, aerr = self._getattr(base, e.attr)
            return v, z3.Or(err, z3.And(z3.Not(err), aerr)) if not z3.is_false(aerr) else err
        if isinstance(e, pst.HasAttr):
            return self._has(e)
        if isinstance(e, pst.Like):
            base, err = self.expr(e.base)
            self._need(base, TString, "like")
            return Val(BOOL, like(base.term, e.pattern, self.store.reg.codec)), err
        if isinstance(e, pst.Is):
            base, err = self.expr(e.base)
            if not isinstance(base.ty, TEntity):
                raise Unsupported(f"`is` on {base.ty}")
            if base.ty.name != str(e.entity_type):
                return Val(BOOL, F), err
            if e.in_expr is None:
                return Val(BOOL, T), err
            rhs, rerr = self.expr(e.in_expr)
            return Val(BOOL, self._in(base, rhs)), z3.Or(err, rerr)
        if isinstance(e, pst.IfThenElse):
            return self._ite(e)
        if isinstance(e, pst.Set):
            return self._set(e)
        if isinstance(e, pst.Record):
            fields, errs = {}, []
            for n, sub in e.fields.items():
                v, er = self.expr(sub)
                fields[n] = (T, v)
                errs.append(er)
            ty = TRecord(tuple((n, Attr(v.ty, True)) for n, (_, v) in fields.items()))
            return Val(ty, fields), _seq_err(errs)
        raise Unsupported(f"expression {type(e).__name__}")

    @staticmethod
    def _need(v: Val, cls: type, what: str) -> None:
        if not isinstance(v.ty, cls):
            raise Unsupported(f"{what} on {v.ty}")

    def _unary(self, e: pst.UnaryOp) -> tuple[Val, z3.BoolRef]:
        if e.op not in ("not", "neg", "is_empty"):
            raise Unsupported(_unmodelled_op(e.op))
        v, err = self.expr(e.arg)
        if e.op == "not":
            self._need(v, TBool, "!")
            return Val(BOOL, z3.Not(v.term)), err
        if e.op == "neg":
            self._need(v, TLong, "negation")
            r = -v.term
            return Val(LONG, r), z3.Or(err, z3.Not(_in_range(r)))
        self._need(v, TSet, "isEmpty")
        return Val(BOOL, v.term == z3.K(v.term.domain(), F)), err

    def _and(self, left: tuple[Val, z3.BoolRef], right_e: Any) -> tuple[Val, z3.BoolRef]:
        l, el = left
        if _static_false(l.term) and z3.is_false(el):
            return Val(BOOL, F), F
        r, er = self.expr(right_e)
        self._need(r, TBool, "&&")
        return Val(BOOL, z3.And(l.term, r.term)), z3.Or(el, z3.And(z3.Not(el), l.term, er))

    def _or(self, left: tuple[Val, z3.BoolRef], right_e: Any) -> tuple[Val, z3.BoolRef]:
        l, el = left
        if _static_true(l.term) and z3.is_false(el):
            return Val(BOOL, T), F
        r, er = self.expr(right_e)
        self._need(r, TBool, "||")
        return Val(BOOL, z3.Or(l.term, r.term)), z3.Or(el, z3.And(z3.Not(el), z3.Not(l.term), er))

    def _binary(self, e: pst.BinaryOp) -> tuple[Val, z3.BoolRef]:
        op = e.op
        if op in ("and", "or"):
            left = self.expr(e.left)
            self._need(left[0], TBool, "&&/||")
            return self._and(left, e.right) if op == "and" else self._or(left, e.right)
        if op not in ("eq", "not_eq", "less", "less_eq", "greater", "greater_eq", "add", "sub", "mul",
                      "in", "contains", "contains_all", "contains_any"):
            raise Unsupported(_unmodelled_op(op))
        l, el = self.expr(e.left)
        r, er = self.expr(e.right)
        err = z3.Or(el, er)
        if op in ("eq", "not_eq"):
            b = self._eq(l, r)
            return Val(BOOL, b if op == "eq" else z3.Not(b)), err
        if op in ("less", "less_eq", "greater", "greater_eq", "add", "sub", "mul"):
            if not (isinstance(l.ty, TLong) and isinstance(r.ty, TLong)):
                raise Unsupported(f"operator {op} on {l.ty} and {r.ty}")
            a, b = l.term, r.term
            if op == "less":
                return Val(BOOL, a < b), err
            if op == "less_eq":
                return Val(BOOL, a <= b), err
            if op == "greater":
                return Val(BOOL, a > b), err
            if op == "greater_eq":
                return Val(BOOL, a >= b), err
            res = a + b if op == "add" else a - b if op == "sub" else a * b
            return Val(LONG, res), z3.Or(err, z3.Not(_in_range(res)))
        if op == "in":
            return Val(BOOL, self._in(l, r)), err
        self._need(l, TSet, op)
        if op == "contains":
            if l.elems is not None:
                return Val(BOOL, z3.Or(F, *[self._eq(x, r) for x in l.elems])), err
            assert isinstance(l.ty, TSet)
            if not _same_kind(l.ty.elem, r.ty):
                return Val(BOOL, F), err
            if isinstance(r.ty, (TString, TLong, TEntity)):
                # The probed element is a candidate member when a co-finite set in a model is narrowed to
                # a finite one (counterexample.model_finite_sets): `roles.contains("auditor")` needs "auditor".
                self.store.reg.elems[r.term.get_id()] = r.term
            return Val(BOOL, z3.Select(l.term, r.term)), err
        self._need(r, TSet, op)
        assert isinstance(l.ty, TSet) and isinstance(r.ty, TSet)
        if not _same_kind(l.ty.elem, r.ty.elem):
            raise Unsupported(f"{op} between {l.ty} and {r.ty}")
        if op == "contains_all":
            return Val(BOOL, z3.IsSubset(r.term, l.term)), err
        return Val(BOOL, z3.Not(z3.SetIntersect(l.term, r.term) == z3.K(l.term.domain(), F))), err

    def _eq(self, l: Val, r: Val) -> z3.BoolRef:
        if isinstance(l.ty, TRecord) or isinstance(r.ty, TRecord):
            if not (isinstance(l.ty, TRecord) and isinstance(r.ty, TRecord)):
                return F
            names = set(l.term) | set(r.term)
            parts = []
            for n in names:
                lp, lv = l.term.get(n, (F, None))
                rp, rv = r.term.get(n, (F, None))
                same = self._eq(lv, rv) if lv is not None and rv is not None else F
                parts.append(z3.And(lp == rp, z3.Implies(lp, same)))
            return z3.And(T, *parts)
        if isinstance(l.ty, TSet) and isinstance(r.ty, TSet):
            if l.ty != r.ty:
                raise Unsupported(f"== between {l.ty} and {r.ty}")
            return l.term == r.term
        if type(l.ty) is not type(r.ty) or l.ty != r.ty:
            return F
        return l.term == r.term

    def _in(self, l: Val, r: Val) -> z3.BoolRef:
        if not isinstance(l.ty, TEntity):
            raise Unsupported(f"`in` on {l.ty}")
        if isinstance(r.ty, TSet):
            if r.elems is not None:
                return z3.Or(F, *[self._in(l, x) for x in r.elems])
            elem = r.ty.elem
            if not isinstance(elem, TEntity):
                raise Unsupported(f"`in` {r.ty}")
            if elem.name in self.schema.ancestor_types(l.ty.name) or l.ty.name == ACTION:
                raise Unsupported(f"`in` a non-literal {r.ty} that may hold ancestors of {l.ty}")
            return z3.Select(r.term, l.term) if elem == l.ty else F
        if not isinstance(r.ty, TEntity):
            raise Unsupported(f"`in` {r.ty}")
        t, u = l.ty.name, r.ty.name
        if t == ACTION or u == ACTION:
            if t != u:
                return F
            x, y = z3.simplify(l.term), z3.simplify(r.term)
            if not (z3.is_string_value(x) and z3.is_string_value(y)):
                raise Unsupported("`in` on a non-literal action")
            xs, ys = self.store.reg.codec.decode(x), self.store.reg.codec.decode(y)
            return z3.BoolVal(xs == ys or ys in self.schema.action_ancestors(xs))
        parts = []
        if t == u:
            parts.append(l.term == r.term)
        if u in self.schema.ancestor_types(t):
            parts.append(self.store.anc(t, u, l.term, r.term))
        return z3.Or(F, *parts)

    def _getattr(self, base: Val, name: str) -> tuple[Val, z3.BoolRef]:
        if isinstance(base.ty, TRecord):
            if name not in base.term:
                raise Unsupported(f"record has no attribute {name}")
            pres, v = base.term[name]
            return v, z3.Not(pres)
        if not isinstance(base.ty, TEntity) or base.ty.name == ACTION:
            raise Unsupported(f"attribute access on {base.ty}")
        typ = base.ty.name
        a = self.store.attr_decl(typ, name)
        if a is None:
            raise Unsupported(f"attribute {name} not declared on {typ}")
        v = self.store.attr(typ, name, base.term)
        missing = z3.Not(self.store.exists(typ, base.term))
        if not a.required:
            missing = z3.Or(missing, z3.Not(self.store.has(typ, name, base.term)))
        return v, missing

    def _has(self, e: pst.HasAttr) -> tuple[Val, z3.BoolRef]:
        base, err = self.expr(e.base)
        conds: list[z3.BoolRef] = []
        cur: Val | None = base
        for i, name in enumerate(e.attrs):
            assert cur is not None
            if isinstance(cur.ty, TRecord):
                if name not in cur.term:
                    conds.append(F)
                    break
                pres, nxt = cur.term[name]
                conds.append(pres)
                cur = nxt
            elif isinstance(cur.ty, TEntity) and cur.ty.name != ACTION:
                a = self.store.attr_decl(cur.ty.name, name)
                if a is None:
                    conds.append(F)
                    break
                c = self.store.exists(cur.ty.name, cur.term)
                if not a.required:
                    c = z3.And(c, self.store.has(cur.ty.name, name, cur.term))
                conds.append(c)
                cur = self.store.attr(cur.ty.name, name, cur.term) if i + 1 < len(e.attrs) else None
            elif isinstance(cur.ty, TEntity):
                conds.append(F)
                break
            else:
                raise Unsupported(f"`has` on {cur.ty}")
        return Val(BOOL, z3.And(*conds)), err

    def _ite(self, e: pst.IfThenElse) -> tuple[Val, z3.BoolRef]:
        c, ec = self.expr(e.cond)
        self._need(c, TBool, "if")
        if z3.is_false(ec) and _static_true(c.term):
            return self.expr(e.then_expr)
        if z3.is_false(ec) and _static_false(c.term):
            return self.expr(e.else_expr)
        a, ea = self.expr(e.then_expr)
        b, eb = self.expr(e.else_expr)
        if a.ty != b.ty or isinstance(a.ty, TRecord):
            raise Unsupported(f"if-then-else of {a.ty} and {b.ty}")
        return Val(a.ty, z3.If(c.term, a.term, b.term)), \
            z3.Or(ec, z3.And(z3.Not(ec), z3.If(c.term, ea, eb)))

    def _set(self, e: pst.Set) -> tuple[Val, z3.BoolRef]:
        vals, errs = [], []
        for sub in e.elements:
            v, er = self.expr(sub)
            vals.append(v)
            errs.append(er)
        if not vals:
            raise Unsupported("empty set literal")
        ty = vals[0].ty
        if any(v.ty != ty for v in vals):
            raise Unsupported("set literal with elements of different types")
        srt = sort_of(TSet(ty))
        arr = z3.K(srt.domain(), F)
        for v in vals:
            arr = z3.Store(arr, v.term, T)
            if not isinstance(v.ty, (TSet, TRecord)):
                self.store.reg.elems[v.term.get_id()] = v.term
        return Val(TSet(ty), arr, vals), _seq_err(errs)


# Cedar's names for the operators of ``cedarpy.pst`` that are not modelled.
_TAGS = {"has_tag": "hasTag", "get_tag": "getTag"}
_EXTENSION = {
    "ip": "ip()", "decimal": "decimal()", "datetime": "datetime()", "duration": "duration()",
    "is_ipv4": "isIpv4()", "is_ipv6": "isIpv6()", "is_loopback": "isLoopback()", "is_multicast": "isMulticast()",
    "is_in_range": "isInRange()", "to_date": "toDate()", "to_time": "toTime()", "to_milliseconds": "toMilliseconds()",
    "to_seconds": "toSeconds()", "to_minutes": "toMinutes()", "to_hours": "toHours()", "to_days": "toDays()",
    "offset": "offset()", "duration_since": "durationSince()", "decimal_less_than": "lessThan()",
    "decimal_less_eq": "lessThanOrEqual()", "decimal_greater": "greaterThan()",
    "decimal_greater_eq": "greaterThanOrEqual()",
}


def _unmodelled_op(op: str) -> str:
    if op in _TAGS:
        return f"entity tags ({_TAGS[op]}): tags are not modelled"
    if op in _EXTENSION:
        return f"extension function {_EXTENSION[op]}: extension types (ipaddr, decimal, datetime, duration) " \
               "are not modelled"
    return f"operator {op}"


def _slot(e: pst.Slot) -> str:
    return f"template slot ?{e.name}: a policy template is evaluated only through its links, which are not modelled"


def _seq_err(errs: list[z3.BoolRef]) -> z3.BoolRef:
    errs = [x for x in errs if not z3.is_false(x)]
    return z3.Or(*errs) if errs else F


def _same_kind(a: CedarType, b: CedarType) -> bool:
    return a == b


def like(s: z3.ExprRef, elems: Iterable[Any], codec: Codec) -> z3.BoolRef:
    """``s like pattern`` exactly. The finite fragment — at most one literal run on each side of the
    wildcards and at most one between them (``"abc"``, ``"abc*"``, ``"*abc"``, ``"*abc*"``, ``"a*c"``,
    ``"a*b*c"`` …) — as word equations Z3 decides outright: ``a*c`` is prefix ``a``, suffix ``c`` and length
    at least ``|a| + |c|`` (the runs cannot overlap); ``*b*`` is contains ``b``. So ``s like "x*y" &&
    !(s like "*y")`` is unsatisfiable on the shared suffix atom without the regular-expression solver, which
    gives up on such complements. Any other pattern is a Z3 regular expression (`_pattern`)."""
    runs: list[str] = [""]
    for el in elems:
        if isinstance(el, pst.Wildcard):
            if runs[-1] or len(runs) == 1:
                runs.append("")
        else:
            runs[-1] += el.value
    # runs: the literal text between wildcards (a leading "" when the pattern starts with `*`, a trailing
    # "" when it ends with one); consecutive wildcards were merged
    if len(runs) == 1:
        return s == codec.encode(runs[0])
    head, mid, tail = runs[0], runs[1:-1], runs[-1]
    mid = [m for m in mid if m]
    if len(mid) > 1:
        return z3.InRe(s, _pattern(elems, codec))
    conds: list[z3.BoolRef] = []
    if head:
        conds.append(z3.PrefixOf(codec.encode(head), s))
    if tail:
        conds.append(z3.SuffixOf(codec.encode(tail), s))
    if mid:
        b = mid[0]
        if not head and not tail:
            conds.append(z3.Contains(s, codec.encode(b)))
        else:  # head, then b, then tail, in order and without overlap
            return z3.InRe(s, _pattern(elems, codec))
    if head and tail:
        conds.append(z3.Length(s) >= len(head) + len(tail))
    return z3.And(*conds) if conds else z3.BoolVal(True)


def _pattern(elems: Iterable[Any], codec: Codec) -> z3.ReRef:
    """A Cedar ``like`` pattern (``pst.Char``/``pst.Wildcard`` items, escapes already resolved by
    Cedar's parser: ``\\*`` is a literal star) as a Z3 regular expression; ``*`` matches any sequence."""
    parts: list[z3.ReRef] = []
    buf = ""
    for el in elems:
        if isinstance(el, pst.Wildcard):
            if buf:
                parts.append(z3.Re(codec.encode(buf)))
                buf = ""
            parts.append(z3.Star(z3.AllChar(z3.ReSort(z3.StringSort()))))
        else:
            buf += el.value
    if buf or not parts:
        parts.append(z3.Re(codec.encode(buf)))
    return parts[0] if len(parts) == 1 else z3.Concat(*parts)


@dataclass
class Query:
    """The translated policy set in one environment plus the background axioms."""

    req: Request
    store: Store
    terms: list[PolicyTerm]
    allow: z3.BoolRef


def policy_set_terms(tr: Translator, policies: list[Policy]) -> Query:
    """Translate a policy set: Allow = ∃ satisfied permit ∧ ¬∃ satisfied forbid."""
    terms = [t for t in (tr.policy(p) for p in policies) if t is not None]
    permits = [t.sat for t in terms if t.policy.ast.effect == "permit"]
    forbids = [t.sat for t in terms if t.policy.ast.effect == "forbid"]
    allow = z3.And(z3.Or(F, *permits), z3.Not(z3.Or(F, *forbids)))
    return Query(tr.req, tr.store, terms, allow)


def background(schema: Schema, store: Store, reqs: list[Request]) -> list[z3.BoolRef]:
    """Axioms over every registered ground term: schema-valid requests (principal and
    resource exist), Long ranges, and the entity hierarchy (absent entities have no
    ancestors; transitivity).  Call after all translation is done."""
    reg = store.reg
    ax: list[z3.BoolRef] = []
    for rq in reqs:
        ax.append(store.exists(rq.ptype, rq.p))
        ax.append(store.exists(rq.rtype, rq.r))
    for t in reg.longs.values():
        ax.append(_in_range(t))
    types = [t for t in reg.entities if t in schema.entities]
    anc_types = {t: schema.ancestor_types(t) for t in types}
    for t in types:
        xs = reg.terms(t)
        for u in anc_types[t]:
            ys = reg.terms(u)
            for x in xs:
                for y in ys:
                    ax.append(z3.Implies(store.anc(t, u, x, y), store.exists(t, x)))
            for v in anc_types[t]:
                if u not in anc_types.get(v, schema.ancestor_types(v)):
                    continue
                vs = reg.terms(v)
                for x in xs:
                    for m in vs:
                        for y in ys:
                            ax.append(z3.Implies(z3.And(store.anc(t, v, x, m), store.anc(v, u, m, y)),
                                                 store.anc(t, u, x, y)))
    return ax
