"""Errors raised by policy-check.

Exception tree (each maps to one exit status of the CLI, see ``invariants.cli``)::

    PolicyCheckError
    ├── InputError                exit 2: unreadable directory, no schema, bad option
    │   ├── SchemaSyntaxError         malformed schema (file, line)
    │   └── PolicyTestFileError             malformed policy unit-test file
    ├── PolicyInvalid             exit 1: a policy does not parse or validate (file, line)
    └── Unsupported               exit 3: a construct the translator does not model
        └── SchemaUnsupported          a schema construct outside the modelled subset

``MatrixDisagreement`` (not a ``PolicyCheckError``; exit 4) is a witness of the access matrix or its
diff whose Cedar replay contradicts its proof (``invariants.matrix``).

``Unsupported`` never escapes a verification: the catalog turns it into an UNKNOWN
result naming the policy and the construct.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PolicyCheckError", "InputError", "SchemaSyntaxError", "PolicyTestFileError",
    "PolicyInvalid", "Unsupported", "SchemaUnsupported", "MatrixDisagreement",
]


class PolicyCheckError(Exception):
    exit_code = 2


class InputError(PolicyCheckError):
    exit_code = 2


class SchemaSyntaxError(InputError):
    def __init__(self, message: str, line: int, file: str | None = None) -> None:
        super().__init__(f"{file or 'schema'}:{line}: {message}")
        self.line, self.file = line, file


class PolicyTestFileError(InputError):
    pass


class PolicyInvalid(PolicyCheckError):
    """``problems`` is a list of (file, line, policy id, message); ``columns`` the 1-based column of
    each (0: unknown)."""

    exit_code = 1

    def __init__(self, problems: list[tuple[str, int, str, str]], columns: list[int] | None = None) -> None:
        super().__init__("; ".join(f"{f}:{ln}: {pid}: {m}" for f, ln, pid, m in problems))
        self.problems = problems
        self.columns = list(columns or []) + [0] * (len(problems) - len(columns or []))


class Unsupported(PolicyCheckError):
    """A construct the translator does not model; ``construct`` names it, ``policy`` (when known)
    the policy or invariant containing it and ``where`` its ``file:line``."""

    exit_code = 3

    def __init__(self, construct: str, policy: str | None = None, where: str | None = None) -> None:
        # a policy without @id is named by its file:line already
        shown = (where, policy if not (where and policy and where.endswith(policy)) else None)
        head = "".join(f"{x}: " for x in shown if x)
        super().__init__(f"{head}unmodelled construct: {construct}")
        self.construct, self.policy, self.where = construct, policy, where


class SchemaUnsupported(Unsupported):
    def __init__(self, construct: str, line: int, file: str | None = None) -> None:
        super().__init__(construct, where=f"{file or 'schema'}:{line}")
        self.line, self.file = line, file


class MatrixDisagreement(Exception):
    """A witness whose cedarpy replay contradicts the proof (a translator bug); ``witness`` holds it
    (Cedar JSON request and entities, Cedar's answer, the expected decision and the class)."""

    def __init__(self, message: str, witness: dict[str, Any]) -> None:
        super().__init__(message)
        self.witness = witness
