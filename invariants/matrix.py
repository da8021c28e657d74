"""The access matrix: for each action, which classes of requests the policy set permits, proved with Z3.

A **class** fixes, for one request environment (action, principal type, resource type), one value of
each *dimension* that applies to it. Every dimension value is a Cedar condition, translated to Z3 by
``invariants.translate`` like the policies themselves and evaluated by cedarpy on concrete requests, so
the same text defines a class for the proof and for the replay:

=========  ====  ==========================================================================================
dimension  axis  values (Cedar condition)
=========  ====  ==========================================================================================
tenant     row   same tenant ``principal.tenant == resource.tenant`` · other tenant (its negation)
trust      row   ≤0 · 1 · 2 · ≥3 (``principal.trust``; memwarden issues 0–3, the ends absorb the rest)
owner      row   owner ``resource.owner == principal`` · not owner — inside the same tenant only
fleet      row   same fleet ``principal.fleet == resource.fleet`` · other fleet — same tenant only
scope      col   agent · fleet · tenant · restricted · other (``resource.scope``; other: none of the four)
status     col   active · superseded · deleted · other (``resource.status``)
reader     col   reader ``resource.readers.contains(principal)`` · not a reader — same tenant only
target     col   ``context.target_fleet``: its own fleet · another fleet of its tenant · outside its tenant
=========  ====  ==========================================================================================

A dimension applies where the schema has what it speaks of (``trust`` where the principal type has a
``Long`` trust, ``reader`` where the resource has ``readers: Set<principal type>``, …); the principal
type and (when an action has several) the resource type are dimensions too. The classes of an
environment partition all of its schema-valid requests (entity stores are arbitrary: any attribute
values, any hierarchy, referenced entities possibly absent — as in ``invariants.catalog``).

Each class (**cell**) gets a verdict that Z3 proves:

``permitted``  every request of the class is allowed (``class ∧ ¬allow`` is UNSAT)
``denied``     every request of the class is denied (``class ∧ allow`` is UNSAT)
``depends``    both are SAT: a witness of each side (something outside the dimensions decides)
``empty``      the class has no request
``unknown``    the solver gave up, or the policies use a construct the translator does not model

The search refines: a region of classes whose every member gets the same decision is proved at once
(one UNSAT query) and only mixed regions are split further, so a cell is proved by its own query or
by an enclosing region's. Every witness — both sides of each ``depends`` cell and one sample of each
uniform region — is written out as Cedar JSON and replayed through cedarpy: its decision must be the
proved one and cedarpy must place it in the class it was found for; otherwise `MatrixDisagreement`
(exit 4 of ``policy-check explain``) — never a printed result.

`diff_matrices` compares two policy sets over the same classes: a cell **widened** holds a request
the new set allows and the old denied (``cell ∧ new ∧ ¬old`` SAT, witness replayed on both sets),
**narrowed** the converse.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Callable, Iterable

import z3

from . import counterexample as cx
from .engine import Policy, authorize, parse_text
from .errors import MatrixDisagreement, Unsupported
from .schema import LONG, STRING, Schema, TEntity, TSet
from .summary import policy_strings, request_sentence
from .translate import PolicyTerm, Registry, Request, Store, Translator, background, policy_set_terms

__all__ = ["Dim", "DIMS", "Cell", "Witness", "Matrix", "MatrixDisagreement", "build_matrix", "Change",
           "MatrixDiff", "diff_matrices", "classify", "KIND"]

KIND = {"Agent": "agent", "TenantAdmin": "tenant admin", "Operator": "operator"}
PERMITTED, DENIED, DEPENDS, EMPTY, UNKNOWN = "permitted", "denied", "depends", "empty", "unknown"
SYMBOL = {PERMITTED: "✓", DENIED: "✗", DEPENDS: "~", EMPTY: "∅", UNKNOWN: "?"}


Applies = Callable[[Schema, str, str, str], bool]


@dataclass(frozen=True)
class Dim:
    """One dimension: ``values`` are (label, Cedar condition); ``under`` = (dimension, value label) splits
    only inside that class; ``axis`` is where the table shows it."""

    name: str
    axis: str
    values: tuple[tuple[str, str], ...]
    applies: Applies
    under: tuple[str, str] | None = None


def _attr(schema: Schema, typ: str, name: str) -> Any:
    d = schema.entities.get(typ)
    a = d.attrs.get(name) if d else None
    return a.type if a is not None and a.required else None


def _same_attr(name: str) -> Applies:
    def f(schema: Schema, action: str, pt: str, rt: str) -> bool:
        a, b = _attr(schema, pt, name), _attr(schema, rt, name)
        return isinstance(a, TEntity) and a == b
    return f


def _res_string(name: str) -> Applies:
    return lambda schema, action, pt, rt: _attr(schema, rt, name) == STRING


def _owner(schema: Schema, action: str, pt: str, rt: str) -> bool:
    return _attr(schema, rt, "owner") == TEntity(pt) and _same_attr("tenant")(schema, action, pt, rt)


def _reader(schema: Schema, action: str, pt: str, rt: str) -> bool:
    return _attr(schema, rt, "readers") == TSet(TEntity(pt)) and _same_attr("tenant")(schema, action, pt, rt)


def _target(schema: Schema, action: str, pt: str, rt: str) -> bool:
    ctx = schema.actions[action].context
    a = ctx.get("target_fleet") if hasattr(ctx, "get") else None
    fleet, tenant = _attr(schema, pt, "fleet"), _attr(schema, pt, "tenant")
    return (a is not None and a.required and isinstance(fleet, TEntity) and a.type == fleet
            and isinstance(tenant, TEntity) and tenant.name in schema.ancestor_types(fleet.name))


def _target_tenant(schema: Schema, action: str, pt: str, rt: str) -> bool:
    ctx = schema.actions[action].context
    a = ctx.get("target_fleet") if hasattr(ctx, "get") else None
    tenant = _attr(schema, pt, "tenant")
    return (a is not None and a.required and isinstance(a.type, TEntity) and _attr(schema, pt, "fleet") is None
            and isinstance(tenant, TEntity) and tenant.name in schema.ancestor_types(a.type.name))


def _one_of(attr: str, values: list[str]) -> tuple[tuple[str, str], ...]:
    lits = ", ".join(f'"{v}"' for v in values)
    return tuple((v, f'resource.{attr} == "{v}"') for v in values) + \
        (("other", f"!([{lits}].contains(resource.{attr}))"),)


DIMS: tuple[Dim, ...] = (
    Dim("tenant", "row", (("same tenant", "principal.tenant == resource.tenant"),
                          ("other tenant", "principal.tenant != resource.tenant")), _same_attr("tenant")),
    Dim("status", "col", _one_of("status", ["active", "superseded", "deleted"]), _res_string("status")),
    Dim("scope", "col", _one_of("scope", ["agent", "fleet", "tenant", "restricted"]), _res_string("scope")),
    Dim("trust", "row", (("≤0", "principal.trust <= 0"), ("1", "principal.trust == 1"),
                         ("2", "principal.trust == 2"), ("≥3", "principal.trust >= 3")),
        lambda schema, action, pt, rt: _attr(schema, pt, "trust") == LONG),
    Dim("owner", "row", (("owner", "resource.owner == principal"), ("not owner", "resource.owner != principal")),
        _owner, ("tenant", "same tenant")),
    Dim("fleet", "row", (("same fleet", "principal.fleet == resource.fleet"),
                         ("other fleet", "principal.fleet != resource.fleet")),
        lambda schema, action, pt, rt: _same_attr("fleet")(schema, action, pt, rt)
        and _same_attr("tenant")(schema, action, pt, rt), ("tenant", "same tenant")),
    Dim("reader", "col", (("reader", "resource.readers.contains(principal)"),
                          ("not a reader", "!resource.readers.contains(principal)")), _reader, ("tenant", "same tenant")),
    Dim("target", "col", (("its fleet", "context.target_fleet == principal.fleet && "
                                        "context.target_fleet in principal.tenant"),
                          ("another fleet of its tenant", "context.target_fleet != principal.fleet && "
                                                          "context.target_fleet in principal.tenant"),
                          ("outside its tenant", "!(context.target_fleet in principal.tenant)")), _target),
    Dim("target", "col", (("inside its tenant", "context.target_fleet in principal.tenant"),
                          ("outside its tenant", "!(context.target_fleet in principal.tenant)")), _target_tenant),
)
ROW_ORDER = ("principal", "trust", "tenant", "owner", "fleet")
COL_ORDER = ("resource", "scope", "status", "reader", "target")


def _cond_policies(dims: Iterable[Dim]) -> dict[tuple[str, str], Policy]:
    out: dict[tuple[str, str], Policy] = {}
    text, keys = [], []
    for d in dims:
        for label, cond in d.values:
            if (d.name, label) in keys:
                continue
            keys.append((d.name, label))
            text.append(f'@id("mx:{d.name}={label}")\npermit (principal, action, resource) when {{ {cond} }};')
    pf = parse_text("\n".join(text), "<matrix dimensions>")
    for k, p in zip(keys, pf.policies):
        out[k] = p
    return out


_CONDS = _cond_policies(DIMS)


def env_dims(schema: Schema, action: str, pt: str, rt: str, dims: tuple[Dim, ...] = DIMS) -> list[Dim]:
    """The dimensions that apply to one request environment, in refinement order."""
    return [d for d in dims if d.applies(schema, action, pt, rt)]


@dataclass
class Witness:
    """A concrete request of a class (Cedar JSON), Cedar's replayed decision and determining policies,
    and its English sentence."""

    request: dict[str, Any]
    entities: list[dict[str, Any]]
    decision: str
    reasons: list[str]
    summary: str
    other: dict[str, Any] | None = None  # a diff's witness: Cedar's answer on the other policy set

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "decision": self.decision, "reasons": self.reasons,
                "request": self.request, "entities": self.entities,
                **({"other_set": self.other} if self.other is not None else {})}


@dataclass
class Cell:
    """One class of one action: its dimension values (``coords``), the proved ``verdict``, the region
    whose query proved it (``proved_by``: the dimension values fixed in that query), and witnesses
    (``allow``/``deny``: both for ``depends``; for a uniform region one sample of it)."""

    action: str
    principal: str
    resource: str
    coords: dict[str, str]
    verdict: str
    proved_by: dict[str, str]
    allow: Witness | None = None
    deny: Witness | None = None
    message: str = ""

    def key(self) -> tuple[Any, ...]:
        return (self.action, self.principal, self.resource, tuple(sorted(self.coords.items())))

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "principal": self.principal, "resource": self.resource,
                "class": self.coords, "verdict": self.verdict, "proved_by": self.proved_by,
                "allow_witness": self.allow.to_json() if self.allow else None,
                "deny_witness": self.deny.to_json() if self.deny else None,
                **({"message": self.message} if self.message else {})}


@dataclass
class Matrix:
    """Every cell of every action; ``queries`` solver calls, ``replays`` cedarpy replays, ``seconds``
    wall time of the build."""

    cells: list[Cell] = field(default_factory=list)
    queries: int = 0
    replays: int = 0
    seconds: float = 0.0

    def by_key(self) -> dict[tuple[Any, ...], Cell]:
        return {c.key(): c for c in self.cells}

    def actions(self) -> list[str]:
        seen: dict[str, None] = {}
        for c in self.cells:
            seen.setdefault(c.action, None)
        return list(seen)


# ---- solving

class _Env:
    """One request environment: the translated policy set(s), the dimension terms and a solver."""

    def __init__(self, schema: Schema, action: str, pt: str, rt: str, policy_sets: list[list[Policy]],
                 timeout_s: float) -> None:
        self.schema, self.action, self.pt, self.rt = schema, action, pt, rt
        self.reg = Registry()
        self.store = Store(schema, self.reg)
        self.req = Request.make(schema, self.reg, action, pt, rt)
        tr = Translator(schema, self.store, self.req)
        self.allows = [policy_set_terms(tr, ps).allow for ps in policy_sets]
        self.dims = env_dims(schema, action, pt, rt)
        self.terms: dict[tuple[str, str], z3.BoolRef] = {}
        for d in self.dims:
            for label, _ in d.values:
                t = tr.policy(_CONDS[(d.name, label)])
                assert isinstance(t, PolicyTerm)
                self.terms[(d.name, label)] = t.sat
        self.axioms = background(schema, self.store, [self.req])
        self.timeout_ms = int(timeout_s * 1000)
        self.queries = 0
        self._reg = self.reg  # the terms the axioms cover; witnesses are read through copies of it

    def fresh_store(self) -> Store:
        """A store over a copy of the translation's registry: writing a model out (``entities_json``)
        registers attribute terms, which must not leak into later queries or witnesses."""
        r = self._reg
        reg = Registry({k: dict(v) for k, v in r.entities.items()}, dict(r.longs), dict(r.sets), dict(r.elems),
                       codec=r.codec)  # the same string encoding as the translation (invariants.zstring)
        return Store(self.schema, reg)

    def cond(self, coords: dict[str, str]) -> list[z3.BoolRef]:
        return [self.terms[(d, v)] for d, v in coords.items()]

    def check(self, extra: list[z3.BoolRef]) -> tuple[str, z3.ModelRef | None]:
        """``sat`` (with a model whose sets are finite), ``unsat`` or ``unknown``. A fresh solver per
        query: Z3's incremental string solving slows down sharply over hundreds of push/pop rounds."""
        s = z3.Solver()
        s.set("timeout", self.timeout_ms)
        s.add(*self.axioms)
        s.push()
        try:
            s.add(*extra)
            self.queries += 1
            r = s.check()
            if r == z3.unsat:
                return "unsat", None
            if r == z3.unknown:
                return "unknown", None
            m = s.model()
            store = self.fresh_store()
            if _finite(m, store):
                return "sat", m
            for fin in (cx.model_finite_sets(m, store), cx.finite_sets_constraint(store)):
                s.push()
                s.add(*fin)
                self.queries += 1
                if s.check() == z3.sat and _finite(s.model(), store):
                    m = s.model()
                    s.pop()
                    return "sat", m
                s.pop()
            return "unknown", None
        finally:
            s.pop()

    def remaining(self, coords: dict[str, str]) -> list[Dim]:
        """Dimensions still to fix below ``coords`` (one ``under`` another splits only inside its class;
        the dimension it depends on comes first in DIMS)."""
        return [d for d in self.dims if d.name not in coords
                and (d.under is None or coords.get(d.under[0]) == d.under[1])]

    def value_in(self, m: z3.ModelRef, d: Dim) -> str | None:
        for label, _ in d.values:
            if z3.is_true(m.eval(self.terms[(d.name, label)], model_completion=True)):
                return label
        return None

    def leaves(self, coords: dict[str, str]) -> list[dict[str, str]]:
        """Every full class below ``coords``."""
        rest = self.remaining(coords)
        if not rest:
            return [dict(coords)]
        d = rest[0]
        return [leaf for label, _ in d.values for leaf in self.leaves({**coords, d.name: label})]

    def refine(self, coords: dict[str, str], goals: list[z3.BoolRef],
               stop: Callable[[list[str], bool], bool],
               done: Callable[[dict[str, str], list[tuple[str, z3.ModelRef | None]]], None],
               known: list[z3.ModelRef | None] | None = None) -> None:
        """Decide each goal in the class ``coords``; ``stop(statuses, more_dims)`` says whether this
        region is final (then ``done(coords, results)``), else split it on a remaining dimension — the
        first on which the models found disagree (the likeliest to separate them), else the first.
        A model found for the region is reused in the child it falls into, without a new query."""
        results: list[tuple[str, z3.ModelRef | None]] = []
        for i, g in enumerate(goals):
            m = known[i] if known else None
            results.append(("sat", m) if m is not None else self.check(self.cond(coords) + [g]))
        rest = self.remaining(coords)
        if stop([r for r, _ in results], bool(rest)):
            done(coords, results)
            return
        models = [m for _, m in results if m is not None]
        d = next((x for x in rest if len({self.value_in(m, x) for m in models}) > 1), rest[0])
        for label, _ in d.values:
            child = {**coords, d.name: label}
            inherit = [m if m is not None and self.value_in(m, d) == label else None for _, m in results]
            self.refine(child, goals, stop, done, inherit)


