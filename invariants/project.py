"""Loading a policy directory: schema, policies, invariants and policy unit tests.

Layout of ``DIR`` (only the schema is required)::

    DIR/*.cedarschema | DIR/*.cedarschema.json   exactly one schema
    DIR/*.cedar                                  the policy set (file order, then source order)
    DIR/invariants/*.cedar                       invariants (see ``invariants.catalog``)
    DIR/tests/*.json                             policy unit tests (see ``invariants.policytests``)

Errors: ``InputError`` (exit 2) for a missing/ambiguous schema or unreadable path;
``PolicyInvalid`` (exit 1) for a policy or invariant that does not parse or validate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .catalog import Invariant, load_invariants
from .engine import Policy, load_policy_files, validate
from .errors import InputError, PolicyInvalid, SchemaSyntaxError
from .schema import Schema, parse_schema

__all__ = ["Project", "load_project", "find_schema"]


@dataclass
class Project:
    root: Path
    schema_path: Path
    schema_text: str
    schema: Schema
    policies: list[Policy]
    invariants: list[Invariant] = field(default_factory=list)
    test_files: list[Path] = field(default_factory=list)


def find_schema(root: Path) -> Path:
    cands = sorted(set(root.glob("*.cedarschema")) | set(root.glob("*.cedarschema.json")))
    if len(cands) != 1:
        found = ", ".join(c.name for c in cands) or "none"
        raise InputError(f"{root}: expected exactly one *.cedarschema or *.cedarschema.json (found {found})")
    return cands[0]


def _cedar_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(p.glob("*.cedar")))
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or directory")
    return out


def load_project(root: Path, extra_invariants: list[Path] | None = None, schema_path: Path | None = None,
                 with_invariants: bool = True) -> Project:
    """Read and validate everything under ``root``; see the module docstring."""
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    sp = schema_path or find_schema(root)
    if not sp.is_file():
        raise InputError(f"{sp}: no such schema file")
    text = sp.read_text(encoding="utf-8")
    try:
        schema = parse_schema(text)
    except SchemaSyntaxError as exc:
        raise SchemaSyntaxError(str(exc).split(": ", 1)[-1], exc.line, str(sp)) from exc
    policies = [p for f in load_policy_files(sorted(root.glob("*.cedar"))) for p in f.policies]
    validate(policies, text)
    invs: list[Invariant] = []
    if with_invariants:
        inv_paths = ([root / "invariants"] if (root / "invariants").is_dir() else []) + list(extra_invariants or [])
        inv_pols = [p for f in load_policy_files(_cedar_files(inv_paths)) for p in f.policies]
        validate(inv_pols, text, what="invariant")
        try:
            invs = load_invariants(inv_pols)
        except ValueError as exc:
            raise PolicyInvalid([("invariants", 0, "-", str(exc))]) from exc
    tests = sorted((root / "tests").glob("*.json")) if (root / "tests").is_dir() else []
    return Project(root, sp, text, schema, policies, invs, tests)
