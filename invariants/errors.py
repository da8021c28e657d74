"""Errors raised by policy-check.

Exception tree (each maps to one exit status of the CLI, see ``invariants.cli``)::

    PolicyCheckError
    ├── InputError                exit 2: unreadable directory, no schema, bad option
    │   ├── SchemaSyntaxError         malformed schema (file, line)
    │   └── PolicyTestFileError             malformed policy unit-test file
    ├── PolicyInvalid             exit 1: a policy does not parse or validate (file, line)
    └── Unsupported               exit 3: a construct the translator does not model
        └── SchemaUnsupported          a schema construct outside the modelled subset

``Unsupported`` never escapes a verification: the catalog turns it into an UNKNOWN
result naming the policy and the construct.
"""

from __future__ import annotations

__all__ = [
    "PolicyCheckError", "InputError", "SchemaSyntaxError", "PolicyTestFileError",
    "PolicyInvalid", "Unsupported", "SchemaUnsupported",
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
    """A construct the translator does not model; ``construct`` names it and
    ``policy`` (when known) names the policy or invariant containing it."""

    exit_code = 3

    def __init__(self, construct: str, policy: str | None = None) -> None:
        super().__init__(f"{policy + ': ' if policy else ''}unmodelled construct: {construct}")
        self.construct, self.policy = construct, policy


class SchemaUnsupported(Unsupported):
    def __init__(self, construct: str, line: int) -> None:
        super().__init__(f"{construct} (schema line {line})")
        self.line = line
