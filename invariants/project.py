"""Loading a policy directory: schema, policies, invariants and policy unit tests.

Layout of ``DIR`` (only the schema is required)::

    DIR/*.cedarschema | DIR/*.cedarschema.json   exactly one schema
    DIR/*.cedar                                  the policy set (file order, then source order)
    DIR/invariants/*.cedar                       the directory's own invariants (optional, added)
    DIR/tests/*.json                             policy unit tests (see ``invariants.policytests``)

Invariants checked (see ``invariants.catalog``) are the union of

1. the **baseline** (``invariants/baseline/*.cedar``, shipped inside the installed package:
   Inv-Scope, tenant isolation, deletion closure, never-errors, the trust ladder, trust
   monotonicity), always loaded — a policy directory cannot remove or replace them;
2. the directory's own ``invariants/``;
3. pinned extra files or directories (``policy-check -i``, the sidecar's ``INVARIANTS_DIR``).

A directory or pinned invariant textually identical to one already loaded is the same invariant
and is loaded once; one that reuses a loaded ``@id`` with a different text is kept as well, under
the id ``<id>@<file>``, so it can never shadow a baseline invariant. Every invariant, baseline
included, is validated against the schema: a schema under which a baseline invariant does not
typecheck fails the check (``PolicyInvalid``), it is never skipped.

``display`` maps directories read to the names shown for them in every message and result
(``{snapshot: operator's path}``: the sidecar checks a snapshot copy of the operator's directories
and reports the operator's paths).

Errors: ``InputError`` (exit 2) for a missing/ambiguous schema or unreadable path;
``PolicyInvalid`` (exit 1) for a policy or invariant that does not parse or validate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import Invariant, load_invariants
from .engine import Policy, PolicyFile, check_schema, parse_text, validate
from .errors import InputError, PolicyInvalid, SchemaSyntaxError
from .schema import Schema, parse_schema

__all__ = ["BASELINE_DIR", "Project", "load_project", "find_schema", "baseline_files"]

BASELINE_DIR = Path(__file__).resolve().parent / "baseline"


@dataclass
class Project:
    root: Path
    schema_path: Path
    schema_text: str
    schema: Schema
    policies: list[Policy]
    invariants: list[Invariant] = field(default_factory=list)
    test_files: list[Path] = field(default_factory=list)
    baseline_ids: frozenset[str] = frozenset()
    display: dict[Path, Path] = field(default_factory=dict)

    def label(self, path: Path) -> str:
        """How ``path`` is named in messages (see ``display`` of `load_project`)."""
        return _label(path, self.display)


def find_schema(root: Path) -> Path:
    cands = sorted(set(root.glob("*.cedarschema")) | set(root.glob("*.cedarschema.json")))
    if len(cands) != 1:
        found = ", ".join(c.name for c in cands) or "none"
        raise InputError(f"{root}: expected exactly one *.cedarschema or *.cedarschema.json (found {found})")
    return cands[0]


def baseline_files() -> list[Path]:
    """The baseline invariant files of the installed package; raises ``InputError`` if there are none
    (a broken installation must not check a policy set against nothing)."""
    files = sorted(BASELINE_DIR.glob("*.cedar"))
    if not files:
        raise InputError(f"{BASELINE_DIR}: the baseline invariants are missing from this installation")
    return files


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


def _label(path: Path, display: dict[Path, Path]) -> str:
    for src, dst in display.items():
        try:
            return str(dst / path.relative_to(src))
        except ValueError:
            continue
    return str(path)


def _parse(paths: list[Path], display: dict[Path, Path]) -> list[PolicyFile]:
    out = []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{_label(p, display)}: {exc.strerror or exc}") from exc
        out.append(parse_text(text, _label(p, display)))
    return out


def _union(groups: list[list[Policy]]) -> list[Policy]:
    """Baseline first, then each further group; identical texts once, colliding ids renamed."""
    out: list[Policy] = []
    by_id: dict[str, Policy] = {}
    for group in groups:
        for p in group:
            seen = by_id.get(p.id)
            if seen is not None and seen.text == p.text:
                continue  # the same invariant (e.g. a copy of a baseline file): check it once
            if seen is not None:
                p = dataclasses.replace(p, id=f"{p.id}@{p.file}")
            by_id[p.id] = p
            out.append(p)
    return out


def load_project(root: Path, extra_invariants: list[Path] | None = None, schema_path: Path | None = None,
                 with_invariants: bool = True, display: dict[Path, Path] | None = None) -> Project:
    """Read and validate everything under ``root``; see the module docstring."""
    shown = dict(display or {})
    if not root.is_dir():
        raise InputError(f"{_label(root, shown)}: not a directory")
    sp = schema_path or find_schema(root)
    if not sp.is_file():
        raise InputError(f"{_label(sp, shown)}: no such schema file")
    text = sp.read_text(encoding="utf-8")
    check_schema(text, _label(sp, shown))  # Cedar's verdict first, at the error's line and column
    try:
        schema = parse_schema(text)
    except SchemaSyntaxError as exc:
        raise SchemaSyntaxError(str(exc).split(": ", 1)[-1], exc.line, _label(sp, shown)) from exc
    policies = [p for f in _parse(sorted(root.glob("*.cedar")), shown) for p in f.policies]
    validate(policies, text, schema_file=_label(sp, shown))
    invs: list[Invariant] = []
    baseline: list[Policy] = []
    if with_invariants:
        baseline = [p for f in _parse(baseline_files(), shown) for p in f.policies]
        own_dir = root / "invariants"
        own = [p for f in _parse(_cedar_files([own_dir]) if own_dir.is_dir() else [], shown) for p in f.policies]
        pinned = [p for f in _parse(_cedar_files(list(extra_invariants or [])), shown) for p in f.policies]
        inv_pols = _union([baseline, own, pinned])
        validate(inv_pols, text, what="invariant", schema_file=_label(sp, shown))
        try:
            invs = load_invariants(inv_pols)
        except ValueError as exc:
            raise PolicyInvalid([("invariants", 0, "-", str(exc))]) from exc
    tests = sorted((root / "tests").glob("*.json")) if (root / "tests").is_dir() else []
    return Project(root, sp, text, schema, policies, invs, tests, frozenset(p.id for p in baseline), shown)
