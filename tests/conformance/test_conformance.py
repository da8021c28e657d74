"""One conformance suite for every backend: the corpus's principals act on the corpus's rows through a real
sidecar in front of each real backend (`drivers`), and what they are served, may change, delete and write is
what cedarpy allows (`corpus.oracle`). Refusal shapes are pinned once (`corpus.change_outcome`, each driver's
status map), so the backends cannot drift apart again:

- an unreadable row is answered exactly as a missing one (absent from lists and counts; a single-row read, update
  or delete of it gets the backend's own "not found" shape);
- a row the caller may read but not change: 403 on update and delete, on every backend; a delete by ids is
  all-or-nothing like a write; a delete by filter deletes the matching rows the caller may delete;
- an update may send back the governed keys a read showed, unchanged; any other governed value is 400;
- a backend's own 4xx keeps its status but never its text (it may quote stored content);
- a row over ``MAX_ROW_BYTES`` (its text in UTF-8 bytes with its metadata) is 413 naming the limit, and nothing is
  written or changed.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest

from tests.conformance.corpus import (PRINCIPALS, SEED_IDS, SEEDS, UNGOVERNED, WRITES, change_outcome, oracle,
                                      rewrite_refused, write_oracle)
from tests.conformance.drivers import ChromaDriver, Mem0Driver, World

pytestmark = pytest.mark.integration

BACKENDS = ["chroma", "mem0"]


@pytest.fixture(scope="module", params=BACKENDS)
def driver(request: pytest.FixtureRequest) -> Any:
    if request.param == "chroma":
        return ChromaDriver(request.getfixturevalue("stack"))
    return Mem0Driver(request.getfixturevalue("mem0_stack"))


@pytest.fixture(scope="module")
def world(driver: Any) -> Iterator[World]:
    yield driver.world("conf")


@pytest.fixture(scope="module")
def read_world(driver: Any) -> Iterator[World]:
    """The seeds alone, never written to: the read cases hold in any test order (the other cases add rows)."""
    yield driver.world("confread")


def test_the_oracle_is_not_degenerate() -> None:
    """Every action has allows and denies across the corpus, and no principal reads nothing or everything."""
    for action in ("read", "update", "delete"):
        per = [oracle("t", p, action) for p in PRINCIPALS]
        assert any(per) and any(set(SEED_IDS) - a for a in per), action
    assert all(oracle("t", p, "read") for p in PRINCIPALS)
    assert all(oracle("t", p, "read") != set(SEED_IDS) for p in PRINCIPALS if p != "admin")
    writes = [ok for p in PRINCIPALS for ok in write_oracle("t", p)]
    assert any(writes) and not all(writes)
    outcomes = {o for p in PRINCIPALS for a in ("update", "delete") for o in change_outcome("t", p, a).values()}
    assert outcomes == {"ok", "forbidden", "not_found"}


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_every_read_path_serves_what_cedar_allows(driver: Any, read_world: World, principal: str) -> None:
    world = read_world
    expected = oracle(world.tenant, principal, "read")
    everything = SEED_IDS + [UNGOVERNED]
    assert set(driver.get(world, principal, everything)) == expected
    assert {n for n in everything if driver.get_one(world, principal, n)} == expected
    assert set(driver.scan(world, principal)) == expected
    alpha = {s.row_id for s in SEEDS if s.topic == "alpha"}
    assert set(driver.scan(world, principal, topic="alpha")) == expected & alpha
    assert set(driver.rank(world, principal, len(everything))) == expected
    top = driver.rank(world, principal, 2)
    assert len(top) == min(2, len(expected)) and set(top) <= expected
    if driver.counts:
        assert driver.count(world, principal) == len(expected)
    assert {n for n in SEED_IDS if driver.lineage(world, principal, n) == 200} == expected
    assert all(driver.lineage(world, principal, n) == 404 for n in SEED_IDS if n not in expected)
    if driver.has_history:
        assert {n for n in everything if driver.history(world, principal, n) == 200} == expected


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_updates_follow_the_one_rule(driver: Any, world: World, principal: str) -> None:
    outcome = change_outcome(world.tenant, principal, "update")
    got = {n: driver.update(world, principal, n).status_code for n in SEED_IDS}
    assert got == {n: driver.UPDATE_STATUS[o] for n, o in outcome.items()}
    assert driver.update(world, principal, UNGOVERNED).status_code == driver.UPDATE_STATUS["not_found"]


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_deletes_follow_the_one_rule(driver: Any, principal: str) -> None:
    w = driver.world("del")
    outcome = change_outcome(w.tenant, principal, "delete")
    got = {n: driver.delete(w, principal, n) for n in SEED_IDS}
    assert {n: r.status_code for n, r in got.items()} == {n: driver.DELETE_STATUS[o] for n, o in outcome.items()}
    gone = {n for n in SEED_IDS if not driver.in_backend(w, n)}
    assert gone == {n for n, o in outcome.items() if o == "ok"}
    # Tombstoned rows are never served again, not even to the tenant admin, on any read path.
    assert not set(driver.scan(w, "admin")) & gone
    assert not set(driver.get(w, "admin", SEED_IDS)) & gone
    assert driver.delete(w, principal, UNGOVERNED).status_code == driver.DELETE_STATUS["not_found"]
    assert driver.in_backend(w, UNGOVERNED)


def test_a_delete_by_filter_deletes_what_cedar_allows(driver: Any) -> None:
    w = driver.world("bulk")
    assert driver.delete_topic(w, "r0", "beta").status_code == 403  # trust 0: no delete_bulk on the collection
    assert driver.delete_topic(w, "r1", "beta").status_code == 200
    gone = {n for n in SEED_IDS if not driver.in_backend(w, n)}
    beta = {s.row_id for s in SEEDS if s.topic == "beta"}
    assert gone == oracle(w.tenant, "r1", "delete") & beta != set()


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_writes_follow_cedar(driver: Any, world: World, principal: str) -> None:
    allowed = write_oracle(world.tenant, principal)
    for (scope, fleet, readers), ok in zip(WRITES, allowed):
        requested: dict[str, Any] = {"mw_scope": scope}
        if fleet:
            requested["mw_fleet"] = fleet
        if readers:
            requested["mw_readers"] = ",".join(readers)
        r = driver.write(world, principal, requested)
        assert r.status_code == (200 if ok else 403), (scope, fleet, readers, r.text)


def test_a_backend_refusal_keeps_its_status_not_its_text(driver: Any, world: World) -> None:
    r, backend_word = driver.backend_refusal(world, "r1")
    assert 400 <= r.status_code < 500 and r.json()["error"] == "backend_rejected", r.text
    assert backend_word not in r.text


def test_an_update_may_send_back_what_a_read_showed(driver: Any, world: World) -> None:
    """A client that round-trips a row's whole metadata (mem0's own Chroma store does) may send the governed keys
    back exactly as they were shown; a governed key with another value is 400 and changes nothing."""
    shown = driver.metadata(world, "r1", "r1-tenant")
    assert any(k.startswith("mw_") for k in shown)
    assert driver.update_metadata(world, "r1", "r1-tenant", {**shown, "note": "round trip"}).status_code == 200
    assert driver.metadata(world, "r1", "r1-tenant")["note"] == "round trip"
    forged = {**shown, "mw_owner": shown["mw_owner"] + "x", "note": "forged"}
    assert driver.update_metadata(world, "r1", "r1-tenant", forged).status_code == 400
    after = driver.metadata(world, "r1", "r1-tenant")
    assert after["note"] == "round trip" and after["mw_owner"] == shown["mw_owner"]


MAX_ROW_BYTES = 1024 * 1024  # the default of MEMWARDEN_MAX_ROW_BYTES, which the session's sidecars run with


@pytest.mark.parametrize("text", ["x" * (MAX_ROW_BYTES + 1), "é" * (MAX_ROW_BYTES // 2 + 1)], ids=["ascii", "utf8"])
def test_a_row_over_the_row_limit_is_413_and_changes_nothing(driver: Any, world: World, text: str) -> None:
    """Issue 34, finding 3: one agent's large rows broke other agents' reads. A row's size is capped at write time:
    over ``MAX_ROW_BYTES`` bytes (UTF-8: 524,289 two-byte characters are over a 1 MiB limit) an add and an update
    are 413 with a message naming the limit, and nothing is written or changed."""
    before = set(driver.scan(world, "r1"))
    for r in (driver.write_text(world, "r1", text), driver.update_text(world, "r1", "r1-tenant", text)):
        assert r.status_code == 413, r.text[:300]
        assert r.json()["error"] == "payload_too_large" and "MEMWARDEN_MAX_ROW_BYTES" in r.json()["message"]
        assert str(MAX_ROW_BYTES) in r.json()["message"]
    assert set(driver.scan(world, "r1")) == before
    assert driver.text(world, "r1", "r1-tenant") != text
    # at the limit itself: written
    assert driver.write_text(world, "r1", "y" * (MAX_ROW_BYTES - 100)).status_code == 200


# Code points a renderer shows as nothing (Unicode's Default_Ignorable_Code_Point) that are not format characters
# (category Cf), which the normalisation removed before: combining grapheme joiner, variation selector-16, Mongolian
# free variation selector one, Hangul filler, a variation selector supplement, a tag.
INVISIBLE = ("\u034f", "\ufe0f", "\u180b", "\u3164", "\U000e0100", "\U000e0041")


def test_deleted_content_stays_deleted_whatever_invisible_marks_are_added(driver: Any) -> None:
    """Issue 34, finding 9: a fleet mate re-added a deleted text with U+034F, U+FE0F or U+180B in it, on both
    backends. Who is refused is the forgotten-content rule over cedarpy (`corpus.rewrite_refused`); every spelling
    of the text with default-ignorable code points inserted is the same text."""
    world = driver.world("ign")
    text = f"the offsite is in lisbon on the 14th {uuid.uuid4().hex[:6]}"
    assert driver.add_text(world, "r1", "ign-orig", text, {"mw_scope": "fleet"}).status_code == 200
    assert driver.delete(world, "r1", "ign-orig").status_code == 200
    words = text.split(" ")
    writers = [a for a, ok in ((a, write_oracle(world.tenant, a)[1]) for a in PRINCIPALS) if ok]
    refused = {a for a in writers if rewrite_refused(world.tenant, a, "r1", "fleet")}
    assert {"r1", "r2"} <= refused and set(writers) - refused  # fleet mates refused, another fleet not
    for who in writers:
        for n, mark in enumerate(INVISIBLE):
            spelt = " ".join(w[:1] + mark + w[1:] if i == n % len(words) else w for i, w in enumerate(words)) + mark
            r = driver.add_text(world, who, f"ign-{who}-{n}", spelt, {})
            assert r.status_code == (409 if who in refused else 200), (who, repr(spelt), r.text)
