"""The caches' token read once per request on PostgreSQL too (h25p): `sidecar.app.Services` makes the
`CachingLedger` of a `PostgresLedger` with ``per_request=True``, as it did for SQLite only. What must still
hold on PostgreSQL, each shown here on a real server (`tests.pgutil`):

- keys are never served from memory (``authenticate`` reads the ledger on every call, also inside one request);
- a notification received before a request, or waiting unread on the listening socket when the request's
  first lookup is made, is honoured by every lookup of that request;
- nothing is cached while the LISTEN channel is down (every lookup of such a request asks PostgreSQL and reads
  the token again), and a request that read a token before the channel went down stops using it as soon as
  any lookup has seen the channel down;
- the expiry (``ttl_s``) still bounds every entry inside a request;
- a write through the wrapper inside a request makes its next lookup read the token again.

And, over generated sequences of requests (Hypothesis), with changes, notifications, the channel going
down or up and the clock moving between requests: a `CachingLedger` with ``per_request=True`` answers every
lookup as the one without (the reference: the token read at every lookup) and as the ledger itself, and reads
the token at most once per request while the channel is up.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.app import Services
from sidecar.config import Settings
from sidecar.ledger import CollectionRecord, now_us
from sidecar.ledger import cache as cache_mod
from sidecar.ledger.cache import CachingLedger, request_scope
from sidecar.ledger.postgres import PostgresLedger, _socket_poller
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def collection(cid: str) -> CollectionRecord:
    return CollectionRecord("chroma", cid, "t", "db", "c", "t/admin", now_us())


def wait_listening(ledger: PostgresLedger) -> None:
    deadline = time.monotonic() + 10
    while ledger.cache_version() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ledger.cache_version() is not None


def settle(ledger: PostgresLedger) -> Any:
    """Until the notifications sent so far are read (the token is stable and known); returns it."""
    deadline = time.monotonic() + 10
    last = ledger.cache_version()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = ledger.cache_version()
        if now is not None and now == last:
            return now
        last = now
    raise AssertionError("notifications did not settle within 10 s")


def wait_for_version_change(ledger: PostgresLedger, before: object) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = ledger.cache_version()
        if now is not None and now != before:
            return
        time.sleep(0.01)
    raise AssertionError("no notification within 10 s")


class Pair:
    """A `PostgresLedger` behind a per-request `CachingLedger` (keys not cached, as `Services` makes it on
    PostgreSQL) whose token readings are counted, and a second ledger on the same schema (another replica)."""

    def __init__(self, url: str, ttl_s: float = 3600) -> None:
        schema = fresh_schema()
        self.raw = PostgresLedger(url, schema=schema, max_size=2)
        self.other = PostgresLedger(url, schema=schema, max_size=2)
        self.readings: list[Any] = []

        def version() -> Any:
            self.readings.append(self.raw.cache_version())
            return self.readings[-1]
        self.cached = CachingLedger(self.raw, version, ttl_s=ttl_s, cache_keys=False, per_request=True)
        wait_listening(self.raw)
        self.rec, self.key = self.other.create_key("agent", "t", "red", "a", 1)
        self.other.register_collection(collection("c1"))
        settle(self.raw)

    def close(self) -> None:
        self.raw.close()
        self.other.close()


@pytest.fixture()
def pair(pg_url: str) -> Any:  # noqa: F811
    p = Pair(pg_url)
    yield p
    p.close()


def test_services_read_the_postgres_token_once_per_request(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    schema = fresh_schema()
    services = Services(Settings(ledger_url=pg_url, ledger_schema=schema, policies_dir=POLICIES,
                                 ledger_path=tmp_path / "unused.db"))
    try:
        assert isinstance(services.ledger, CachingLedger)
        assert services.ledger.per_request and not services.ledger.cache_keys
    finally:
        services.ledger.close()


def test_one_reading_per_request_and_keys_read_every_time(pair: Pair) -> None:
    c = pair.cached
    pair.readings.clear()
    with request_scope():
        assert c.authenticate(pair.key) is not None
        assert c.verified_principal(pair.key) is not None
        assert c.cached_collection("chroma", "c1") is False
        assert c.get_collection("chroma", "c1") is not None
        assert c.cached_collection("chroma", "c1") is True
        assert c.get_collection("chroma", "c1") is not None
        assert c.agent_entities({"t/red/a"})
        pair.other.revoke_key(pair.rec.key_id)
        assert c.authenticate(pair.key) is None  # the same request: still read from PostgreSQL
    # one reading for the request's lookups, one more by `_keep_verified` (it checks nothing moved meanwhile)
    assert len(pair.readings) == 2


def test_a_notification_received_before_the_request_is_honoured(pair: Pair) -> None:
    c = pair.cached
    with request_scope():
        assert c.get_collection("chroma", "c1") is not None
    before = settle(pair.raw)
    pair.other.delete_collection("chroma", "c1", "t/admin", "r")
    wait_for_version_change(pair.raw, before)
    with request_scope():
        assert c.cached_collection("chroma", "c1") is False
        assert c.get_collection("chroma", "c1") is None
        assert c.get_collection("chroma", "c1") is None


def test_a_notification_waiting_unread_when_the_request_begins_is_honoured(pair: Pair) -> None:
    """The listening socket has something unread (a notification the listener has not counted yet): the
    token is None, so no lookup of the request is served from memory, and every lookup reads it again."""
    c = pair.cached
    with request_scope():
        assert c.get_collection("chroma", "c1") is not None
        assert c.cached_collection("chroma", "c1") is True
    listener = pair.raw._listener
    assert listener is not None
    a, b = socket.socketpair()
    real = listener._poller
    try:
        b.send(b"x")  # something to read on the "listening" socket
        listener._poller = _socket_poller(a.fileno())
        hits, misses = c.hits, c.misses
        pair.readings.clear()
        with request_scope():
            assert c.cached_collection("chroma", "c1") is False
            assert c.verified_principal(pair.key) is None
            assert c.get_collection("chroma", "c1") is not None
            assert c.get_collection("chroma", "c1") is not None
        assert (c.hits, c.misses) == (hits, misses)  # no lookup was a cache lookup: all went to PostgreSQL
        assert pair.readings == [None] * 4
    finally:
        listener._poller = real
        a.close()
        b.close()
    with request_scope():  # the channel readable no more: caches again, but the old entries were dropped
        misses = c.misses
        assert c.get_collection("chroma", "c1") is not None and c.misses == misses + 1


def test_nothing_is_cached_while_the_channel_is_down(pair: Pair) -> None:
    c = pair.cached
    with request_scope():
        assert c.get_collection("chroma", "c1") is not None
        assert c.authenticate(pair.key) is not None
    listener = pair.raw._listener
    assert listener is not None
    real = listener._poller
    listener._poller = None  # as the listener does when its connection drops
    try:
        hits, misses = c.hits, c.misses
        pair.readings.clear()
        with request_scope():
            assert c.verified_principal(pair.key) is None
            assert c.cached_collection("chroma", "c1") is False
            assert c.get_collection("chroma", "c1") is not None
            assert c.get_collection("chroma", "c1") is not None
            assert c.agent_entities({"t/red/a"})
        assert (c.hits, c.misses) == (hits, misses)
        assert pair.readings == [None] * 5  # read at every lookup: no reading kept while down
        pair.other.delete_collection("chroma", "c1", "t/admin", "r")  # unseen by the (down) listener
        with request_scope():
            assert c.get_collection("chroma", "c1") is None
    finally:
        listener._poller = real


def test_the_channel_going_down_during_a_request_ends_its_reading(pair: Pair) -> None:
    """A request read a token; then the channel goes down and another request's lookup sees it (None): the
    caches are dropped, and the first request's next lookups ask PostgreSQL."""
    c = pair.cached
    with request_scope():
        assert c.get_collection("chroma", "c1") is not None
    listener = pair.raw._listener
    assert listener is not None
    real = listener._poller
    try:
        with request_scope():
            assert c.cached_collection("chroma", "c1") is True
            listener._poller = None
            with request_scope():  # another request
                assert c.cached_collection("chroma", "c1") is False
            hits = c.hits
            pair.readings.clear()
            assert c.cached_collection("chroma", "c1") is False
            assert c.get_collection("chroma", "c1") is not None and c.hits == hits
            assert pair.readings == [None, None]
    finally:
        listener._poller = real