def _finite(m: z3.ModelRef, store: Store) -> bool:
    try:
        for t, _ in store.reg.sets.values():
            cx.set_members(m, t)
        return True
    except Unsupported:
        return False


def classify(schema: Schema, schema_text: str | None, request: dict[str, Any],
             entities: list[dict[str, Any]]) -> dict[str, str]:
    """The class of a concrete request (Cedar JSON), decided by cedarpy evaluating the dimension
    conditions; raises ``ValueError`` if a dimension has no value or several (not a partition)."""
    pt, rt, action = request["principal"]["type"], request["resource"]["type"], request["action"]["id"]
    dims = env_dims(schema, action, pt, rt)
    pols = [_CONDS[(d.name, label)] for d in dims for label, _ in d.values]
    held = authorize(request, pols, entities, schema_text).reasons if pols else frozenset()
    coords: dict[str, str] = {}
    for d in dims:
        if d.under is not None and coords.get(d.under[0], d.under[1]) != d.under[1]:
            continue
        vals = [label for label, _ in d.values if f"mx:{d.name}={label}" in held]
        if len(vals) != 1:
            raise ValueError(f"dimension {d.name}: {vals or 'no value'} holds for {request}")
        coords[d.name] = vals[0]
    return coords


def _witness(env: _Env, model: z3.ModelRef, policies: list[Policy], schema_text: str | None,
             coords: dict[str, str], expect: str | None, what: str, placed: bool = False) -> Witness:
    store = env.fresh_store()
    request, entities = cx.readable_ids(store, cx.request_json(model, env.req, store.reg.codec),
                                        cx.entities_json(model, env.schema, store))
    rep = authorize(request, policies, entities, schema_text)
    got = "allow" if rep.allow else "deny"
    doc = {"request": request, "entities": entities, "cedar": rep.to_json(), "expected": expect, "class": coords}
    if expect is not None and got != expect:
        raise MatrixDisagreement(f"{what}: Z3 proves {expect}, Cedar answers {got} ({env.action}, {coords})", doc)
    if placed:  # the same request was already placed in its class (the replay on the other set)
        return Witness(request, entities, got, sorted(rep.reasons),
                       request_sentence(request, entities, strings=policy_strings(policies)))
    try:
        seen = classify(env.schema, schema_text, request, entities)
    except ValueError as exc:
        raise MatrixDisagreement(f"{what}: {exc}", doc) from None
    if any(seen.get(k) != v for k, v in coords.items()):
        raise MatrixDisagreement(f"{what}: the witness is in class {seen}, not {coords} ({env.action})", doc)
    return Witness(request, entities, got, sorted(rep.reasons),
                       request_sentence(request, entities, strings=policy_strings(policies)))


