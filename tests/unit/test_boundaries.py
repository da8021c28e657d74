"""The module boundaries of docs/design.md §6, read off the import statements: a backend profile is a translator and
never reaches into a ledger implementation (it holds no governance rule). The governance core's own boundary (it
never imports a backend) is ruff's banned-API rule in `make test` (pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

SIDECAR = Path(__file__).resolve().parents[2] / "sidecar"
LEDGER_IMPLEMENTATIONS = ("sidecar.ledger.sqlite", "sidecar.ledger.postgres", "sidecar.ledger.cache")


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_profiles_never_import_a_ledger_implementation() -> None:
    profiles = sorted((SIDECAR / "backends").glob("*.py"))
    assert len(profiles) >= 3
    for path in profiles:
        bad = {m for m in imports(path) if m.startswith(LEDGER_IMPLEMENTATIONS)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_core_never_imports_a_profile() -> None:
    for path in sorted((SIDECAR / "core").glob("*.py")):
        assert not {m for m in imports(path) if m.startswith("sidecar.backends")}, path.name