def test_a_write_through_the_wrapper_in_a_request_makes_it_read_again(pair: Pair) -> None:
    c = pair.cached
    with request_scope():
        assert c.get_collection("chroma", "c1") is not None
        pair.readings.clear()
        c.delete_collection("chroma", "c1", "t/admin", "r")  # a write: every cache dropped
        assert c.get_collection("chroma", "c1") is None
        assert len(pair.readings) == 1


def test_the_expiry_bounds_entries_inside_a_request(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    now = [1000.0]
    monkeypatch.setattr(cache_mod, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))
    p = Pair(pg_url, ttl_s=5.0)
    try:
        c = p.cached
        with request_scope():
            assert c.get_collection("chroma", "c1") is not None
            assert c.cached_collection("chroma", "c1") is True
            now[0] += 5.5  # older than ttl_s, within the same request
            assert c.cached_collection("chroma", "c1") is False
            misses = c.misses
            assert c.get_collection("chroma", "c1") is not None and c.misses == misses + 1
    finally:
        p.close()


# -- the differential model ---------------------------------------------------------------------------------


class FakeLedger:
    """Collections, agents and keys in dicts; every read is counted (what the caches must not serve stale)."""

    def __init__(self) -> None:
        self.collections: dict[str, CollectionRecord] = {}
        self.agents: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, Any] = {}
        self.reads = 0

    def get_collection(self, backend: str, cid: str) -> CollectionRecord | None:
        self.reads += 1
        return self.collections.get(cid)

    def agent_entities(self, uids: set[str]) -> dict[str, dict[str, Any]]:
        self.reads += 1
        return {u: self.agents[u] for u in uids if u in self.agents}

    def authenticate(self, key: str) -> Any:
        self.reads += 1
        return self.keys.get(key)


