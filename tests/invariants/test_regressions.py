"""Shrunk failures of the differential test, replayed forever."""

from __future__ import annotations

from .test_differential import check_agreement

AGENT = {"uid": {"type": "Agent", "id": "t1/f1/a1"},
         "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "t1"}},
                   "fleet": {"__entity": {"type": "Fleet", "id": "t1/f1"}}, "trust": 0, "roles": []},
         "parents": []}
MEMORY = {"uid": {"type": "Memory", "id": "m1"},
          "attrs": {"tenant": {"__entity": {"type": "Tenant", "id": "t1"}},
                    "fleet": {"__entity": {"type": "Fleet", "id": "t1/f1"}},
                    "owner": {"__entity": {"type": "Agent", "id": "t1/f1/a1"}},
                    "scope": "", "status": "", "readers": [], "labels": ["agent"]},
          "parents": []}
READ = {"principal": {"type": "Agent", "id": "t1/f1/a1"}, "action": {"type": "Action", "id": "read"},
        "resource": {"type": "Memory", "id": "m1"}, "context": {}}


def test_contains_all_against_a_literal_set() -> None:
    # Z3's model evaluator leaves `subset` (a `map` over arrays) unreduced; reading the
    # decision off the model said Deny where Cedar (rightly) said Allow.
    text = ('@id("p0")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n;\n'
            '@id("p1")\npermit (principal is Agent, action == Action::"read", resource is Memory)\n'
            'unless { [""].containsAll(resource.labels) };')
    assert check_agreement(text, [AGENT, MEMORY], READ)
