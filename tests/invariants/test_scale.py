"""Issue 38 item 1: policy-check at organisation scale.

The sliced check (each environment translated with only the policies whose head can match it, bound and
never-errors goals split per permit/policy) agrees with the unsliced one (every policy in every environment,
one query per goal); a widened permit inside a generated 1,000-policy set is VIOLATED, its counterexample
replayed through Cedar on the whole set, at the default timeout; the verdict cache is reused and a
one-policy change re-checks only the environments that policy's head matches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.policy_scale import WIDENED_ID, make_set
from invariants import catalog
from invariants.catalog import DEFAULT_TIMEOUT_S, check_invariants
from invariants.engine import authorize
from invariants.gate import evaluate
from invariants.project import load_project

from .conftest import FIXTURES, POLICIES, SCHEMA

CASES = ["policies"] + sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def _project(name: str):  # type: ignore[no-untyped-def]
    if name == "policies":
        return load_project(POLICIES)
    d = FIXTURES / name
    own = list(d.glob("*.cedarschema"))
    return load_project(d, schema_path=None if own else SCHEMA)


def _verdicts(results: list[catalog.CheckResult]) -> dict[tuple[str, str], str]:
    return {(r.invariant, r.action): r.status for r in results}


@pytest.mark.parametrize("name", CASES)
def test_sliced_check_agrees_with_unsliced(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(name)
    args = (proj.schema, proj.schema_text, proj.policies, proj.invariants, DEFAULT_TIMEOUT_S)
    whole = check_invariants(*args, slicing=False)
    # SPLIT_FIRST_S = 0: no attempt on the whole goal, every bound/never-errors goal is one query per item
    monkeypatch.setattr(catalog, "SPLIT_FIRST_S", 0.0)
    sliced = check_invariants(*args)
    assert _verdicts(sliced) == _verdicts(whole)
    for r in sliced:
        assert r.status in ("PROVED", "VIOLATED"), (r.invariant, r.action, r.status, r.message)
        if r.status == "VIOLATED":  # replayed on the whole set: Cedar gives the model's decision
            cex = r.counterexample
            assert cex is not None and cex["cedar"] == cex["model"]
            if cex["kind"] == "bound":
                assert cex["cedar"]["decision"] == "allow"
    if name != "policies":
        assert any(r.status == "VIOLATED" for r in sliced), "every fixture breaks some invariant"


def test_widened_permit_in_1000_policies_is_violated_and_replayed(tmp_path: Path) -> None:
    d = make_set(tmp_path / "set", 1000, "middle")
    proj = load_project(d)
    assert len(proj.policies) == 1001
    inv = [i for i in proj.invariants if i.id == "inv-scope"]
    res = check_invariants(proj.schema, proj.schema_text, proj.policies, inv, DEFAULT_TIMEOUT_S)
    read = next(r for r in res if r.action == "read")
    assert read.status == "VIOLATED", (read.status, read.message)
    assert [p.id for p in read.permitted_by] == [WIDENED_ID]
    cex = read.counterexample
    assert cex is not None
    cedar = authorize(cex["request"], proj.policies, cex["entities"], proj.schema_text)
    assert cedar.allow and cedar.reasons == {WIDENED_ID}
    # the same set without the widened permit: Cedar denies the counterexample
    rest = [p for p in proj.policies if p.id != WIDENED_ID]
    assert not authorize(cex["request"], rest, cex["entities"], proj.schema_text).allow
    assert {r.action for r in res if r.status != "UNCOVERED"} == {"read"}  # only inv-scope was checked


def test_cache_reuses_verdicts_and_rechecks_only_what_a_change_touches(tmp_path: Path) -> None:
    d = tmp_path / "pol"
    shutil.copytree(POLICIES, d)
    cache = tmp_path / "cache"
    first = evaluate(load_project(d), cache_dir=cache).results
    assert not any(r.cached for r in first)
    second = evaluate(load_project(d), cache_dir=cache).results
    assert all(r.cached for r in second) and _verdicts(second) == _verdicts(first)
    # one policy changes (an agent read rule): only `read` (its head's action) is checked again
    text = (d / "default.cedar").read_text()
    old = 'resource.scope == "tenant"\n};'
    assert text.count(old) == 1
    (d / "default.cedar").write_text(text.replace(old, 'resource.scope == "tenant" && principal.trust >= 0\n};'))
    third = evaluate(load_project(d), cache_dir=cache).results
    assert {r.action for r in third if not r.cached} == {"read"}
    assert _verdicts(third) == _verdicts(first)
    # a widening of that rule is found, not read from the cache
    (d / "default.cedar").write_text(text.replace(old, 'resource.scope != "agent"\n};'))
    fourth = {(r.invariant, r.action): r for r in evaluate(load_project(d), cache_dir=cache).results}
    assert fourth[("inv-scope", "read")].status == "VIOLATED" and not fourth[("inv-scope", "read")].cached
    assert all(r.cached for (_, a), r in fourth.items() if a != "read")
