"""Governed keys a client echoes back on an update (`sidecar.core.echo`): what a
read showed the caller may come back unchanged; any other value is 400, and on a new row any of them is."""

from __future__ import annotations

import pytest

from sidecar.core.echo import refuse_claims as _refuse_claims, set_aside as _claims, without_echo as _without_echo
from sidecar.errors import BadRequest

VIEW = {"mw_tenant": "t", "mw_owner": "t/red/a", "mw_scope": "restricted", "mw_readers": "t/red/b,t/blue/c",
        "mw_r:t/red/b": True, "mw_r:t/blue/c": True, "mw_created_at": 17, "mw_source": "chroma:add:r1",
        "mw_derived_from": "p1", "mw_subject": "s", "mw_predicate": "p", "mw_object": "o", "mw_supersedes_id": "old"}


def test_shown_only_keys_are_set_aside() -> None:
    kept, claimed = _claims({**VIEW, "data": "text", "mw_fleet": "red"})
    assert set(claimed) == {"mw_tenant", "mw_owner", "mw_readers", "mw_r:t/red/b", "mw_r:t/blue/c", "mw_created_at",
                            "mw_source", "mw_supersedes_id"}
    assert kept == {"data": "text", "mw_fleet": "red", "mw_scope": "restricted", "mw_derived_from": "p1",
                    "mw_subject": "s", "mw_predicate": "p", "mw_object": "o"}
    # readers as a request names them (fleet/agent) are a request, not an echo
    assert _claims({"mw_readers": "red/b"}) == ({"mw_readers": "red/b"}, {})
    assert _claims(None) == (None, {})


def test_an_exact_echo_changes_nothing() -> None:
    _, claimed = _claims(VIEW)
    requested = {"mw_scope": "restricted", "mw_derived_from": ("p1",), "mw_subject": "s", "mw_predicate": "p", "mw_object": "o"}
    assert _without_echo(claimed, requested, VIEW) == {"mw_scope": "restricted"}


@pytest.mark.parametrize("key,value", [("mw_owner", "t/red/x"), ("mw_created_at", 18), ("mw_created_at", "17"),
                                       ("mw_r:t/red/x", True), ("mw_supersedes_id", "other"), ("mw_readers", "t/red/b")])
def test_any_other_value_is_refused(key: str, value: object) -> None:
    _, claimed = _claims({**VIEW, key: value})
    with pytest.raises(BadRequest, match="governed by memwarden"):
        _without_echo(claimed, {}, VIEW)


def test_a_changed_write_once_key_stays_requested() -> None:
    out = _without_echo({}, {"mw_derived_from": ("p1", "p2"), "mw_object": "o2", "mw_subject": "s", "mw_predicate": "p"}, VIEW)
    assert out == {"mw_derived_from": ("p1", "p2"), "mw_object": "o2"}  # the profile answers these 400 (fixed once written)


def test_new_rows_refuse_every_claim() -> None:
    _refuse_claims([({}, {})])
    with pytest.raises(BadRequest, match="'mw_owner'"):
        _refuse_claims([({}, {}), _claims({"mw_owner": "t/red/a"})])
