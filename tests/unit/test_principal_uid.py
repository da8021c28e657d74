"""`Principal.uid`, made once at construction, against the property of de70fd8 (`governance_reference`): the same
uid for every kind and field values (unicode, empty, None fleet or agent, unknown kinds), and the dataclass
unchanged otherwise — equality, hash, repr, field order for positional construction and ``match``,
`dataclasses.replace` (the uid follows the new fields), pickling and copying, and frozen."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.governance import Principal
from tests.unit.governance_reference import principal_uid

texts = st.text(max_size=6) | st.sampled_from(["t", "red", "a", "/", "\u00e9", "\ud800"])
principals = st.builds(Principal, st.sampled_from(["agent", "admin", "operator", "other"]), texts, texts,
                       st.none() | texts, st.none() | texts, st.integers(-1, 4), st.lists(texts, max_size=2).map(tuple))


@given(principals, texts, st.none() | texts)
def test_uid_agrees_with_the_property(p: Principal, new_agent: str, new_fleet: str | None) -> None:
    assert p.uid == principal_uid(p) and type(p.uid) is tuple
    same = Principal(p.kind, p.key_id, p.tenant, p.fleet, p.agent, p.trust, p.roles)
    assert same == p and hash(same) == hash(p)
    assert hash(p) == hash((p.kind, p.key_id, p.tenant, p.fleet, p.agent, p.trust, p.roles))  # as before: no uid in it
    assert repr(p) == (f"Principal(kind={p.kind!r}, key_id={p.key_id!r}, tenant={p.tenant!r}, fleet={p.fleet!r}, "
                       f"agent={p.agent!r}, trust={p.trust!r}, roles={p.roles!r})")
    moved = dataclasses.replace(p, agent=new_agent, fleet=new_fleet)
    assert moved.uid == principal_uid(moved)
    for other in (pickle.loads(pickle.dumps(p)), copy.copy(p), copy.deepcopy(p)):
        assert other == p and other.uid == p.uid
    assert Principal.__match_args__ == ("kind", "key_id", "tenant", "fleet", "agent", "trust", "roles")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.uid = ("Agent", "x")  # type: ignore[misc]
    with pytest.raises(TypeError):
        Principal("agent", "k", "t", uid=("Agent", "x"))  # type: ignore[call-arg]
