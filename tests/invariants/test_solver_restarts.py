"""The solver's restart schedule (invariants.catalog._Solve): a query's budget is spent on attempts with
different random seeds; the first sat/unsat answers; UNKNOWN only when every attempt ran out."""

from __future__ import annotations

import z3

from invariants.catalog import _Solve
from invariants.project import load_project
from invariants.translate import Registry, Store

from .conftest import POLICIES


def _store() -> Store:
    return Store(load_project(POLICIES).schema, Registry())


def test_schedule_spends_the_budget_once() -> None:
    assert abs(sum(_Solve.RESTARTS) - 1.0) < 1e-9
    assert all(0 < f for f in _Solve.RESTARTS)


def test_seeds_differ_per_attempt_and_first_answer_wins(monkeypatch) -> None:
    seen: list[tuple[int, int]] = []
    real = z3.Solver

    class Recording(real):  # type: ignore[misc,valid-type]
        def set(self, *args, **kw):  # noqa: A003
            if args and args[0] in ("timeout", "random_seed"):
                seen.append((args[0], args[1]))
            return super().set(*args, **kw)

    monkeypatch.setattr(z3, "Solver", Recording)
    x = z3.Int("x")
    status, _, model, _ = _Solve(10.0)([x > 1], x < 3, _store())
    assert status == "sat" and model is not None and model.eval(x).as_long() == 2
    assert ("random_seed", 0) in seen and ("random_seed", 1) not in seen  # answered on the first attempt
    status, _, model, _ = _Solve(10.0)([x > 1], x < 1, _store())
    assert status == "unsat" and model is None


def test_unknown_only_after_every_attempt_ran_out() -> None:
    # Nonlinear integer arithmetic with a 10 ms budget: every attempt times out.
    a, b, c = z3.Ints("a b c")
    hard = z3.And(a > 1, b > 1, c > 1, a * a * a + b * b * b == c * c * c + 7 * a * b * c + 123457)
    status, dt, model, why = _Solve(0.01)([], hard, _store())
    assert status == "unknown" and model is None
    assert why.startswith("solver: ")
