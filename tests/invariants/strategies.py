"""Hypothesis strategies: schema-conforming Cedar policies, entity stores and requests
for the memwarden schema (policies/memwarden.cedarschema) and for DEEP_SCHEMA (a six-level
entity hierarchy with several parents per type).

Policies are generated as Cedar source text from a typed expression grammar, so that
(almost) every generated policy passes Cedar's strict validation; the differential
test discards the rare invalid one.  Entity ids come from a small fixed universe so
that literals, attribute values and the request collide often, and some referenced
entities are deliberately absent from the store (dangling references).

The literal space is the one Cedar accepts (issue 12): strings and entity ids hold backslashes,
quotes, the text of escape sequences (``\\u{61}``), control characters, ``*``, non-BMP characters
and characters above Z3's range; every character of a literal is written in one of Cedar's
spellings, chosen at random — raw, ``\\u{…}`` with 1–6 hex digits, ``\\xHH``, or a named escape
(``\\n \\r \\t \\\\ \\0 \\' \\"``); ``like`` patterns mix wildcards (``*`` and its escapes
``\\x2a``/``\\u{2a}``, which Cedar reads as wildcards too) with literal stars (``\\*``). Longs
include both ends of the 64-bit range; set literals and set values keep duplicates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from hypothesis import strategies as st

from invariants.schema import Schema, TBool, TEntity, TLong, TRecord, TSet, TString, CedarType

T = TypeVar("T")

class Draw:
    """The choices a generator makes. `HypothesisDraw` takes them from Hypothesis (shrinkable, for the
    tests); `RandomDraw` from a seeded ``random.Random`` (no engine overhead: bench/differential.py's
    100,000 examples). ``ids`` is the entity-id universe in use (`gen_scenario` narrows it per example, so
    that the few ids of one example collide often)."""

    ids: dict[str, list[str]] = {}

    def choice(self, seq: Sequence[T]) -> T:
        raise NotImplementedError

    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def bool(self) -> bool:
        return self.int(0, 1) == 1

    def some(self, seq: Sequence[T], lo: int, hi: int, unique: bool = False) -> list[T]:
        n = self.int(lo, min(hi, len(seq)) if unique else hi)
        pool = list(seq)
        out = []
        for _ in range(n):
            x = self.choice(pool)
            out.append(x)
            if unique:
                pool.remove(x)
        return out

    def text(self, alphabet: Sequence[str], max_size: int) -> str:
        return "".join(self.choice(alphabet) for _ in range(self.int(0, max_size)))


class HypothesisDraw(Draw):
    def __init__(self, draw: Callable[[Any], Any]) -> None:
        self.draw = draw

    def choice(self, seq: Sequence[T]) -> T:
        return self.draw(st.sampled_from(seq))  # type: ignore[no-any-return]

    def int(self, lo: int, hi: int) -> int:
        return int(self.draw(st.integers(lo, hi)))

    def bool(self) -> bool:
        return bool(self.draw(st.booleans()))


class RandomDraw(Draw):
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


HI = chr(0x10FFFF)
# Ids with the shapes Cedar allows: "/", "::", whitespace, unicode, escape text, quotes, backslashes.
IDS: dict[str, list[str]] = {
    "Tenant": ["t1", "t2", "t1/\\u{6f}ps", ""],
    "Fleet": ["t1/f1", "t1/f2", "t2/f1", "t1/ops", "t1/\\u{6f}ps", "t1::f1", "t1/ f1", "t1/ü", "t1/😀"],
    "Agent": ["t1/f1/a1", "t1/f2/a2", "t2/f1/a3", "t1/f1/\\u{61}1", "t1/f1/a1 ", f"t1/f1/{HI}"],
    "TenantAdmin": ["t1/admin/k1", "t2/admin/k2", "t1/admin/\"k\""],
    "Namespace": ["t1/db", "t2/db", "t1/\\"],
    "Collection": ["chroma:c1", "chroma:c2", "mem0:default/t1", "chroma:\\x41"],
    "Memory": ["m1", "m2", "m3", "chroma:c1:m\\u{31}", "chroma:c1:m1"],
    "Operator": ["op1", "op2", "op\\0"],
    "Deployment": ["chroma", "mem0:default", "mem0:\\u{64}efault"],
    # DEEP_SCHEMA
    "L0": ["x", "y", "\\u{78}"], "L1": ["x", "y"], "L2": ["x", "y", "z"], "L3": ["x", "y"],
    "L4": ["x", "y"], "L5": ["x", ""],
}
# Strings that collide with each other under a wrong reading: escape text vs the character it names,
# U+10FFFF vs its escape text, stars, backslashes, quotes, control characters, the empty string.
STRINGS = ["", "agent", "fleet", "tenant", "restricted", "deleted", "active", "t1", "t1/x", "t10/x", "a*b", "ü",
           "\\u{61}gent", "\\u{10ffff}", HI, chr(0x2FFFF), chr(0x30000), "😀", "\\u{1f600}", "\\x41", "A",
           "\\", "\\\\", '"', '\\"', "'", "\0", "\\0", "\n", "\\n", "\t", "\r", " ", "*", "\\*", "**", "a",
           "t1/\\u{6f}ps", "t1/ops", "::", "a\\u{0}b"]
ALPHABET = ["a", "b", "*", "\\", '"', "'", "u", "{", "}", "6", "1", "/", ":", " ", "\n", "\0", "\t", "ü", "😀", HI,
            chr(0x2FFFF), chr(0x30000), chr(0xE000), chr(0xFFFF), chr(0x7F)]
LONGS = [0, 1, 2, 3, -1, 9223372036854775807, -9223372036854775807, -9223372036854775808, 4611686018427387904,
         3037000500, -3037000500, 9223372036854775806]
PATTERNS = ["t1*", "*", "*leet", "a\\*b", "t1/*", "", "*e*", "deleted"]  # used by the symbolic-replay test

DEEP_SCHEMA = """
entity L5;
entity L4 in [L5];
entity L3 in [L4, L5];
entity L2 in [L3, L4];
entity L1 in [L2, L5] { up: L2, tag: String, n: Long };
entity L0 in [L1, L3] { next: L1, tag: String, n: Long, peers: Set<L2>, names: Set<String>, alias?: String };
action go appliesTo { principal: [L0, L1], resource: [L0, L2], context: { who: L3, label: String } };
action stop appliesTo { principal: [L0], resource: [L1] };
"""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", "\0": "\\0", "'": "\\'", '"': '\\"'}


def _char_src(ch: str, draw: "Draw", in_pattern: bool = False) -> str:
    """One character of a Cedar string literal, in a randomly chosen spelling Cedar reads as ``ch``."""
    cp = ord(ch)
    if in_pattern and ch == "*":
        return "\\*"  # the only spelling of a literal star in a pattern
    forms = []
    if ch not in ('"', "\\"):
        forms.append(ch)
    digits = f"{cp:x}"
    forms += [f"\\u{{{digits.rjust(w, '0')}}}" for w in range(len(digits), 7)]
    if cp <= 0x7F:
        forms.append(f"\\x{cp:02x}")
    if ch in _NAMED:
        forms.append(_NAMED[ch])
    return str(draw.choice(forms))


def q(s: str, draw: "Draw | None" = None) -> str:
    """A Cedar string literal denoting exactly ``s`` (without ``draw``: the plainest spelling)."""
    if draw is None:
        return '"' + "".join(_NAMED.get(c, c) if c in '"\\' or c in "\n\r\t\0" else c for c in s) + '"'
    return '"' + "".join(_char_src(c, draw) for c in s) + '"'


def pattern_src(elems: list[str | None], draw: "Draw") -> str:
    """A Cedar ``like`` pattern: ``None`` is a wildcard, a str a literal character."""
    out = []
    for el in elems:
        out.append(str(draw.choice(["*", "*", "\\x2a", "\\u{2a}"])) if el is None else _char_src(el, draw, True))
    return '"' + "".join(out) + '"'


def cedar_string(draw: "Draw") -> str:
    """A string value: mostly from the colliding universe, sometimes random over the awkward alphabet."""
    if draw.int(0, 3) == 0:
        return str(draw.text(ALPHABET, 4))
    return str(draw.choice(STRINGS))


def like_pattern(draw: "Draw") -> str:
    """A pattern derived from a universe string (so it often matches): some characters become wildcards,
    some wildcards are inserted."""
    base = cedar_string(draw)
    elems: list[str | None] = []
    for ch in base:
        k = draw.int(0, 5)
        if k == 0:
            elems.append(None)
        elif k == 1:
            elems += [None, ch]
        else:
            elems.append(ch)
    if draw.bool():
        elems.insert(draw.int(0, len(elems)), None)
    return pattern_src(elems, draw)


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


def _literal(ty: CedarType, draw: "Draw") -> str:
    if isinstance(ty, TBool):
        return draw.choice(["true", "false"])
    if isinstance(ty, TLong):
        return str(draw.choice(LONGS))
    if isinstance(ty, TString):
        return q(cedar_string(draw), draw)
    if isinstance(ty, TEntity):
        return f"{ty.name}::{q(draw.choice(draw.ids.get(ty.name) or IDS[ty.name]), draw)}"
    if isinstance(ty, TSet):
        n = draw.int(1, 4)  # duplicates are common: the universes are small
        return "[" + ", ".join(_literal(ty.elem, draw) for _ in range(n)) + "]"
    raise AssertionError(ty)


class ExprGen:
    def __init__(self, schema: Schema, env: Env, draw: "Draw") -> None:
        self.schema, self.env, self.draw = schema, env, draw
        self.paths = _paths(schema, env)
        self.types = sorted(t for t in schema.entities if t in IDS)
        # an entity type for generic set/contains atoms: one with a set-valued attribute of it if any
        sets = [a.type.elem.name for d in schema.entities.values() for _, a in d.attrs.fields
                if isinstance(a.type, TSet) and isinstance(a.type.elem, TEntity)]
        self.member = sets[0] if sets else self.types[0]

    def _typed_paths(self, ty: CedarType) -> list[tuple[str, str | None]]:
        return [(e, g) for e, t, g in self.paths if t == ty]

    def _path(self, ty: CedarType) -> str | None:
        cands = self._typed_paths(ty)
        if not cands:
            return None
        e, g = self.draw.choice(cands)
        if g is None:
            return e
        return f"(if {g} then {e} else {_literal(ty, self.draw)})"

    def of(self, ty: CedarType, depth: int) -> str:
        d = self.draw
        if depth <= 0 or d.int(0, 3) == 0:
            p = self._path(ty) if d.bool() else None
            return p if p is not None else _literal(ty, d)
        if isinstance(ty, TBool):
            return self.boolean(depth)
        if isinstance(ty, TLong):
            k = d.int(0, 4)
            if k == 0:
                return f"({self.of(ty, depth - 1)} {d.choice(['+', '-', '*'])} {self.of(ty, depth - 1)})"
            if k == 1:
                return f"(-{self.of(ty, depth - 1)})"
            if k == 2:
                return f"(if {self.boolean(depth - 1)} then {self.of(ty, depth - 1)} else {self.of(ty, depth - 1)})"
        if isinstance(ty, (TEntity, TString, TSet)) and d.int(0, 3) == 0:
            return f"(if {self.boolean(depth - 1)} then {self.of(ty, depth - 1)} else {self.of(ty, depth - 1)})"
        p = self._path(ty)
        return p if p is not None else _literal(ty, d)

    def _entity_type(self) -> str:
        return str(self.draw.choice(self.types))

    def boolean(self, depth: int) -> str:
        d = self.draw
        if depth <= 0:
            return d.choice(["true", "false"]) if d.bool() else self._atom(0)
        k = d.int(0, 5)
        if k == 0:
            return f"({self.boolean(depth - 1)} {d.choice(['&&', '||'])} {self.boolean(depth - 1)})"
        if k == 1:
            return f"(!{self.boolean(depth - 1)})"
        if k == 2:
            return f"(if {self.boolean(depth - 1)} then {self.boolean(depth - 1)} else {self.boolean(depth - 1)})"
        return self._atom(depth - 1)

    def _atom(self, depth: int) -> str:
        d = self.draw
        k = d.int(0, 14)
        if k == 14:  # Long arithmetic at the ends of the range: overflow is an evaluation error
            a, b = self.of(TLong(), depth), str(d.choice(LONGS))
            op = d.choice(["+", "-", "*"])
            inner = f"({a} {op} {b})" if d.bool() else f"(-{b})" if b.startswith("9") else f"({b} {op} {a})"
            return f"({inner} {d.choice(['<', '<=', '>', '>=', '==', '!='])} {d.choice(LONGS)})"
        if k == 0:
            op = d.choice(["<", "<=", ">", ">=", "==", "!="])
            return f"({self.of(TLong(), depth)} {op} {self.of(TLong(), depth)})"
        if k == 1:
            return f"({self.of(TString(), depth)} {d.choice(['==', '!='])} {self.of(TString(), depth)})"
        if k == 2:
            t = TEntity(self._entity_type())
            return f"({self.of(t, depth)} {d.choice(['==', '!='])} {self.of(t, depth)})"
        if k == 3:
            t = self._entity_type()
            ups = sorted(self.schema.ancestor_types(t) | {t})
            u = d.choice(ups)
            if d.bool():
                return f"({self.of(TEntity(t), depth)} in {self.of(TEntity(u), depth)})"
            return f"({self.of(TEntity(t), depth)} in {_literal(TSet(TEntity(u)), d)})"
        if k == 4:
            elem = d.choice([TString(), TEntity(self.member), TLong()])
            return f"{self.of(TSet(elem), depth)}.contains({self.of(elem, depth)})"
        if k == 5:
            elem = d.choice([TString(), TEntity(self.member)])
            m = d.choice(["containsAll", "containsAny"])
            return f"{self.of(TSet(elem), depth)}.{m}({self.of(TSet(elem), depth)})"
        if k == 6:
            return f"({self.of(TString(), depth)} like {like_pattern(d)})"
        if k == 7:
            cands = [(e, t) for e, t, g in self.paths if isinstance(t, TEntity) and g is None]
            e, t = d.choice(cands)
            attrs = [n for n, _ in self.schema.entities[t.name].attrs.fields] if t.name in self.schema.entities else []
            return f"({e} has {d.choice(attrs + ['nope'])})"
        if k == 8:
            cands = [e for e, t, g in self.paths if isinstance(t, TEntity) and g is None]
            e = d.choice(cands)
            t = self._entity_type()
            if d.bool():
                u = d.choice(self.types)
                return f"({e} is {t} in {_literal(TEntity(u), d)})"
            return f"({e} is {t})"
        if k == 9:
            elem = d.choice([TString(), TEntity(self.member)])
            return f"{self.of(TSet(elem), depth)}.isEmpty()"
        if k == 10:  # records: literals, equality, attribute access, has
            a, b = self.of(TLong(), depth), self.of(TString(), depth)
            c, e = self.of(TLong(), depth), self.of(TString(), depth)
            form = d.int(0, 3)
            if form == 0:
                return f"({{n: {a}, s: {b}}} == {{n: {c}, s: {e}}})"
            if form == 1:
                return f"({{n: {a}, s: {b}}} != {{s: {e}, n: {c}}})"
            if form == 2:
                return f"({{n: {a}, s: {b}}}.n == {c})"
            return f"({{n: {a}, s: {b}}} has s)"
        if k == 11:  # action in conditions
            acts = d.some(self.schema.applicable_actions(), 1, 3, unique=False)
            if len(acts) == 1:
                return f'(action == Action::"{acts[0]}")'
            return "(action in [" + ", ".join(f'Action::"{a}"' for a in acts) + "])"
        if k == 12:  # `in` a non-literal set of entities (no ancestry between them)
            if self.env.rtype == "Memory":
                return f"({self.of(TEntity('Agent'), depth)} in resource.readers)"
            return f"({self.of(TEntity(self.member), depth)} in {_literal(TSet(TEntity(self.member)), d)})"
        cands = [e for e, t, g in self.paths if e.startswith("context") and g is None]
        if cands and self.env.action == "redistribute":
            return f"(context has {d.choice(['target_fleet', 'target_scope', 'nope'])})"
        attrs = [n for n, _ in self.schema.entities[self.env.rtype].attrs.fields] \
            if self.env.rtype in self.schema.entities else []
        return f"(resource has {d.choice(attrs[:3] + ['nope'])})"


def gen_policy_text(draw: "Draw", schema: Schema, idx: int, env: Env | None = None) -> str:
    if env is None or draw.int(0, 3) == 0:
        env = draw.choice(envs(schema))
    g = ExprGen(schema, env, draw)
    effect = draw.choice(["permit", "forbid"])
    ps = draw.choice(["is", "is", "eq", "in", "isin"])
    pscope = {"is": f"principal is {env.ptype}",
              "eq": f"principal == {_literal(TEntity(env.ptype), draw)}",
              "in": f"principal in {_literal(TEntity(draw.choice(sorted(schema.ancestor_types(env.ptype) | {env.ptype}))), draw)}",
              "isin": f"principal is {env.ptype} in {_literal(TEntity(draw.choice(sorted(schema.ancestor_types(env.ptype) | {env.ptype}))), draw)}"}[ps]
    if ps == "in":
        pscope = f"principal is {env.ptype}"  # keep the type pinned for attribute access
        extra = f" && principal in {_literal(TEntity(draw.choice(sorted(schema.ancestor_types(env.ptype) | {env.ptype}))), draw)}"
    else:
        extra = ""
    same = [a for a in schema.applicable_actions()
            if env.ptype in schema.actions[a].principals and env.rtype in schema.actions[a].resources]
    acts = draw.some(same, 1, 3, unique=True)
    if env.action not in acts:
        acts.append(env.action)
    ascope = f'action == Action::"{acts[0]}"' if len(acts) == 1 else \
        "action in [" + ", ".join(f'Action::"{a}"' for a in acts) + "]"
    # An action list must keep the context type fixed: only mix actions with equal context.
    if len({schema.actions[a].context for a in acts}) > 1:
        ascope = f'action == Action::"{env.action}"'
    clauses = []
    for _ in range(draw.int(0, 2)):
        kw = draw.choice(["when", "when", "unless"])
        clauses.append(f"{kw} {{ {g.boolean(draw.int(0, 3))}{extra if kw == 'when' else ''} }}")
    if extra and not any(c.startswith("when") for c in clauses):
        clauses.append(f"when {{ true{extra} }}")
    return (f'@id("p{idx}")\n{effect} ({pscope}, {ascope}, resource is {env.rtype})\n'
            + "\n".join(clauses) + ";")


def _value(ty: CedarType, draw: "Draw") -> Any:
    if isinstance(ty, TBool):
        return draw.bool()
    if isinstance(ty, TLong):
        return draw.choice(LONGS)
    if isinstance(ty, TString):
        return cedar_string(draw)
    if isinstance(ty, TEntity):
        return {"__entity": {"type": ty.name, "id": draw.choice(draw.ids.get(ty.name) or IDS[ty.name])}}
    if isinstance(ty, TSet):
        return [_value(ty.elem, draw) for _ in range(draw.int(0, 3))]
    if isinstance(ty, TRecord):
        return {n: _value(a.type, draw) for n, a in ty.fields if a.required or draw.bool()}
    raise AssertionError(ty)


def _dedupe(v: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in v:
        if x not in out:
            out.append(x)
    return out


def gen_entity_store(draw: "Draw", schema: Schema) -> list[dict[str, Any]]:
    ents = []
    for typ in IDS:
        ids = draw.ids.get(typ) or IDS[typ]
        decl = schema.entities.get(typ)
        if decl is None:
            continue
        for eid in ids:
            if not draw.int(0, 3):
                continue  # absent: references to it dangle
            attrs = {}
            for n, a in decl.attrs.fields:
                if a.required or draw.bool():
                    v = _value(a.type, draw)
                    attrs[n] = _dedupe(v) if isinstance(v, list) and draw.bool() else v
            parents = []
            for ptyp in decl.member_of:
                for pid in draw.ids.get(ptyp) or IDS[ptyp]:
                    if draw.int(0, 2) == 0:
                        parents.append({"type": ptyp, "id": pid})
            ents.append({"uid": {"type": typ, "id": eid}, "attrs": attrs, "parents": parents})
    return ents


def gen_request(draw: "Draw", schema: Schema, env: Env) -> dict[str, Any]:
    ctx = _value(schema.actions[env.action].context, draw)
    return {"principal": {"type": env.ptype, "id": draw.choice(draw.ids.get(env.ptype) or IDS[env.ptype])},
            "action": {"type": "Action", "id": env.action},
            "resource": {"type": env.rtype, "id": draw.choice(draw.ids.get(env.rtype) or IDS[env.rtype])},
            "context": ctx}


def gen_scenario(draw: "Draw", schema: Schema) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(policy text, entities, request): principal and resource are in the store. The ids of one example
    are 1-3 per type from `IDS` (``draw.ids``)."""
    draw.ids = {t: draw.some(ids, 1, 3, unique=True) for t, ids in IDS.items() if t in schema.entities}
    n = draw.int(1, 4)
    env = draw.choice(envs(schema))
    text = "\n".join(gen_policy_text(draw, schema, i, env) for i in range(n))
    ents = gen_entity_store(draw, schema)
    req = gen_request(draw, schema, env)
    for role in ("principal", "resource"):
        uid = req[role]
        if not any(e["uid"] == uid for e in ents):
            decl = schema.entities[uid["type"]]
            attrs = {n: _value(a.type, draw) for n, a in decl.attrs.fields if a.required}
            ents.append({"uid": uid, "attrs": attrs, "parents": []})
    return text, ents, req


# ---- Hypothesis strategies over the generators
@st.composite
def policy_text(draw: Any, schema: Schema, idx: int, env: Env | None = None) -> str:
    return gen_policy_text(HypothesisDraw(draw), schema, idx, env)


@st.composite
def entity_store(draw: Any, schema: Schema) -> list[dict[str, Any]]:
    return gen_entity_store(HypothesisDraw(draw), schema)


@st.composite
def request_for(draw: Any, schema: Schema, env: Env) -> dict[str, Any]:
    return gen_request(HypothesisDraw(draw), schema, env)


@st.composite
def scenario(draw: Any, schema: Schema) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    return gen_scenario(HypothesisDraw(draw), schema)
