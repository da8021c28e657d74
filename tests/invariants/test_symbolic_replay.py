"""Property: on generated policy sets, every counterexample the symbolic check produces
is confirmed by Cedar (no DISAGREE), and a PROVED invariant has no concrete violation
among random requests.  This exercises what the concrete differential test cannot:
the symbolic entity store, its hierarchy axioms, set finiteness and model extraction.
"""

from __future__ import annotations

from typing import Any

import cedarpy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from invariants.catalog import check_invariants, load_invariants
from invariants.engine import authorize, parse_text

from .conftest import BASELINE
from .strategies import envs, policy_text, request_for, entity_store
from .test_differential import SCHEMA_MODEL, SCHEMA_TEXT

INVARIANTS = load_invariants([p for f in sorted(BASELINE.glob("*.cedar"))
                              for p in parse_text(f.read_text(), str(f)).policies])


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_counterexamples_replay_and_proofs_hold(data: Any) -> None:
    env = data.draw(st.sampled_from(envs(SCHEMA_MODEL)))
    n = data.draw(st.integers(1, 3))
    text = "\n".join(data.draw(policy_text(SCHEMA_MODEL, i, env)) for i in range(n))
    assume(cedarpy.validate_policies(text, SCHEMA_TEXT).validation_passed)
    pols = parse_text(text, "generated.cedar").policies
    results = check_invariants(SCHEMA_MODEL, SCHEMA_TEXT, pols, INVARIANTS, timeout_s=5)
    bad = [r for r in results if r.status == "DISAGREE"]
    assert not bad, f"policies:\n{text}\ncounterexample: {bad[0].counterexample}"
    assert not [r for r in results if r.status == "UNKNOWN"], [r.message for r in results]
    # A PROVED tenant-isolation must survive random concrete requests (it bounds tenant resources; the
    # tenant-less Deployment is bounded by deployment-operator-only instead).
    proved = {r.action for r in results if r.invariant == "tenant-isolation" and r.status == "PROVED"}
    if env.action in proved and env.rtype != "Deployment":
        ents = data.draw(entity_store(SCHEMA_MODEL))
        req = data.draw(request_for(SCHEMA_MODEL, env))
        if all(any(e["uid"] == req[k] for e in ents) for k in ("principal", "resource")):
            if authorize(req, pols, ents, SCHEMA_TEXT).allow:
                by = {(e["uid"]["type"], e["uid"]["id"]): e for e in ents}
                p, r = by[(req["principal"]["type"], req["principal"]["id"])], \
                    by[(req["resource"]["type"], req["resource"]["id"])]
                assert p["attrs"]["tenant"] == r["attrs"]["tenant"], text
