"""The cedarpy boundary: parsing, schema validation and authorization replay.

This is the only module of ``invariants`` that calls the Cedar engine (cedarpy 4.12).
Everything else works on the typed AST (``cedarpy.pst`` dataclasses) and on plain
Cedar JSON (request dicts and entity lists in the Cedar JSON entity format,
https://docs.cedarpolicy.com/auth/entities-syntax.html).

Errors: ``PolicyInvalid`` (syntax or validation error, with file and line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cedarpy
from cedarpy import pst

from .errors import PolicyInvalid

__all__ = ["Policy", "PolicyFile", "load_policy_files", "validate", "authorize", "Replay", "parse_text"]


@dataclass(frozen=True)
class Policy:
    """One policy: the AST, where it was written, and its display id (the ``@id`` annotation, else
    ``file:line``). ``template`` marks a policy template (``?principal``/``?resource`` slots): valid Cedar
    that Cedar evaluates only through links, which policy-check does not model (UNKNOWN)."""

    ast: pst.Template
    file: str
    line: int
    id: str
    text: str
    template: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class PolicyFile:
    path: str
    text: str
    policies: list[Policy] = field(default_factory=list)


_LEX = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\n]*|[{}()\[\];]|[^"/{}()\[\];]+|/', re.S)


def _statements(text: str) -> list[tuple[int, str]]:
    """Split Cedar policy text into top-level statements: (first line, text)."""
    out: list[tuple[int, str]] = []
    depth, start, line, start_line = 0, None, 1, 1
    for m in _LEX.finditer(text):
        tok = m.group()
        if not tok.startswith("//") and tok.strip():
            if start is None:
                start = m.start()
                start_line = line + text[m.start():m.start() + len(tok) - len(tok.lstrip())].count("\n")
            if tok in ("{", "(", "["):
                depth += 1
            elif tok in ("}", ")", "]"):
                depth -= 1
            elif tok == ";" and depth == 0:
                out.append((start_line, text[start:m.end()]))
                start = None
        line += tok.count("\n")
    if start is not None:
        out.append((start_line, text[start:]))
    return out


def parse_text(text: str, path: str) -> PolicyFile:
    """Parse one policy file; raises ``PolicyInvalid`` naming the failing statement's line."""
    pf = PolicyFile(path, text)
    stmts = _statements(text)
    try:
        ps = cedarpy.policies_to_pst(text) if stmts else None
    except ValueError as exc:
        line = 1
        for ln, st in stmts:
            try:
                cedarpy.policies_to_pst(st)
            except ValueError:
                line = ln
                break
        raise PolicyInvalid([(path, line, "-", f"syntax error: {exc}")]) from exc
    if ps is None:
        return pf
    # Cedar numbers policies and templates together in source order (policy0, policy1, ...). A template is
    # kept, so that every check it can affect answers UNKNOWN naming it (translate: "template slot").
    def order(kv: tuple[str, Any]) -> int:
        m = re.fullmatch(r"policy(\d+)", kv[0])
        return int(m.group(1)) if m else -1

    pols = sorted([(k, v, False) for k, v in ps.static_policies.items()] +
                  [(k, v, True) for k, v in ps.templates.items()], key=lambda kv: order(kv[:2]))
    if len(pols) != len(stmts) or any(order(p[:2]) < 0 for p in pols):
        raise PolicyInvalid([(path, 1, "-", "could not locate policies in the file")])
    for (ln, st), (_, p, tpl) in zip(stmts, pols):
        pid = p.annotations.get("id") or f"{Path(path).name}:{ln}"
        pf.policies.append(Policy(p, path, ln, pid, st.strip(), tpl))
    return pf


def load_policy_files(paths: list[Path]) -> list[PolicyFile]:
    """Parse each ``.cedar`` file; policy order is file order, then source order."""
    return [parse_text(p.read_text(encoding="utf-8"), str(p)) for p in paths]


def validate(policies: list[Policy], schema_text: str, what: str = "policy") -> None:
    """Validate ``policies`` against the schema (Cedar strict validation,
    https://docs.cedarpolicy.com/policies/validation.html); raises ``PolicyInvalid``
    listing every error with file and line. Duplicate ``@id`` annotations are errors too."""
    problems: list[tuple[str, int, str, str]] = []
    seen: dict[str, Policy] = {}
    for p in policies:
        if p.id in seen:
            problems.append((p.file, p.line, p.id, f"duplicate {what} id (first at {seen[p.id].file}:{seen[p.id].line})"))
        seen[p.id] = p
    if policies:
        text = "\n".join(p.text for p in policies)
        try:
            res = cedarpy.validate_policies(text, schema_text)
        except ValueError as exc:
            raise PolicyInvalid([("schema", 0, "-", f"schema rejected by Cedar: {exc}")]) from exc
        for err in res.errors:
            m = re.fullmatch(r"policy(\d+)", err.policy_id or "")
            pol = policies[int(m.group(1))] if m and int(m.group(1)) < len(policies) else None
            msg = re.sub(r"^for policy `policy\d+`, ", "", err.error)
            problems.append((pol.file if pol else "?", pol.line if pol else 0, pol.id if pol else err.policy_id, msg))
    if problems:
        raise PolicyInvalid(problems)


@dataclass(frozen=True)
class Replay:
    """Cedar's answer for one request: ``allow``, the ids of the determining policies
    and of the policies whose evaluation errored (display ids)."""

    allow: bool
    reasons: frozenset[str]
    errors: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        return {"decision": "allow" if self.allow else "deny",
                "reasons": sorted(self.reasons), "errors": sorted(self.errors)}


def authorize(request: dict[str, Any], policies: list[Policy], entities: list[dict[str, Any]],
              schema_text: str | None) -> Replay:
    """Evaluate one request with cedarpy.is_authorized.

    ``request``: {"principal": {"type","id"}, "action": {...}, "resource": {...}, "context": {...}}.
    A request or entity set that Cedar rejects (schema violation) counts as Deny with the
    engine's message in ``errors`` — the sidecar denies it the same way.
    """
    text = "\n".join(p.text for p in policies)
    ids = [p.id for p in policies]
    res = cedarpy.is_authorized(request, text, entities, schema_text)

    def _name(pid: str) -> str:
        m = re.fullmatch(r"policy(\d+)", pid)
        return ids[int(m.group(1))] if m and int(m.group(1)) < len(ids) else pid

    errs = set()
    for e in res.diagnostics.errors:
        m = re.search(r"policy `(policy\d+)`", e)
        errs.add(_name(m.group(1)) if m else e)
    return Replay(res.decision == cedarpy.Decision.Allow,
                  frozenset(_name(r) for r in res.diagnostics.reasons), frozenset(errs))
