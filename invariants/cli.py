"""``policy-check``: the command-line entry point (console script in pyproject.toml).

    policy-check DIR [--invariants PATH]... [--schema FILE] [--format text|json|sarif|junit]
                     [--counterexamples DIR] [--timeout SECONDS]
    policy-check --compare OLD NEW [--format ...]
    policy-check --version

The baseline invariants shipped in this package are always checked, with DIR's own
``invariants/`` and every ``--invariants`` path added to them (``invariants.project``).

Exit codes are documented in ``invariants.report``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .catalog import DEFAULT_TIMEOUT_S, compare_sets
from .errors import PolicyCheckError, PolicyInvalid, SchemaSyntaxError, Unsupported
from .gate import evaluate
from .project import load_project
from .report import Problem, Report, exit_code, render, render_problems

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, help="Prove invariants of a Cedar policy set with Z3 and replay "
                                             "counterexamples through Cedar.")


class Format(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    junit = "junit"


def _save(rep: Report, out_dir: Path) -> None:
    for r in rep.results:
        if r.counterexample is None:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{r.invariant}--{r.action}") + ".json"
        path = out_dir / name
        path.write_text(json.dumps(r.counterexample, indent=2) + "\n", encoding="utf-8")
        rep.saved[(r.invariant, r.action)] = str(path)


def _problems(exc: PolicyCheckError) -> tuple[list[Problem], int]:
    if isinstance(exc, PolicyInvalid):
        out = []
        for (f, ln, pid, m), col in zip(exc.problems, exc.columns):
            rule = "schema-invalid" if m.startswith(("schema error:", "schema rejected")) else "policy-invalid"
            out.append(Problem(rule, m, f if f not in ("?", "") else "", ln, col, pid))
        return out, 1
    if isinstance(exc, Unsupported):
        return [Problem("unknown", str(exc))], 3
    if isinstance(exc, SchemaSyntaxError):
        return [Problem("schema-invalid", str(exc).split(": ", 1)[-1] if exc.file else str(exc),
                        exc.file or "", exc.line)], 2
    return [Problem("input-error", str(exc))], 2


def version_text() -> str:
    """``policy-check <version of the installed memwarden distribution>``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"policy-check {version('memwarden')}"
    except PackageNotFoundError:
        return "policy-check (not installed)"


def _version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


@app.command()
def run(
    directory: Optional[Path] = typer.Argument(None, help="Policy directory: schema, *.cedar, invariants/, tests/."),
    compare: Optional[tuple[Path, Path]] = typer.Option(None, "--compare", metavar="OLD NEW",
                                                        help="Show requests newly permitted/denied from OLD to NEW."),
    invariants: list[Path] = typer.Option([], "--invariants", "-i", help="Extra invariant file or directory."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Output format."),
    counterexamples: Path = typer.Option(Path(".policy-check/counterexamples"), "--counterexamples",
                                         help="Where counterexamples (Cedar JSON) are saved."),
    schema: Optional[Path] = typer.Option(None, "--schema", help="Schema file (default: the one in DIR)."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", min=0.1, help="Solver timeout per query, seconds."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Check DIR (or compare two policy directories); see the README for exit codes."""
    console = Console(soft_wrap=True) if fmt == Format.text else Console(file=sys.stdout, soft_wrap=True)
    if (directory is None) == (compare is None):
        raise typer.BadParameter("give either DIR or --compare OLD NEW")
    t0 = time.perf_counter()
    try:
        if compare is not None:
            old = load_project(compare[0], with_invariants=False, schema_path=schema)
            new = load_project(compare[1], with_invariants=False, schema_path=schema)
            # Both sets are read against NEW's schema: the review view of a pull request.
            from .engine import validate
            validate(old.policies, new.schema_text)
            rep = Report(f"{compare[0]} -> {compare[1]}")
            rep.results = compare_sets(new.schema, new.schema_text, old.policies, new.policies, timeout)
        else:
            assert directory is not None
            proj = load_project(directory, invariants, schema_path=schema)
            rep = evaluate(proj, timeout)
    except PolicyCheckError as exc:
        # Whatever stopped the check, every format still answers (SARIF/JUnit/JSON are never empty).
        problems, code = _problems(exc)
        render_problems(problems, code, fmt.value, console, str(directory or compare))
        raise typer.Exit(code) from None
    rep.wall_seconds = time.perf_counter() - t0
    _save(rep, counterexamples)
    render(rep, fmt.value, console)
    raise typer.Exit(exit_code(rep))


def main() -> None:
    """Console-script entry point."""
    app()
