"""Hypothesis profiles for the policy-check tests.

``ci`` (used unless another of these profiles is selected): the differential test runs
2,000 examples.  ``long``: 20,000, for a soak run:
``pytest tests/invariants --hypothesis-profile=long``.  The profiles are read by the
differential test only, so other Hypothesis suites keep their own settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
SCHEMA = POLICIES / "memwarden.cedarschema"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BASELINE = REPO / "invariants" / "baseline"  # shipped in the package, always checked

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               print_blob=True)
settings.register_profile("ci", max_examples=2000, **_common)
settings.register_profile("long", max_examples=20000, **_common)


def differential_settings() -> settings:
    """The selected profile if it is one of ours, else ``ci``."""
    name = settings.get_current_profile_name()
    return settings.get_profile(name if name in ("ci", "long") else "ci")


@pytest.fixture(scope="session")
def schema_text() -> str:
    return SCHEMA.read_text(encoding="utf-8")
