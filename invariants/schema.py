"""Cedar schema model: the subset of the schema that the translator needs.

Shapes
------
``Schema.entities``: entity type name -> ``EntityDecl`` (attributes, ``memberOf`` types).
``Schema.actions``: action id -> ``ActionDecl`` (principal/resource types, context
record type, parent action ids).

Both schema formats of the Cedar reference are accepted
(https://docs.cedarpolicy.com/schema/human-readable-schema-grammar.html and
https://docs.cedarpolicy.com/schema/json-schema.html), without namespaces: the
default memwarden schema declares none.  Entity tag declarations are read (the policies that use
tags are UNKNOWN, see ``translate``).  A construct outside this subset (a namespace, enumerated
entity types) raises ``SchemaUnsupported``; the caller reports the check UNKNOWN rather than guessing.

Errors: ``SchemaSyntaxError`` (malformed text, with line), ``SchemaUnsupported``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Union

from .errors import SchemaSyntaxError, SchemaUnsupported

__all__ = [
    "TBool", "TLong", "TString", "TEntity", "TSet", "TRecord", "TExt", "CedarType",
    "Attr", "EntityDecl", "ActionDecl", "Schema", "parse_schema", "BOOL", "LONG", "STRING",
]


@dataclass(frozen=True)
class TBool:
    def __str__(self) -> str:
        return "Bool"


@dataclass(frozen=True)
class TLong:
    def __str__(self) -> str:
        return "Long"


@dataclass(frozen=True)
class TString:
    def __str__(self) -> str:
        return "String"


@dataclass(frozen=True)
class TEntity:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TSet:
    elem: "CedarType"

    def __str__(self) -> str:
        return f"Set<{self.elem}>"


@dataclass(frozen=True)
class Attr:
    type: "CedarType"
    required: bool = True


@dataclass(frozen=True)
class TRecord:
    fields: tuple[tuple[str, Attr], ...]

    def get(self, name: str) -> Attr | None:
        for n, a in self.fields:
            if n == name:
                return a
        return None

    def __str__(self) -> str:
        inner = ", ".join(f"{n}{'' if a.required else '?'}: {a.type}" for n, a in self.fields)
        return "{" + inner + "}"


@dataclass(frozen=True)
class TExt:
    """An extension type (ipaddr, decimal, datetime, duration): not modelled."""

    name: str

    def __str__(self) -> str:
        return self.name


CedarType = Union[TBool, TLong, TString, TEntity, TSet, TRecord, TExt]
BOOL, LONG, STRING = TBool(), TLong(), TString()
_EMPTY = TRecord(())


@dataclass(frozen=True)
class EntityDecl:
    """``tags``: the declared tag type, or None. Tags are observable only through ``hasTag``/``getTag``,
    which the translator answers UNKNOWN; policies that do not use them are checked as usual."""

    name: str
    attrs: TRecord = _EMPTY
    member_of: tuple[str, ...] = ()
    tags: "CedarType | None" = None


@dataclass(frozen=True)
class ActionDecl:
    name: str
    principals: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    context: TRecord = _EMPTY
    member_of: tuple[str, ...] = ()


@dataclass
class Schema:
    entities: dict[str, EntityDecl] = field(default_factory=dict)
    actions: dict[str, ActionDecl] = field(default_factory=dict)

    def ancestor_types(self, name: str) -> set[str]:
        """Entity types reachable from ``name`` through ``memberOf`` (excluding itself
        unless the hierarchy is recursive)."""
        seen: set[str] = set()
        todo = list(self.entities[name].member_of) if name in self.entities else []
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in self.entities:
                todo.extend(self.entities[t].member_of)
        return seen

    def action_ancestors(self, name: str) -> set[str]:
        """Action groups that ``Action::name`` is (transitively) a member of."""
        seen: set[str] = set()
        todo = list(self.actions[name].member_of) if name in self.actions else []
        while todo:
            a = todo.pop()
            if a not in seen:
                seen.add(a)
                if a in self.actions:
                    todo.extend(self.actions[a].member_of)
        return seen

    def applicable_actions(self) -> list[str]:
        """Actions that can appear in a request (they have principal and resource types)."""
        return [a.name for a in self.actions.values() if a.principals and a.resources]


# ---------------------------------------------------------------- human format
_TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<comment>//[^\n]*)|(?P<str>"(?:[^"\\]|\\.)*")|"""
    r"""(?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)|(?P<punct>[{}\[\]<>(),;:?=@])"""
)
_EXT = {"ipaddr", "decimal", "datetime", "duration"}


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks: list[tuple[str, str, int]] = []
        pos, line = 0, 1
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise SchemaSyntaxError(f"unexpected character {text[pos]!r}", line)
            kind = m.lastgroup or ""
            if kind not in ("ws", "comment"):
                self.toks.append((kind, m.group(), line))
            line += m.group().count("\n")
            pos = m.end()
        self.i = 0
        self.common: dict[str, object] = {}

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def line(self) -> int:
        return self.toks[min(self.i, len(self.toks) - 1)][2] if self.toks else 1

    def next(self) -> tuple[str, str, int]:
        if self.i >= len(self.toks):
            raise SchemaSyntaxError("unexpected end of schema", self.line())
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, value: str) -> None:
        _, v, line = self.next()
        if v != value:
            raise SchemaSyntaxError(f"expected {value!r}, found {v!r}", line)

    def name(self) -> str:
        kind, v, line = self.next()
        if kind == "str":
            return str(json.loads(v))
        if kind != "ident":
            raise SchemaSyntaxError(f"expected a name, found {v!r}", line)
        return v

    def skip_annotations(self) -> None:
        while self.peek() == "@":
            self.next()
            self.name()
            if self.peek() == "(":
                self.next()
                self.next()
                self.expect(")")

    def names(self) -> list[str]:
        out = [self.name()]
        while self.peek() == ",":
            self.next()
            out.append(self.name())
        return out

    def name_list(self) -> list[str]:
        if self.peek() == "[":
            self.next()
            out: list[str] = []
            while self.peek() != "]":
                out.append(self.name())
                if self.peek() == ",":
                    self.next()
            self.next()
            return out
        return [self.name()]

    def type_(self) -> object:
        if self.peek() == "{":
            return self.record()
        n = self.name()
        if n == "Set":
            self.expect("<")
            inner = self.type_()
            self.expect(">")
            return ("set", inner)
        return ("name", n)

    def record(self) -> object:
        self.expect("{")
        fields: list[tuple[str, bool, object]] = []
        while self.peek() != "}":
            self.skip_annotations()
            n = self.name()
            req = True
            if self.peek() == "?":
                self.next()
                req = False
            self.expect(":")
            fields.append((n, req, self.type_()))
            if self.peek() == ",":
                self.next()
        self.next()
        return ("record", fields)

    def parse(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        ents: list[tuple[Any, ...]] = []
        acts: list[tuple[Any, ...]] = []
        while self.peek() is not None:
            self.skip_annotations()
            kind, kw, line = self.next()
            if kw == "namespace":
                raise SchemaUnsupported("namespaces in the schema", line)
            if kw == "type":
                n = self.name()
                self.expect("=")
                self.common[n] = self.type_()
                self.expect(";")
            elif kw == "entity":
                names = self.names()
                parents: list[str] = []
                attrs: object = ("record", [])
                tags: object = None
                while self.peek() not in (";", None):
                    t = self.peek()
                    if t == "in":
                        self.next()
                        parents = self.name_list()
                    elif t == "=":
                        self.next()
                    elif t == "{":
                        attrs = self.record()
                    elif t == "tags":
                        self.next()
                        tags = self.type_()
                    elif t == "enum":
                        raise SchemaUnsupported("enumerated entity type", self.line())
                    else:
                        raise SchemaSyntaxError(f"unexpected {t!r}", self.line())
                self.expect(";")
                for n in names:
                    ents.append((n, attrs, parents, tags))
            elif kw == "action":
                names = self.names()
                parents = []
                applies: dict[str, object] = {}
                while self.peek() not in (";", None):
                    t = self.peek()
                    if t == "in":
                        self.next()
                        parents = [p.split("::", 1)[-1] if "::" in p else p for p in self._action_refs()]
                    elif t == "appliesTo":
                        self.next()
                        self.expect("{")
                        while self.peek() != "}":
                            key = self.name()
                            self.expect(":")
                            if key == "context":
                                applies[key] = self.type_()
                            else:
                                applies[key] = self.name_list()
                            if self.peek() == ",":
                                self.next()
                        self.next()
                    else:
                        raise SchemaSyntaxError(f"unexpected {t!r}", self.line())
                self.expect(";")
                for n in names:
                    acts.append((n, applies, parents))
            else:
                raise SchemaSyntaxError(f"unexpected {kw!r}", line)
        return ents, acts

    def _action_refs(self) -> list[str]:
        out: list[str] = []
        bracket = self.peek() == "["
        if bracket:
            self.next()
        while True:
            kind, v, line = self.next()
            if kind == "ident" and self.peek() == "::":
                pass
            if kind == "str":
                out.append(json.loads(v))
            elif kind == "ident":
                out.append(v)
            else:
                raise SchemaSyntaxError(f"unexpected {v!r}", line)
            if not bracket:
                break
            if self.peek() == ",":
                self.next()
            if self.peek() == "]":
                self.next()
                break
        return out


def _resolve(raw: object, common: dict[str, object], entity_names: set[str], depth: int = 0) -> CedarType:
    if depth > 32:
        raise SchemaUnsupported("recursive common types", 0)
    kind = raw[0]  # type: ignore[index]
    if kind == "record":
        return TRecord(tuple((n, Attr(_resolve(t, common, entity_names, depth + 1), req))
                             for n, req, t in raw[1]))  # type: ignore[index]
    if kind == "set":
        return TSet(_resolve(raw[1], common, entity_names, depth + 1))  # type: ignore[index]
    n: str = raw[1]  # type: ignore[index]
    n = n.removeprefix("__cedar::")
    if n in common:
        return _resolve(common[n], common, entity_names, depth + 1)
    if n == "Long":
        return LONG
    if n == "String":
        return STRING
    if n in ("Bool", "Boolean"):
        return BOOL
    if n in _EXT:
        return TExt(n)
    if n in entity_names:
        return TEntity(n)
    if "::" in n:
        raise SchemaUnsupported(f"namespaced type {n}", 0)
    raise SchemaSyntaxError(f"unknown type {n!r}", 0)


def _parse_human(text: str) -> Schema:
    p = _Parser(text)
    ents, acts = p.parse()
    names = {e[0] for e in ents}
    schema = Schema()
    for n, attrs, parents, tags in ents:
        rec = _resolve(attrs, p.common, names)
        assert isinstance(rec, TRecord)
        schema.entities[n] = EntityDecl(n, rec, tuple(parents),
                                        _resolve(tags, p.common, names) if tags is not None else None)
    for n, applies, parents in acts:
        ctx = _resolve(applies["context"], p.common, names) if "context" in applies else _EMPTY
        if not isinstance(ctx, TRecord):
            raise SchemaSyntaxError(f"context of action {n!r} is not a record", 0)
        schema.actions[n] = ActionDecl(
            n, tuple(applies.get("principal", ())), tuple(applies.get("resource", ())),
            ctx, tuple(parents))
    return schema


# ---------------------------------------------------------------- JSON format
def _json_type(t: dict[str, Any], common: dict[str, Any], names: set[str]) -> CedarType:
    kind = t.get("type")
    if kind in ("Record",):
        return TRecord(tuple((n, Attr(_json_type(a, common, names), a.get("required", True)))
                             for n, a in t.get("attributes", {}).items()))
    if kind == "Set":
        return TSet(_json_type(t["element"], common, names))
    if kind == "Entity":
        return TEntity(t["name"])
    if kind == "Extension":
        return TExt(t["name"])
    if kind == "EntityOrCommon":
        return _resolve(("name", t["name"]), {k: ("json", v) for k, v in common.items()}, names) \
            if t["name"] not in common else _json_type(common[t["name"]], common, names)
    if kind in common:
        return _json_type(common[kind], common, names)
    return _resolve(("name", kind or ""), {}, names)


def _parse_json(text: str) -> Schema:
    doc = json.loads(text)
    if set(doc) - {""}:
        raise SchemaUnsupported("namespaces in the schema", 0)
    ns = doc.get("", {})
    common = ns.get("commonTypes", {})
    names = set(ns.get("entityTypes", {}))
    schema = Schema()
    for n, d in ns.get("entityTypes", {}).items():
        if "enum" in d:
            raise SchemaUnsupported(f"enumerated entity type {n}", 0)
        shape = d.get("shape", {"type": "Record", "attributes": {}})
        rec = _json_type(shape, common, names)
        assert isinstance(rec, TRecord)
        tags = _json_type(d["tags"], common, names) if "tags" in d else None
        schema.entities[n] = EntityDecl(n, rec, tuple(d.get("memberOfTypes", [])), tags)
    for n, d in ns.get("actions", {}).items():
        ap = d.get("appliesTo") or {}
        ctx = _json_type(ap["context"], common, names) if "context" in ap else _EMPTY
        assert isinstance(ctx, TRecord)
        schema.actions[n] = ActionDecl(
            n, tuple(ap.get("principalTypes", [])), tuple(ap.get("resourceTypes", [])), ctx,
            tuple(m["id"] for m in d.get("memberOf", [])))
    return schema


def parse_schema(text: str) -> Schema:
    """Parse a Cedar schema (human-readable or JSON format) into a ``Schema``.

    Raises ``SchemaSyntaxError`` (with line) or ``SchemaUnsupported``.
    """
    if text.lstrip().startswith("{"):
        try:
            return _parse_json(text)
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise SchemaSyntaxError(f"malformed JSON schema: {exc}", 0) from exc
    return _parse_human(text)