class FakeChannel:
    """The PostgreSQL token: the count of notifications, None while down or while one waits unread."""

    def __init__(self) -> None:
        self.count, self.down, self.unread = 1, False, False
        self.readings = 0

    def version(self) -> Any:
        self.readings += 1
        return None if self.down or self.unread else self.count


EVENTS = st.sampled_from(["coll-add", "coll-del", "agent-trust", "key-add", "key-revoke", "notify-read",
                          "notify-unread", "down", "up", "tick", "long-tick"])
LOOKUPS = st.sampled_from(["coll", "cached", "agents", "auth", "verified"])
REQUESTS = st.lists(st.tuples(st.lists(EVENTS, max_size=4), st.lists(st.tuples(LOOKUPS, st.integers(0, 2)),
                                                                      min_size=1, max_size=6)), max_size=12)


def _apply(event: str, ledger: FakeLedger, channel: FakeChannel, clock: list[float], n: int) -> None:
    """A change by another replica is committed and its notification sent (read at once or left unread);
    or the channel goes down or up (a reconnection counts, as `_Listener.run` does); or time passes."""
    if event == "coll-add":
        ledger.collections[f"c{n % 3}"] = CollectionRecord("chroma", f"c{n % 3}", "t", "db", "c", "t/admin", n)
    elif event == "coll-del":
        ledger.collections.pop(f"c{n % 3}", None)
    elif event == "agent-trust":
        ledger.agents[f"t/red/a{n % 3}"] = {"trust": n}
    elif event == "key-add":
        ledger.keys[f"k{n % 3}"] = ("principal", n)
    elif event == "key-revoke":
        ledger.keys.pop(f"k{n % 3}", None)
    elif event == "notify-read":
        channel.unread = False
        channel.count += 1
    elif event == "notify-unread":
        channel.unread = True
    elif event == "down":
        channel.down = True
    elif event == "up":
        if channel.down:
            channel.down = False
            channel.count += 1
    elif event == "tick":
        clock[0] += 1.0
    elif event == "long-tick":
        clock[0] += 10.0
    if event in ("coll-add", "coll-del", "agent-trust", "key-add", "key-revoke"):
        channel.count += 1  # the writer's notification, received (an unread one is "notify-unread")


