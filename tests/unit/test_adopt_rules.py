"""Adoption rules (`sidecar.adopt.rules`): the file's validation and each row's assignment by layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.adopt.rules import Assignment, RulesError, Uncovered, load_rules

RULES = '''
tenant = "acme"

[defaults]
scope = "fleet"

[scope_from]
key = "visibility"
values = { public = "tenant", team = "fleet", private = "agent", shared = "restricted" }
readers_key = "shared_with"

[[collection]]
name = "support"
owner = "red/importer"

[[collection]]
name = "bare"
database = "other"

[mem0]
deployment = "prod"
scope = "agent"

[[map]]
agent_id = "support-bot"
owner = "red/support"

[[map]]
metadata = { team = "blue", pinned = true }
owner = "blue/importer"
scope = "tenant"

[[map]]
user_id = "alice"
fleet = "green"
readers = ["blue/analyst"]
'''


def _rules(tmp_path: Path, text: str = RULES) -> object:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return load_rules(path)


def test_layers_owner_fleet_scope(tmp_path: Path) -> None:
    r = _rules(tmp_path)
    support, bare = r.collections()  # type: ignore[attr-defined]
    mem0 = r.mem0()  # type: ignore[attr-defined]
    assign = r.assign  # type: ignore[attr-defined]
    # the collection's owner and [defaults] scope; the fleet is the owner's
    assert assign(support, {}, {}) == Assignment("acme/red/importer", "red", "fleet", (), "collection default_database/support")
    # a [[map]] entry wins for owner and scope; typed metadata equality (true is not 1)
    assert assign(support, {}, {"team": "blue", "pinned": True}) == \
        Assignment("acme/blue/importer", "blue", "tenant", (), "map[1]")
    assert assign(support, {}, {"team": "blue", "pinned": 1}).rule == "collection default_database/support"
    # the row's own visibility key wins over every layer's scope
    assert assign(support, {}, {"team": "blue", "pinned": True, "visibility": "private"}).scope == "agent"
    # a value the key does not map leaves the row uncovered
    assert assign(support, {}, {"visibility": "secret"}) == Uncovered("visibility='secret' maps to no scope")
    # no layer names an owner
    assert assign(bare, {}, {}) == Uncovered("no rule names an owner")
    # Mem0 ids: agent_id → owner; the deployment's scope
    assert assign(mem0, {"agent_id": "support-bot", "user_id": "bob"}, {}) == \
        Assignment("acme/red/support", "red", "agent", (), "map[0]")
    # a map entry without an owner: the owner from a lower layer, the fleet from the more specific entry
    got = assign(support, {"user_id": "alice"}, {"visibility": "shared"})
    assert got == Assignment("acme/red/importer", "green", "restricted", ("acme/blue/analyst",), "map[2]")
    # restricted readers from the row's own key
    got = assign(support, {}, {"visibility": "shared", "shared_with": "red/a, blue/b,red/a"})
    assert got.readers == ("acme/red/a", "acme/blue/b")  # type: ignore[union-attr]
    assert assign(support, {}, {"visibility": "shared", "shared_with": "nobody"}) == \
        Uncovered("shared_with is not a fleet/agent list")


def test_agents_named(tmp_path: Path) -> None:
    assert _rules(tmp_path).agents() == {  # type: ignore[attr-defined]
        "acme/red/importer", "acme/red/support", "acme/blue/importer", "acme/blue/analyst"}


def test_sha256_is_of_the_file(tmp_path: Path) -> None:
    import hashlib

    r = _rules(tmp_path)
    assert r.sha256 == hashlib.sha256(RULES.encode()).hexdigest()  # type: ignore[attr-defined]


@pytest.mark.parametrize("text,where", [
    ('tenant = "a/b"', "tenant"),
    ('tenant = "t"\nunknown = 1', "unknown"),
    ('tenant = "t"\n[defaults]\nscope = "public"', "defaults.scope"),
    ('tenant = "t"\n[defaults]\nowner = "justname"', "defaults.owner"),
    ('tenant = "t"\n[[map]]\nowner = "red/a"', "map.0"),
    ('tenant = "t"\n[[map]]\nmetadata = { mw_scope = "tenant" }\nowner = "red/a"', "map.0"),
    ('tenant = "t"\n[scope_from]\nkey = "mw_scope"', "scope_from"),
    ('tenant = "t"\n[scope_from]\nkey = "v"\nvalues = { a = "public" }', "scope_from"),
    ('tenant = "t"\n[[collection]]\nname = "c"\n[[collection]]\nname = "c"', "(top level)"),
    ('tenant = "t"\n[[collection]]\nname = "c"\nreaders = ["x"]', "collection.0.readers"),
    ('tenant = ', "not valid TOML"),
])
def test_bad_files_name_the_key(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(RulesError) as exc:
        _rules(tmp_path, text)
    assert str(exc.value).startswith(str(tmp_path / "rules.toml")) and where in str(exc.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "nope.toml")


def test_labels_from_layers_and_from_a_metadata_key(tmp_path: Path) -> None:
    r = _rules(tmp_path, '''
tenant = "acme"

[defaults]
scope = "fleet"
owner = "red/importer"
labels = ["imported"]

[scope_from]
key = "visibility"
labels_key = "tags"

[[collection]]
name = "hr"
labels = ["pii", "hr", "pii"]

[[collection]]
name = "plain"
labels = []

[[map]]
metadata = { kind = "contract" }
labels = ["legal-hold"]
''')
    hr, plain = r.collections()  # type: ignore[attr-defined]
    assign = r.assign  # type: ignore[attr-defined]
    assert assign(hr, {}, {}).labels == ("hr", "pii")                     # sorted, deduplicated
    assert assign(plain, {}, {}).labels == ()                             # labels = [] sets none
    assert assign(hr, {}, {"kind": "contract"}).labels == ("legal-hold",)  # the [[map]] layer first
    assert assign(hr, {}, {"tags": "finance, pii"}).labels == ("finance", "pii")  # the metadata key wins
    assert assign(hr, {}, {"tags": ""}).labels == ()
    assert isinstance(assign(hr, {}, {"tags": "p ii"}), Uncovered)
    assert isinstance(assign(hr, {}, {"tags": 3}), Uncovered)


@pytest.mark.parametrize("bad", ['labels = ["p ii"]', 'labels = "pii"', 'labels = ["-x"]'])
def test_bad_labels_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(RulesError, match="labels"):
        _rules(tmp_path, f'tenant = "acme"\n[defaults]\n{bad}\n')


def test_labels_key_may_not_read_governed_keys(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="mw_"):
        _rules(tmp_path, 'tenant = "acme"\n[scope_from]\nkey = "v"\nlabels_key = "mw_labels"\n')
