"""`sidecar.ledger.cache.enter_request` / `leave_request` (h25p: the public way in and out of a request scope,
which `sidecar.pipeline.Pipeline.run` uses instead of the private ``_SCOPE``) against the scope as it was entered
before (`tests.unit.cache_scope_reference`: ``_SCOPE.set(RequestScope())`` … ``_SCOPE.reset``): over generated
sequences of nested entries and exits, also in other tasks and with a token left twice or in another context, the
same scope is current after every step (none, or which entry's), every entry's scope is new and unread, and the
same errors are raised."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.ledger import cache
from sidecar.ledger.cache import RequestScope, enter_request, leave_request, request_scope
from tests.unit.cache_scope_reference import reference_enter, reference_leave

STEPS = st.lists(st.sampled_from(["enter", "leave", "leave-again", "leave-elsewhere", "task"]), max_size=30)


def _play(steps: list[str], enter: Any, leave: Any) -> list[Any]:
    """Replay `steps`; after each, which entry's scope is current (its index; None outside any) or the error."""
    out: list[Any] = []
    scopes: list[Any] = []  # scope object of entry i
    stack: list[Any] = []  # tokens of the entries not left yet
    spent: list[Any] = []  # tokens already left

    def current() -> Any:
        s = cache._SCOPE.get()
        if s is None:
            return None
        return next((i for i, known in enumerate(scopes) if known is s), "unknown")

    for step in steps:
        try:
            if step == "enter":
                token = enter()
                scope = cache._SCOPE.get()
                assert scope is not None and scope.ledger is None and scope.token is None
                assert all(scope is not s for s in scopes)
                scopes.append(scope)
                stack.append(token)
                out.append(("entered", current()))
            elif step == "leave":
                if not stack:
                    out.append("nothing to leave")
                    continue
                token = stack.pop()
                leave(token)
                spent.append(token)
                out.append(("left", current()))
            elif step == "leave-again":
                if not spent:
                    out.append("nothing left")
                    continue
                leave(spent[-1])
                out.append(("left again", current()))
            elif step == "leave-elsewhere":
                if not stack:
                    out.append("nothing to leave")
                    continue
                token = stack[-1]
                contextvars.copy_context().run(leave, token)
                out.append(("left elsewhere", current()))
            else:  # a task (its own copy of the context) enters and leaves; this context's scope is unchanged

                async def other() -> Any:
                    t = enter()
                    inner = cache._SCOPE.get()
                    await asyncio.sleep(0)
                    same = cache._SCOPE.get() is inner
                    leave(t)
                    return same, current()

                out.append(("task", asyncio.run(other()), current()))
        except (ValueError, RuntimeError) as exc:
            out.append((type(exc).__name__, current()))
    return out


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_enter_and_leave_as_the_reference(steps: list[str]) -> None:
    # each in a context of its own (what is left entered stays there)
    new = contextvars.copy_context().run(_play, steps, enter_request, leave_request)
    assert new == contextvars.copy_context().run(_play, steps, reference_enter, reference_leave)
    assert cache._SCOPE.get() is None


def test_request_scope_is_enter_and_leave() -> None:
    assert cache._SCOPE.get() is None
    with request_scope() as outer:
        assert cache._SCOPE.get() is outer and outer.ledger is None and outer.token is None
        with request_scope() as inner:
            assert cache._SCOPE.get() is inner is not outer
        assert cache._SCOPE.get() is outer
    assert cache._SCOPE.get() is None


def test_a_scope_made_afresh_keeps_what_a_lookup_stored() -> None:
    """`RequestScope` has no ``__init__`` (its fields are class attributes): what `CachingLedger._current`
    stores is the instance's own, never shared with another scope."""
    a, b = RequestScope(), RequestScope()
    a.ledger, a.token = "ledger", ("token",)
    assert (b.ledger, b.token) == (None, None) and (RequestScope.ledger, RequestScope.token) == (None, None)
    assert (a.ledger, a.token) == ("ledger", ("token",))
