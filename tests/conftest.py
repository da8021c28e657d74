"""Shared test configuration."""

import os

os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Register the policy-check Hypothesis profiles early so --hypothesis-profile works from the repo root.
from tests.invariants import conftest as _invariants_conftest  # noqa: E402,F401

# The real servers of the session (one of each for every test directory).
from tests.servers import chroma_server, mem0_server, mem0_stack, stack  # noqa: E402,F401
