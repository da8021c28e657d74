"""Build hook (configuration lives in pyproject.toml): the wheel carries the default policy set.

``policies/`` at the repository root is the one source of the default policy set (schema, policies,
``single_valued.txt``, policy unit tests, its own invariants if any). `build_py` copies that directory
into the built package as ``sidecar/default_policies/`` (dotfiles and ``__pycache__`` left out, as the
policy gate's snapshot leaves them out), so ``pip install memwarden-*.whl`` followed by ``memwarden serve``
needs no checkout: `sidecar.config.default_policies_dir` finds the copy. Editable installs copy nothing;
they read ``policies/`` of the checkout in place. tests/deploy/test_deploy.py checks the copy in a built
wheel against ``policies/`` file by file. Source: setuptools ``build_py`` command (setuptools >= 68).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

POLICIES = Path(__file__).resolve().parent / "policies"
PACKAGED = Path("sidecar") / "default_policies"


class BuildPyWithPolicies(build_py):
    """`build_py`, then ``policies/`` → ``<build_lib>/sidecar/default_policies/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        if not (POLICIES / "memwarden.cedarschema").is_file():
            raise SystemExit(f"setup.py: {POLICIES}/memwarden.cedarschema not found: the wheel needs the default policies")
        target = Path(self.build_lib) / PACKAGED
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(POLICIES, target, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithPolicies})
