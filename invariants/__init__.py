"""policy-check: prove invariants of a Cedar policy set with Z3 and replay every
counterexample through the Cedar engine (docs/design.md §3).

Public surface (``__all__`` is pinned by tests/invariants/test_public_api.py)."""

from .catalog import CheckResult, Invariant, check_invariants, compare_sets, load_invariants
from .errors import InputError, PolicyCheckError, PolicyInvalid, Unsupported
from .schema import Schema, parse_schema

__all__ = [
    "CheckResult", "Invariant", "check_invariants", "compare_sets", "load_invariants",
    "InputError", "PolicyCheckError", "PolicyInvalid", "Unsupported",
    "Schema", "parse_schema",
]
