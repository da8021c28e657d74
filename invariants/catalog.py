"""Invariants: loading them from Cedar files and checking them, one per invariant × action.

An invariant file is a Cedar policy file (so reviewers read invariants in the language
of the policies, docs/design.md §3).  Each policy in it is one invariant; ``@id`` names it and
``@kind`` says how it is read (default ``bound``):

``bound`` + ``permit (scope) when { C }``
    For every schema-valid request in the scope that the policy set allows, C holds
    (and evaluates without error).  "The policies permit at most this."
``bound`` + ``forbid (scope) when { C }``
    Every schema-valid request in the scope for which C holds is denied.
``never-errors`` + ``permit (scope);``
    No policy raises an evaluation error on a schema-valid request in the scope
    (Cedar skips an erroring policy, so an erroring forbid silently allows).
``monotone`` + ``@attribute("trust")`` + ``permit (principal is T, ...) when { C };``
    Raising the principal's Long attribute never turns an Allow into a Deny (C, if
    given, restricts the requests considered).
``unconstrained`` + ``permit (principal, action == Action::"x", resource);``
    Declares that the actions in scope are deliberately not covered by any invariant.

Every action of the schema must be covered by a ``bound`` or ``monotone`` invariant or
be declared ``unconstrained``; otherwise the check reports it (status UNCOVERED).  An
``unconstrained`` declaration only counts for coverage: it never exempts an action from an
invariant that covers it.  An invariant named in ``required`` that applies to no action of the
schema (e.g. after a schema change removed what it talks about) is reported VACUOUS, a failure:
an invariant that checks nothing is never counted as holding.

"Schema-valid request": principal and resource types allowed by the action's
``appliesTo``, principal and resource present in the entity store, context of the
declared type, entity attributes of their declared types.  Other entities referenced
from attributes may be absent from the store (a revoked agent still owns rows).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import z3
from cedarpy import pst

from . import counterexample as cx
from .concrete import evaluate
from .engine import Policy, Replay, authorize
from .errors import Unsupported
from .summary import counterexample_summary as cx_summary
from .summary import policy_strings
from .schema import LONG, Schema
from .translate import (LONG_MAX, LONG_MIN, PolicyTerm, Query, Registry, Request, Store, Translator, Val,
                        background, policy_set_terms)

__all__ = ["Invariant", "CheckResult", "PolicyRef", "describe", "KINDS", "load_invariants", "check_invariants", "compare_sets", "compare_results",
           "actions_of", "DEFAULT_TIMEOUT_S"]

KINDS = ("bound", "never-errors", "monotone", "unconstrained")
DEFAULT_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Invariant:
    id: str
    kind: str
    policy: Policy
    attribute: str | None = None
    description: str = ""


def load_invariants(policies: list[Policy]) -> list[Invariant]:
    """Interpret parsed invariant policies; raises ``ValueError`` on a bad ``@kind``."""
    out = []
    for p in policies:
        kind = p.ast.annotations.get("kind", "bound")
        if kind not in KINDS:
            raise ValueError(f"{p.file}:{p.line}: unknown @kind {kind!r} (one of {', '.join(KINDS)})")
        attr = p.ast.annotations.get("attribute")
        if kind == "monotone" and not attr:
            raise ValueError(f"{p.file}:{p.line}: @kind(\"monotone\") needs @attribute(\"<principal attribute>\")")
        out.append(Invariant(p.id, kind, p, attr, p.ast.annotations.get("description", "")))
    return out


def actions_of(schema: Schema, sc: Any) -> list[str]:
    """Schema actions (with appliesTo) that an action scope admits."""
    acts = schema.applicable_actions()
    if isinstance(sc, pst.ScopeAny):
        return acts
    if isinstance(sc, pst.ActionEq):
        return [a for a in acts if a == sc.entity.id]
    ids = {e.id for e in sc.entities}
    return [a for a in acts if ids & (schema.action_ancestors(a) | {a})]


@dataclass(frozen=True)
class PolicyRef:
    """A policy named in a result: its display id and where it is written (1-based line and column)."""

    id: str
    file: str
    line: int
    column: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.id, "file": self.file, "line": self.line, "column": self.column}

    def __str__(self) -> str:
        return f"{self.id} at {self.file}:{self.line}"


@dataclass
class CheckResult:
    """One invariant × action.  ``status``: PROVED, VIOLATED, UNKNOWN, DISAGREE (model and
    Cedar disagree on the counterexample: a translator bug), UNCOVERED or VACUOUS; for ``--compare``
    (`compare_results`) UNCHANGED, CHANGED (widened) or NARROWED.  ``seconds`` is
    solver time summed over the request environments.  ``file``/``line``: the invariant.

    For a result with a counterexample: ``summary`` is one English line (``invariants.summary``, e.g.
    "agent agent1 (fleet fleet1, trust 0) may read a fleet-scoped row memory1 owned by agent2 in fleet
    fleet2"); ``permitted_by`` the policies Cedar names as determining the counterexample's Allow (for a
    ``--compare`` change: on the set that allows it); ``blamed`` the policies a reviewer should look at
    first — the permits of a violated bound, the policies raising the evaluation error of
    ``never-errors``, the forbids that deny the raised-trust request of ``monotone`` (else its permits)."""

    invariant: str
    action: str
    status: str
    seconds: float = 0.0
    message: str = ""
    counterexample: dict[str, Any] | None = None
    file: str = ""
    line: int = 0
    summary: str = ""
    permitted_by: list[PolicyRef] = field(default_factory=list)
    blamed: list[PolicyRef] = field(default_factory=list)


def _refs(ids: list[str], policies: list[Policy]) -> list[PolicyRef]:
    by_id = {p.id: p for p in policies}
    out = []
    for pid in ids:
        p = by_id.get(pid)
        out.append(PolicyRef(pid, p.file, p.line, getattr(p, "column", 1)) if p is not None else PolicyRef(pid, "", 0))
    return out


def describe(r: CheckResult, policies: list[Policy]) -> CheckResult:
    """Fill ``summary``, ``permitted_by`` and ``blamed`` of a result from its counterexample; returns ``r``."""
    cex = r.counterexample
    if not cex:
        return r
    r.summary = cx_summary(cex, policy_strings(policies))
    if "new" in cex and "cedar" not in cex:  # --compare: the side that allows the request
        side = cex["new"] if cex.get("invariant") == "newly-permitted" else cex["old"]
        cedar = side.get("cedar") or {}
    else:
        cedar = cex.get("cedar") or {}
    allow_ids = list(cedar.get("reasons") or []) if cedar.get("decision") == "allow" else []
    r.permitted_by = _refs(allow_ids, policies)
    if cex.get("kind") == "never-errors":
        r.blamed = _refs(list(cedar.get("errors") or []), policies)
    elif cex.get("kind") == "monotone":
        raised = ((cex.get("raised") or {}).get("cedar") or {}).get("reasons") or []
        r.blamed = _refs(list(raised), policies) or list(r.permitted_by)
    else:
        r.blamed = list(r.permitted_by)
    return r


@dataclass
class _EnvCheck:
    status: str
    seconds: float
    message: str = ""
    cex: dict[str, Any] | None = None


def _scope_only(p: Policy) -> Policy:
    return dataclasses.replace(p, ast=dataclasses.replace(p.ast, clauses=()))


def _agrees(model_v: dict[str, Any], cedar: Replay) -> bool:
    return model_v == cedar.to_json()


class _Solve:
    """One query's solver, with restarts.

    Z3's string and sequence solver has a heavy-tailed run time: the same query (e.g. a ``like`` pattern over
    characters above Z3's range) is answered in 0.4 s under one random seed and not within 15 s under another
    (tests/invariants/test_strings.py's ``like-high-char`` case: with one solver, global seeds 4-11 took up to
    62.8 s of a 60 s budget, seed 8 UNKNOWN at 15 s; with this schedule seeds 5, 6, 8, 10 took 0.55-4.6 s). So the query's
    budget ``timeout_s`` is spent on a schedule of attempts (``RESTARTS``: fractions of the budget), each a
    fresh solver with another ``random_seed``; the first ``sat``/``unsat`` is the answer (sound whichever seed
    found it), and only when every attempt ran out is the query UNKNOWN.
    """

    RESTARTS = (0.02, 0.02, 0.04, 0.04, 0.08, 0.1, 0.2, 0.5)  # fractions of the budget, one seed each; sum 1

    def __init__(self, timeout_s: float) -> None:
        self.timeout_ms = int(timeout_s * 1000)

    def __call__(self, axioms: list[z3.BoolRef], goal: z3.BoolRef, store: Store
                 ) -> tuple[str, float, z3.ModelRef | None, str]:
        dt = 0.0
        for seed, share in enumerate(self.RESTARTS):
            s = z3.Solver()
            s.set("timeout", max(1, int(self.timeout_ms * share)))
            s.set("random_seed", seed)
            s.add(*axioms)
            s.add(goal)
            t0 = time.perf_counter()
            r = s.check()
            dt += time.perf_counter() - t0
            if r != z3.unknown:
                break
            reason = s.reason_unknown()
            if reason not in ("timeout", "canceled"):
                break  # incomplete for this query (not a matter of luck): another seed will not help
        if r == z3.unsat:
            return "unsat", dt, None, ""
        if r == z3.unknown:
            return "unknown", dt, None, f"solver: {s.reason_unknown()}"
        m = s.model()
        try:
            _probe_sets(m, store)
            return "sat", dt, m, ""
        except Unsupported:
            pass
        s.set("timeout", self.timeout_ms)
        # A co-finite set in the model.  First try the finite set of the model's explicit
        # members plus every mentioned term it contains; then the general finite encoding.
        for extra in (cx.model_finite_sets(m, store), cx.finite_sets_constraint(store)):
            s.push()
            s.add(*extra)
            t0 = time.perf_counter()
            r = s.check()
            dt += time.perf_counter() - t0
            if r == z3.sat:
                m = s.model()
                try:
                    _probe_sets(m, store)
                    return "sat", dt, m, ""
                except Unsupported:
                    pass
            s.pop()
        return "unknown", dt, None, "counterexample needs a set the finite-set model cannot express"


def _probe_sets(m: z3.ModelRef, store: Store) -> None:
    for t, _ in store.reg.sets.values():
        cx.set_members(m, t)


def _env_checks(schema: Schema, schema_text: str | None, policies: list[Policy], invs: list[Invariant],
                action: str, ptype: str, rtype: str, solve: _Solve) -> dict[str, _EnvCheck]:
    reg = Registry()
    store = Store(schema, reg)
    req = Request.make(schema, reg, action, ptype, rtype)
    tr = Translator(schema, store, req)
    out: dict[str, _EnvCheck] = {}
    try:
        q = policy_set_terms(tr, policies)
    except Unsupported as exc:
        unknown = {}
        for i in invs:
            try:
                if tr.policy(_scope_only(i.policy)) is None:
                    continue
            except Unsupported:
                pass
            unknown[i.id] = _EnvCheck("UNKNOWN", 0.0, str(exc))
        return unknown
    goals: dict[str, tuple[z3.BoolRef, Any]] = {}
    for inv in invs:
        try:
            scope = tr.policy(_scope_only(inv.policy))
            if scope is None:
                continue
            full = tr.policy(inv.policy)
            assert full is not None
            if inv.kind == "never-errors":
                goals[inv.id] = (z3.And(scope.sat, z3.Or(z3.BoolVal(False), *[t.err for t in q.terms])), None)
            elif inv.kind == "monotone":
                goal2 = _monotone(schema, store, req, policies, inv, full, q)
                if goal2 is not None:
                    goals[inv.id] = goal2
            elif inv.policy.ast.effect == "permit":
                goals[inv.id] = (z3.And(q.allow, scope.sat, z3.Not(full.sat)), None)
            else:
                goals[inv.id] = (z3.And(q.allow, full.sat), None)
        except Unsupported as exc:
            out[inv.id] = _EnvCheck("UNKNOWN", 0.0, str(exc))
    axioms = background(schema, store, [req])
    by_id = {i.id: i for i in invs}
    for iid, (goal, extra) in goals.items():
        res, dt, model, why = solve(axioms, goal, store)
        if res == "unsat":
            out[iid] = _EnvCheck("PROVED", dt)
        elif res == "unknown" or model is None:
            out[iid] = _EnvCheck("UNKNOWN", dt, why)
        else:
            try:
                out[iid] = _counterexample(schema, schema_text, policies, by_id[iid], q, extra, model, dt)
            except Unsupported as exc:
                out[iid] = _EnvCheck("UNKNOWN", dt, f"counterexample: {exc}")
            except ValueError as exc:
                # Cedar rejected the written-out counterexample (e.g. a value outside Cedar's
                # ranges): the model admitted an input Cedar does not — a translator bug.
                out[iid] = _EnvCheck("DISAGREE", dt, f"Cedar rejected the model's counterexample: {exc}")
    return out


def _monotone(schema: Schema, store: Store, req: Request, policies: list[Policy], inv: Invariant,
              full: PolicyTerm, q: Query) -> tuple[z3.BoolRef, Any] | None:
    attr = (inv.attribute or "").removeprefix("principal.")
    a = store.attr_decl(req.ptype, attr)
    if a is None:
        return None
    if a.type != LONG:
        raise Unsupported(f"monotone attribute {attr} is not a Long")
    raised = z3.Int(f"raised.{attr}")
    store.reg.longs[raised.get_id()] = raised
    base = store.attr(req.ptype, attr, req.p).term

    def override(x: z3.ExprRef, v: Val) -> Val:
        return Val(LONG, z3.If(x == req.p, raised, v.term))

    store2 = store.with_overrides({(req.ptype, attr): override})
    q2 = policy_set_terms(Translator(schema, store2, req), policies)
    return z3.And(full.sat, raised > base, raised <= LONG_MAX, raised >= LONG_MIN,
                  q.allow, z3.Not(q2.allow)), (store2, q2)


def _counterexample(schema: Schema, schema_text: str | None, policies: list[Policy], inv: Invariant,
                    q: Query, extra: Any, model: z3.ModelRef, dt: float) -> _EnvCheck:
    """Write the model out as Cedar JSON, re-evaluate that concrete input with the Z3
    model (``concrete.evaluate``) and with Cedar, and check that both agree and that it
    really violates the invariant."""
    request, entities = cx.readable_ids(q.store, cx.request_json(model, q.req, q.store.reg.codec),
                                        cx.entities_json(model, schema, q.store))
    mv = evaluate(schema, policies, request, entities)
    cedar = authorize(request, policies, entities, schema_text)
    cex: dict[str, Any] = {"invariant": inv.id, "kind": inv.kind, "request": request, "entities": entities,
                           "model": mv, "cedar": cedar.to_json()}
    ok = _agrees(mv, cedar)
    if inv.kind == "bound":
        # The invariant itself, evaluated by both on the same request.
        forbid = inv.policy.ast.effect == "forbid"
        im = inv.policy.id in evaluate(schema, [inv.policy], request, entities)["reasons"]
        ic = inv.policy.id in authorize(request, [inv.policy], entities, schema_text).reasons
        cex["invariant_condition"] = {"model": im, "cedar": ic}
        ok = ok and im == ic == forbid and mv["decision"] == "allow"
    elif inv.kind == "never-errors":
        ok = ok and bool(mv["errors"])
    elif inv.kind == "monotone":
        store2, _ = extra
        _, entities2 = cx.readable_ids(q.store, cx.request_json(model, q.req, q.store.reg.codec),
                                       cx.entities_json(model, schema, store2))
        mv2 = evaluate(schema, policies, request, entities2)
        cedar2 = authorize(request, policies, entities2, schema_text)
        cex["raised"] = {"entities": entities2, "model": mv2, "cedar": cedar2.to_json()}
        ok = ok and _agrees(mv2, cedar2) and mv["decision"] == "allow" and mv2["decision"] == "deny"
    if not ok:
        return _EnvCheck("DISAGREE", dt, "the Z3 model and Cedar disagree on this counterexample "
                         "(translator bug)", cex)
    return _EnvCheck("VIOLATED", dt, _explain(inv, mv), cex)


def _explain(inv: Invariant, mv: dict[str, Any]) -> str:
    if inv.kind == "never-errors":
        return "policy " + ", ".join(mv["errors"]) + " raises an evaluation error"
    if inv.kind == "monotone":
        return f"raising principal.{inv.attribute} turns Allow into Deny"
    return "allowed by " + ", ".join(mv["reasons"]) if mv["decision"] == "allow" else "decision " + mv["decision"]


def _merge(inv: Invariant, action: str, parts: list[_EnvCheck]) -> CheckResult:
    secs = sum(p.seconds for p in parts)
    base = CheckResult(inv.id, action, "PROVED", secs, file=inv.policy.file, line=inv.policy.line)
    for status in ("DISAGREE", "VIOLATED", "UNKNOWN"):
        hit = [p for p in parts if p.status == status]
        if hit:
            base.status, base.message, base.counterexample = status, hit[0].message, hit[0].cex
            return base
    return base


def check_invariants(schema: Schema, schema_text: str | None, policies: list[Policy], invs: list[Invariant],
                     timeout_s: float = DEFAULT_TIMEOUT_S, required: frozenset[str] | set[str] = frozenset()
                     ) -> list[CheckResult]:
    """Check every invariant on every action it covers, then coverage of the schema's
    actions.  Returns one ``CheckResult`` per invariant × action (+ UNCOVERED rows, + a VACUOUS
    row for each invariant id in ``required`` that applies to no request of the schema)."""
    solve = _Solve(timeout_s)
    checkable = [i for i in invs if i.kind != "unconstrained"]
    per: dict[tuple[str, str], list[_EnvCheck]] = {}
    for action in schema.applicable_actions():
        ad = schema.actions[action]
        relevant = [i for i in checkable if action in actions_of(schema, i.policy.ast.action)]
        if not relevant:
            continue
        for pt, rt in product(ad.principals, ad.resources):
            try:
                env = _env_checks(schema, schema_text, policies, relevant, action, pt, rt, solve)
            except Unsupported as exc:
                env = {i.id: _EnvCheck("UNKNOWN", 0.0, str(exc)) for i in relevant}
            for iid, r in env.items():
                per.setdefault((iid, action), []).append(r)
    results: list[CheckResult] = []
    by_id = {i.id: i for i in invs}
    order = {i.id: n for n, i in enumerate(invs)}
    acts = schema.applicable_actions()
    for (iid, action), parts in sorted(per.items(), key=lambda kv: (order[kv[0][0]], acts.index(kv[0][1]))):
        results.append(describe(_merge(by_id[iid], action, parts), policies))
    covered = {a for i in invs if i.kind in ("bound", "monotone", "unconstrained")
               for a in actions_of(schema, i.policy.ast.action)
               if i.kind == "unconstrained" or (i.id, a) in per}
    for a in schema.applicable_actions():
        if a not in covered:
            results.append(CheckResult("coverage", a, "UNCOVERED", 0.0,
                                       f"action {a} is covered by no invariant and not declared unconstrained"))
    checked = {iid for iid, _ in per}
    for inv in checkable:
        if inv.id in required and inv.id not in checked:
            results.append(CheckResult(inv.id, "-", "VACUOUS", 0.0,
                                       "applies to no request of this schema: it checks nothing",
                                       file=inv.policy.file, line=inv.policy.line))
    return results


def compare_results(diff: Any, old: list[Policy], new: list[Policy]) -> list[CheckResult]:
    """The per-action view of an access-matrix diff (``invariants.matrix.MatrixDiff``): for each action
    compared, ``newly-permitted`` — CHANGED when some class widened (its first widening witness, replayed
    on both sets, is the counterexample), else UNCHANGED — and ``newly-denied`` — NARROWED or UNCHANGED
    likewise; UNKNOWN where part of the action could not be decided and nothing changed."""
    results = []
    for action in diff.actions:
        for direction, attr in (("newly-permitted", "widen"), ("newly-denied", "narrow")):
            hits = [c for c in diff.changes if c.action == action and getattr(c, attr) is not None]
            r = CheckResult(direction, action, "UNCHANGED")
            if hits:
                w = getattr(hits[0], attr)
                old_side = w.other if attr == "widen" else {"decision": w.decision, "reasons": w.reasons}
                new_side = {"decision": w.decision, "reasons": w.reasons} if attr == "widen" else w.other
                r.status = "CHANGED" if attr == "widen" else "NARROWED"
                r.counterexample = {"invariant": direction, "request": w.request, "entities": w.entities,
                                    "class": hits[0].coords, "old": {"cedar": old_side}, "new": {"cedar": new_side}}
                r.message = (f"{direction.replace('-', ' ')} in {len(hits)} class{'es' * (len(hits) != 1)}, e.g. "
                             f"old {old_side['decision']} ({', '.join(old_side['reasons']) or 'no policy'}), "
                             f"new {new_side['decision']} ({', '.join(new_side['reasons']) or 'no policy'})")
            elif action in diff.unknown_actions:
                r.status = "UNKNOWN"
                r.message = next(u for u in diff.unknown if u.startswith(f"{action} "))
            results.append(describe(r, new if direction == "newly-permitted" else old))
    return results


def compare_sets(schema: Schema, schema_text: str | None, old: list[Policy], new: list[Policy],
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> list[CheckResult]:
    """Requests newly permitted / newly denied between two policy sets, per action: `compare_results`
    of the access-matrix diff (``invariants.matrix.diff_matrices``, every witness replayed on both sets
    through Cedar). A witness Cedar contradicts is one DISAGREE result carrying it."""
    from .matrix import MatrixDisagreement, diff_matrices

    try:
        diff = diff_matrices(schema, schema_text, old, new, timeout_s)
    except MatrixDisagreement as exc:
        return [CheckResult("compare", "-", "DISAGREE", 0.0, str(exc), exc.witness)]
    return compare_results(diff, old, new)