def _other(w: Witness, seen: Witness) -> Witness:
    """``w`` with ``seen`` (the same request replayed on the other policy set) as its ``other``."""
    w.other = {"decision": seen.decision, "reasons": seen.reasons}
    return w


def _envs(schema: Schema) -> list[tuple[str, str, str]]:
    out = []
    for action in schema.applicable_actions():
        ad = schema.actions[action]
        for pt, rt in product(ad.principals, ad.resources):
            out.append((action, pt, rt))
    return out


def build_matrix(schema: Schema, schema_text: str | None, policies: list[Policy], timeout_s: float = 20.0,
                 actions: list[str] | None = None) -> Matrix:
    """The access matrix of ``policies`` (module docstring). Raises `MatrixDisagreement` when a
    witness's Cedar replay contradicts its proof."""
    t0 = time.perf_counter()
    mx = Matrix()
    for action, pt, rt in _envs(schema):
        if actions is not None and action not in actions:
            continue
        try:
            env = _Env(schema, action, pt, rt, [policies], timeout_s)
        except Unsupported as exc:
            mx.cells.append(Cell(action, pt, rt, {}, UNKNOWN, {}, message=str(exc)))
            continue
        allow = env.allows[0]

        def stop(st: list[str], more: bool) -> bool:
            return not (more and ("unknown" in st or st == ["sat", "sat"]))

        def done(coords: dict[str, str], res: list[tuple[str, z3.ModelRef | None]]) -> None:
            (ra, ma), (rd, md) = res
            verdict = (UNKNOWN if "unknown" in (ra, rd) else EMPTY if ra == rd == "unsat" else
                       DENIED if ra == "unsat" else PERMITTED if rd == "unsat" else DEPENDS)
            wa = _witness(env, ma, policies, schema_text, coords, "allow", "allow witness") if ma is not None else None
            wd = _witness(env, md, policies, schema_text, coords, "deny", "deny witness") if md is not None else None
            mx.replays += (wa is not None) + (wd is not None)
            for leaf in env.leaves(coords):
                mx.cells.append(Cell(action, pt, rt, leaf, verdict, dict(coords),
                                     wa if verdict in (PERMITTED, DEPENDS) else None,
                                     wd if verdict in (DENIED, DEPENDS) else None,
                                     "solver gave up" if verdict == UNKNOWN else ""))

        env.refine({}, [allow, z3.Not(allow)], stop, done)
        mx.queries += env.queries
    mx.seconds = time.perf_counter() - t0
    return mx


