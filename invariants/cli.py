"""``policy-check``: the command-line entry point (console script in pyproject.toml).

    policy-check DIR [--invariants PATH]... [--schema FILE] [--format text|json|sarif|junit|markdown]
                     [--counterexamples DIR] [--timeout SECONDS]
    policy-check --compare OLD NEW [--format ...]   (the changed cells of the access matrix, and per action)
    policy-check explain DIR [--format text|json] [--action A]...   (the access matrix, invariants.matrix)
    policy-check explain --compare OLD NEW [--format text|json]
    policy-check --version

The baseline invariants shipped in this package are always checked, with DIR's own
``invariants/`` and every ``--invariants`` path added to them (``invariants.project``).

Exit codes are documented in ``invariants.report``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .catalog import DEFAULT_TIMEOUT_S, compare_results
from .errors import MatrixDisagreement, PolicyCheckError, PolicyInvalid, SchemaSyntaxError, SchemaUnsupported, Unsupported
from .gate import evaluate
from .project import load_project
from .report import Problem, Report, exit_code, render, render_problems

__all__ = ["app", "explain_app", "main"]

app = typer.Typer(add_completion=False, help="Prove invariants of a Cedar policy set with Z3 and replay "
                                             "counterexamples through Cedar.")


class Format(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    junit = "junit"
    markdown = "markdown"


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
    if isinstance(exc, SchemaUnsupported):
        return [Problem("unknown", f"unmodelled construct: {exc.construct}", exc.file or "", exc.line)], 3
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
                                                        help="Show the classes of requests whose access changed from OLD to NEW, a replayed witness each."),
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
            from .matrix import diff_matrices

            rep = Report(f"{compare[0]} -> {compare[1]}", old_policies=old.policies, new_policies=new.policies)
            # The cells of the access matrix whose permitted requests changed, a witness each replayed
            # on both sets (the same diff as `explain --compare`); per action, what the CLI always gave.
            rep.diff = diff_matrices(new.schema, new.schema_text, old.policies, new.policies, timeout)
            rep.results = compare_results(rep.diff, old.policies, new.policies)
        else:
            assert directory is not None
            proj = load_project(directory, invariants, schema_path=schema)
            rep = evaluate(proj, timeout)
    except PolicyCheckError as exc:
        # Whatever stopped the check, every format still answers (SARIF/JUnit/JSON are never empty).
        problems, code = _problems(exc)
        render_problems(problems, code, fmt.value, console, str(directory or compare))
        raise typer.Exit(code) from None
    except MatrixDisagreement as exc:  # a --compare witness whose Cedar replay contradicts its proof
        Console(stderr=True).print(f"DISAGREE: {exc}\n{json.dumps(exc.witness)}", highlight=False, markup=False)
        if fmt != Format.text:
            render_problems([Problem("disagree", f"the Z3 model and Cedar disagree (translator bug): {exc}")], 4,
                            fmt.value, console, str(compare))
        raise typer.Exit(4) from None
    rep.wall_seconds = time.perf_counter() - t0
    _save(rep, counterexamples)
    render(rep, fmt.value, console)
    raise typer.Exit(exit_code(rep))


explain_app = typer.Typer(add_completion=False, help="The access matrix of a policy set, proved with Z3.")


@explain_app.command()
def explain(
    directory: Optional[Path] = typer.Argument(None, help="Policy directory (schema and *.cedar)."),
    compare: Optional[tuple[Path, Path]] = typer.Option(None, "--compare", metavar="OLD NEW",
                                                        help="Show the classes whose access changed from OLD to NEW."),
    fmt: Format = typer.Option(Format.text, "--format", "-f", help="Output format: text or json."),
    schema: Optional[Path] = typer.Option(None, "--schema", help="Schema file (default: the one in DIR)."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", min=0.1, help="Solver timeout per query, seconds."),
    action: list[str] = typer.Option([], "--action", "-a", help="Only these actions (repeatable)."),
) -> None:
    """For each action, the classes of requests the policy set permits (or, with --compare, those whose
    access changed). Exit: 0 done (compare: nothing widened) · 1 compare: some class widened · 2 usage
    or input error · 3 unknown cells · 4 a witness's Cedar replay contradicts its proof."""
    from .explain import diff_json, dumps, matrix_json, render_diff, render_matrix
    from .matrix import build_matrix, diff_matrices

    console = Console(soft_wrap=False) if fmt == Format.text else Console(file=sys.stdout, soft_wrap=True)
    if fmt == Format.text and not console.is_terminal and compare is None and "COLUMNS" not in os.environ:
        # the matrix's tables are wide; a pipe or CI log does not wrap them (a --compare too wide for the
        # console prints one changed cell per block instead, and COLUMNS is honoured)
        console.width = max(console.width, 200)
    if (directory is None) == (compare is None):
        raise typer.BadParameter("give either DIR or --compare OLD NEW")
    if fmt not in (Format.text, Format.json):
        raise typer.BadParameter("explain writes text or json")
    try:
        if compare is not None:
            old = load_project(compare[0], with_invariants=False, schema_path=schema)
            new = load_project(compare[1], with_invariants=False, schema_path=schema)
            from .engine import validate
            validate(old.policies, new.schema_text)  # both read against NEW's schema
            diff = diff_matrices(new.schema, new.schema_text, old.policies, new.policies, timeout, action or None)
            target = f"{compare[0]} -> {compare[1]}"
            if fmt == Format.json:
                console.file.write(dumps(diff_json(diff, target)))
            else:
                render_diff(diff, target, console)
            raise typer.Exit(1 if diff.widened else 3 if diff.unknown else 0)
        assert directory is not None
        proj = load_project(directory, with_invariants=False, schema_path=schema)
        mx = build_matrix(proj.schema, proj.schema_text, proj.policies, timeout, action or None)
    except MatrixDisagreement as exc:
        Console(stderr=True).print(f"DISAGREE: {exc}\n{json.dumps(exc.witness)}", highlight=False, markup=False)
        raise typer.Exit(4) from None
    except PolicyCheckError as exc:
        problems, code = _problems(exc)
        render_problems(problems, code, fmt.value, console, str(directory or compare))
        raise typer.Exit(code) from None
    if fmt == Format.json:
        console.file.write(dumps(matrix_json(mx, str(directory))))
    else:
        render_matrix(mx, str(directory), console)
    raise typer.Exit(3 if any(c.verdict == "unknown" for c in mx.cells) else 0)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: ``policy-check explain ...`` runs `explain_app`, anything else `app`
    (so ``policy-check DIR`` keeps working; a directory named ``explain`` is ``./explain``)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["explain"]:
        explain_app(args=args[1:], prog_name="policy-check explain")
    else:
        app(args=args, prog_name="policy-check")