def _run(requests: Any, per_request: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[int], bool]:
    """(every lookup's answer, per request the token readings of its lookups — -1 when the channel was down or
    a notification unread as it began —, whether every memory answer was current)."""
    clock = [0.0]
    monkeypatch.setattr(cache_mod, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    ledger, channel = FakeLedger(), FakeChannel()
    cached = CachingLedger(ledger, channel.version, ttl_s=5.0, cache_keys=False, per_request=per_request)
    answers: list[Any] = []
    readings: list[int] = []
    current = True
    n = 0
    for events, lookups in requests:
        for event in events:
            n += 1
            _apply(event, ledger, channel, clock, n)
        before = channel.readings
        up = not channel.down and not channel.unread
        with request_scope():
            for lookup, i in lookups:
                if lookup == "coll":
                    answers.append(cached.get_collection("chroma", f"c{i}"))
                elif lookup == "cached":
                    answers.append(cached.cached_collection("chroma", f"c{i}"))
                    current = current and (not answers[-1] or f"c{i}" in ledger.collections)
                elif lookup == "agents":
                    answers.append(cached.agent_entities({f"t/red/a{i}", "t/red/a0"}))
                elif lookup == "auth":
                    answers.append(cached.authenticate(f"k{i}"))
                else:
                    answers.append(cached.verified_principal(f"k{i}"))
                    current = current and (answers[-1] is None or answers[-1] == ledger.keys.get(f"k{i}"))
        # the readings of the request's lookups (`authenticate` reads once more, in `_keep_verified`, when the
        # key was valid)
        extra = sum(1 for (lookup, _), answer in zip(lookups, answers[-len(lookups):])
                    if lookup == "auth" and answer is not None)
        readings.append((channel.readings - before - extra) if up else -1)
    return answers, readings, current


def _bare(requests: Any) -> list[Any]:
    """The ledger's own answers to the lookups that read it (`get_collection`, `agent_entities`, `authenticate`)."""
    ledger, channel, clock = FakeLedger(), FakeChannel(), [0.0]
    out: list[Any] = []
    n = 0
    for events, lookups in requests:
        for event in events:
            n += 1
            _apply(event, ledger, channel, clock, n)
        for lookup, i in lookups:
            if lookup == "coll":
                out.append(ledger.collections.get(f"c{i}"))
            elif lookup == "agents":
                out.append({u: ledger.agents[u] for u in {f"t/red/a{i}", "t/red/a0"} if u in ledger.agents})
            elif lookup == "auth":
                out.append(ledger.keys.get(f"k{i}"))
    return out


def _reading_lookups(requests: Any, answers: list[Any]) -> list[Any]:
    kinds = [lookup for _, lookups in requests for lookup, _ in lookups]
    return [a for kind, a in zip(kinds, answers) if kind in ("coll", "agents", "auth")]


@settings(max_examples=400, deadline=None)
@given(requests=REQUESTS)
def test_per_request_answers_as_the_reference_and_the_ledger(requests: Any) -> None:
    with pytest.MonkeyPatch.context() as mp:
        new, new_readings, new_current = _run(requests, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        ref, _, ref_current = _run(requests, False, mp)
    assert new == ref
    assert new_current and ref_current
    assert _reading_lookups(requests, new) == _bare(requests)
    assert all(r <= 1 for r in new_readings)  # channel up: one reading for all the request's lookups