# ---- comparing two policy sets

@dataclass
class Change:
    """A cell whose permitted set differs between OLD and NEW: ``widened`` (a request NEW allows and
    OLD denies: ``widen`` witness) and/or ``narrowed`` (``narrow`` witness); ``old``/``new`` are the
    cell's verdicts under each set."""

    action: str
    principal: str
    resource: str
    coords: dict[str, str]
    old: str
    new: str
    widen: Witness | None = None
    narrow: Witness | None = None

    @property
    def widened(self) -> bool:
        return self.widen is not None

    @property
    def narrowed(self) -> bool:
        return self.narrow is not None

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "principal": self.principal, "resource": self.resource,
                "class": self.coords, "old": self.old, "new": self.new,
                "widened": self.widened, "narrowed": self.narrowed,
                "widen_witness": self.widen.to_json() if self.widen else None,
                "narrow_witness": self.narrow.to_json() if self.narrow else None}


@dataclass
class MatrixDiff:
    """The changed cells; ``unknown`` one line per region the solver or translator could not decide
    (``unknown_actions`` their actions); ``actions`` the actions compared."""

    changes: list[Change] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    unknown_actions: set[str] = field(default_factory=set)
    actions: list[str] = field(default_factory=list)
    queries: int = 0
    replays: int = 0
    seconds: float = 0.0

    @property
    def widened(self) -> bool:
        return any(c.widened for c in self.changes)


def _verdict(env: _Env, i: int, coords: dict[str, str], allow: bool | None = None, deny: bool | None = None) -> str:
    """The verdict of policy set ``i`` on the class ``coords``; ``allow``/``deny`` True when a request of
    the class that the set allows/denies is already known (no query for that side)."""
    base = env.cond(coords)
    ra = "sat" if allow else env.check(base + [env.allows[i]])[0]
    rd = "sat" if deny else env.check(base + [z3.Not(env.allows[i])])[0]
    if "unknown" in (ra, rd):
        return UNKNOWN
    return {("unsat", "unsat"): EMPTY, ("unsat", "sat"): DENIED, ("sat", "unsat"): PERMITTED}.get((ra, rd), DEPENDS)


def diff_matrices(schema: Schema, schema_text: str | None, old: list[Policy], new: list[Policy],
                  timeout_s: float = 20.0, actions: list[str] | None = None) -> MatrixDiff:
    """Cells whose permitted requests differ from ``old`` to ``new`` (both read against ``schema``);
    every witness is replayed on both sets through cedarpy (`MatrixDisagreement` otherwise)."""
    t0 = time.perf_counter()
    out = MatrixDiff()
    for action, pt, rt in _envs(schema):
        if actions is not None and action not in actions:
            continue
        if action not in out.actions:
            out.actions.append(action)
        try:
            env = _Env(schema, action, pt, rt, [old, new], timeout_s)
        except Unsupported as exc:
            out.unknown.append(f"{action} ({pt} → {rt}): {exc}")
            out.unknown_actions.add(action)
            continue
        a_old, a_new = env.allows

        def stop(st: list[str], more: bool) -> bool:
            return st == ["unsat", "unsat"] or not more

        def done(coords: dict[str, str], res: list[tuple[str, z3.ModelRef | None]]) -> None:
            (rw, mw), (rn, mn) = res
            if "unknown" in (rw, rn):
                out.unknown.append(f"{action} ({pt} → {rt}) {coords}: solver gave up")
                out.unknown_actions.add(action)
            ww = wn = None
            if mw is not None:
                ww = _other(_witness(env, mw, new, schema_text, coords, "allow", "widening witness (new set)"),
                            _witness(env, mw, old, schema_text, coords, "deny", "widening witness (old set)", placed=True))
            if mn is not None:
                wn = _other(_witness(env, mn, old, schema_text, coords, "allow", "narrowing witness (old set)"),
                            _witness(env, mn, new, schema_text, coords, "deny", "narrowing witness (new set)", placed=True))
            out.replays += 2 * ((ww is not None) + (wn is not None))
            if ww is None and wn is None:
                return
            # A widening witness is an old deny and a new allow, a narrowing one the converse: each
            # verdict needs at most the one query for the side no witness shows.
            out.changes.append(Change(action, pt, rt, dict(coords),
                                      _verdict(env, 0, coords, allow=wn is not None or None, deny=ww is not None or None),
                                      _verdict(env, 1, coords, allow=ww is not None or None, deny=wn is not None or None),
                                      ww, wn))

        env.refine({}, [z3.And(a_new, z3.Not(a_old)), z3.And(a_old, z3.Not(a_new))], stop, done)
        out.queries += env.queries
    out.seconds = time.perf_counter() - t0
    return out
