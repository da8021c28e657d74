"""The PostgreSQL ledger's asynchronous hot-path reads (`PostgresLedger.read_rows_async`, `authenticate_async`:
the pool's connection taken and given back directly, one reused cursor per connection) against the reference
(`tests/unit/postgres_hot_reference.py`: ``pool.connection()``, a new cursor per call) on a real PostgreSQL:
the same rows, owners, key answers and principals — and the same exception class — for calls interleaved in
any order on the same pooled connections (reads of rows with binary or text ids, failing reads with NUL or
non-``str`` ids, key checks, authentications of valid, revoked, unknown and malformed keys), and a
connection killed under the pool answered the same way by both, with the pool still serving after. The
synchronous `read_rows` is checked with ``MEMWARDEN_LEDGER_PG_DIRECT`` on and off (the fixture's two ledgers)."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.governance import Row
from sidecar.ledger.postgres import PostgresLedger
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)
from tests.unit import postgres_hot_reference as ref
from tests.unit.test_ledger_pg_rows_fast import rows as row_strategy
from tests.unit.test_ledger_pg_rows_fast import same, store


@pytest.fixture(scope="module", params=[True, False], ids=["pg_direct=on", "pg_direct=off"])
def world(pg_url: str, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:  # noqa: F811
    """The ledger, with `read_rows` on psycopg's internals or not (``MEMWARDEN_LEDGER_PG_DIRECT`` on, off)."""
    led = PostgresLedger(pg_url, schema=fresh_schema(), min_size=0, max_size=2, direct=request.param)
    keys = {"valid": led.create_key("agent", "t", "f", "a", 1, roles=("reviewer",))[1],
            "admin": led.create_key("admin", "t", None, None, 0)[1]}
    led.create_key("agent", "t", "f", "b", 2)
    revoked_record, keys["revoked"] = led.create_key("agent", "t", "g", "c", 0, roles=("ops",))
    led.revoke_key(revoked_record.key_id)
    keys["unknown"] = "mwk_0123456789abcdef." + "x" * 43
    keys["wrong secret"] = keys["valid"][:-3] + "abc"
    keys["malformed"] = "not-a-key"
    odd = Row("chroma", "c", 'a"b', "t", "f", "t/f/a", "agent", "t/f/a", 2**62, readers=("t/f/b",))
    plain = Row("chroma", "c", "NULL", "t", "f", "t/f/b", "agent", "t/f/a", 0, superseded_at=-(2**62))
    full = Row("chroma", "c", "full", "t", "f", "t/f/a", "restricted", "t/f/w", 11, "superseded",
               readers=("t/f/b", "t/f/c"), labels=("pii", "x:y"), request_id="rq", subject="s", predicate="p",
               object="o", extra={"cedar": {"user_id": "u"}, "n": [1, None]}, source="src", single_valued=True,
               supersedes=("c0", "r0"), superseded_by=("c2", "r2"), superseded_at=12, content_hmac="ab" * 32)
    collection = store(led, [odd, plain, full, Row("chroma", "c", "{x}", "t", "g", "t/g/c", "tenant", "t/g/c", 1)])
    key_ids = {name: (k[4:].split(".")[0] if k.startswith("mwk_") else None) for name, k in keys.items()}
    yield {"ledger": led, "keys": keys, "key_ids": key_ids, "collection": collection}
    led.close()


ID_CHOICES = ["absent", 'a"b', "NULL", "{x}", "full", "", "é😀", "a\x00b", 5, None, "\ud800", ["nested"]]
calls = st.one_of(
    st.tuples(st.just("read"), st.lists(st.sampled_from(ID_CHOICES), max_size=5),
              st.sampled_from(["valid", "revoked", "unknown", "admin", None]), st.booleans()),
    st.tuples(st.just("auth"), st.sampled_from(["valid", "revoked", "unknown", "wrong secret", "malformed", "admin"])),
)


async def _outcome(coro: Any) -> Any:
    try:
        return ("ok", await coro)
    except Exception as exc:  # noqa: BLE001 - the reference's exception class is the answer
        return ("raised", type(exc))


def _same_outcome(got: Any, expected: Any) -> None:
    assert got[0] == expected[0], (got, expected)
    if got[0] == "raised" or not isinstance(got[1], tuple):
        assert got[1] == expected[1], (got, expected)
    else:
        same(got[1], expected[1])


async def _one(fns: Any, w: dict[str, Any], call: tuple[Any, ...], sync: bool = False) -> Any:
    """`call` through `fns` (the new methods or the reference): asynchronous, or `sync` (the synchronous pool)."""
    led = w["ledger"]
    if call[0] == "read":
        _, ids, key, other_collection = call
        collection = "other" if other_collection and not ids else w["collection"]
        args = (led, "chroma", collection, list(ids), w["key_ids"].get(key) if key else None)
        if sync:
            return _outcome_sync(lambda: fns.read_rows(*args))
        return await _outcome(fns.read_rows_async(*args))
    if sync:
        return _outcome_sync(lambda: fns.authenticate(led, w["keys"][call[1]]))
    return await _outcome(fns.authenticate_async(led, w["keys"][call[1]]))


def _outcome_sync(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001
        return ("raised", type(exc))


class _New:
    read_rows_async = PostgresLedger.read_rows_async
    authenticate_async = PostgresLedger.authenticate_async
    read_rows = PostgresLedger.read_rows
    authenticate = PostgresLedger.authenticate


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(calls, min_size=1, max_size=8))
def test_interleaved_calls_agree_with_the_reference(world: dict[str, Any], sequence: list[tuple[Any, ...]]) -> None:
    """Each call through the new methods, asynchronous and synchronous, alone and two at once on the pool's two
    connections, answers as the reference's asynchronous and synchronous calls."""
    async def scenario() -> None:
        led = world["ledger"]
        try:
            for call in sequence:
                expected = await _one(ref, world, call)
                _same_outcome(await _one(ref, world, call, sync=True), expected)
                _same_outcome(await _one(_New, world, call), expected)
                _same_outcome(await _one(_New, world, call, sync=True), expected)
                both = await asyncio.gather(_one(_New, world, call), _one(_New, world, call), _one(ref, world, call))
                for g in both:
                    _same_outcome(g, expected)
                threaded = await asyncio.gather(*(asyncio.to_thread(lambda: asyncio.run(_one(_New, world, call, sync=True)))
                                                  for _ in range(3)))
                for g in threaded:
                    _same_outcome(g, expected)
        finally:
            await led.aclose()
    asyncio.run(scenario())


def test_a_killed_connection_fails_both_alike_and_the_pool_recovers(world: dict[str, Any], pg_url: str) -> None:  # noqa: F811
    """A pooled connection whose server process was terminated: the new read fails as the reference's does
    (psycopg ``OperationalError``, which `sidecar.ledger.offloop` maps to 503) or is served by a replacement the
    pool's checkout check found, and the following reads answer normally."""
    led = world["ledger"]
    call = ("read", ["full", "absent"], "valid", False)

    async def scenario(fns: Any) -> list[Any]:
        try:
            expected = await _one(ref, world, call)
            assert expected[0] == "ok"
            await _one(fns, world, call)  # a pooled connection (with its cursor, for the new code)
            pids = [c.info.backend_pid for c in list(led._apool._pool)]  # noqa: SLF001
            with psycopg.connect(pg_url, autocommit=True) as admin:
                for pid in pids:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            outcomes = []
            for _ in range(4):
                got = await _one(fns, world, call)
                outcomes.append(got[0] if got[0] == "ok" else got[1])
                if got[0] == "ok":
                    _same_outcome(got, expected)
                else:
                    assert issubclass(got[1], psycopg.OperationalError), got
                    await asyncio.sleep(0.3)
            assert outcomes[-1] == "ok", outcomes
            return outcomes
        finally:
            await led.aclose()
    asyncio.run(scenario(ref))
    asyncio.run(scenario(_New))

    # the synchronous pool: the same, through `read_rows`
    expected = asyncio.run(_one(ref, world, call, sync=True))
    for fns in (ref, _New):
        asyncio.run(_one(fns, world, call, sync=True))
        pids = [c.info.backend_pid for c in list(led._pool._pool)]  # noqa: SLF001
        with psycopg.connect(pg_url, autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        outcomes = []
        for _ in range(4):
            got = asyncio.run(_one(fns, world, call, sync=True))
            outcomes.append(got[0])
            if got[0] == "ok":
                _same_outcome(got, expected)
            else:
                assert issubclass(got[1], psycopg.OperationalError), got
        assert outcomes[-1] == "ok", outcomes


def test_a_cancelled_read_leaves_no_connection_busy(world: dict[str, Any]) -> None:
    """A read cancelled while its statement is in flight (a request that ended) gives its connection back in
    a state the pool accepts (idle, or discarded), as the reference does; later reads answer normally."""
    led = world["ledger"]
    call = ("read", ["full"], "valid", False)

    async def scenario(fns: Any) -> None:
        try:
            expected = await _one(ref, world, call)
            for delay in (0, 0.0005, 0.002):
                task = asyncio.ensure_future(fns.read_rows_async(led, "chroma", world["collection"], ["full"], world["key_ids"]["valid"]))
                await asyncio.sleep(delay)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                for _ in range(3):
                    _same_outcome(await _one(fns, world, call), expected)
            for conn in list(led._apool._pool):  # noqa: SLF001
                assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        finally:
            await led.aclose()
    asyncio.run(scenario(ref))
    asyncio.run(scenario(_New))


# -- the invalidation listener's `version` (`_Listener`, one epoll set per connection) -------------------

def test_listener_version_agrees_with_the_poll_reference_on_a_socket() -> None:
    """`_Listener.version` (epoll) and the reference (a new ``poll`` per call) give the same answer for the same
    socket states: nothing pending (the count), data not yet read (None), data read again (the count), the peer
    gone (EOF: None), and no connection (None)."""
    import socket

    from sidecar.ledger.postgres import _Listener, _PollFd, _socket_poller

    for make in (_socket_poller, _PollFd):
        new, old = _Listener("", "c", 1.0), ref._Listener("", "c", 1.0)
        assert new.version() is None and old.version() is None  # not connected
        a, b = socket.socketpair()
        new._poller, old._fd = make(a.fileno()), a.fileno()
        new._count = old._count = 3

        def agree(expected: int | None) -> None:
            assert new.version() == expected and old.version() == expected
        agree(3)
        b.send(b"x")
        agree(None)
        assert a.recv(10) == b"x"
        new._count = old._count = 4
        agree(4)
        b.close()
        agree(None)  # EOF pending
        new._poller, old._fd = None, None
        agree(None)
        a.close()


def test_listener_counts_notifications_and_reconnections_like_the_reference(pg_url: str) -> None:  # noqa: F811
    """On a real PostgreSQL, the listener and the reference on one channel: both count a notification, both are
    None or move on when their connection is terminated, and both count the reconnection."""
    import time
    import uuid

    from sidecar.ledger.postgres import _Listener

    channel = f"mw_test_{uuid.uuid4().hex[:8]}"
    url = f"{pg_url}?application_name={channel}"
    new, old = _Listener(url, channel, 2.0), ref._Listener(url, channel, 2.0)

    def settle(pred: Any) -> tuple[Any, Any]:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = (new.version(), old.version())
            if pred(*got):
                return got
            time.sleep(0.05)
        raise AssertionError((new.version(), old.version()))

    new.start()
    old.start()
    try:
        assert settle(lambda a, b: a == 1 and b == 1) == (1, 1)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_notify(%s, 'x')", (channel,))
            assert settle(lambda a, b: a == 2 and b == 2) == (2, 2)
            killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                                   (channel,)).fetchall()
            assert len(killed) == 2
        # each drops its caches (None) until it listens again, then counts the reconnection
        assert settle(lambda a, b: a is not None and a >= 3 and b is not None and b >= 3)
    finally:
        new.stop()
        old.stop()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(row_strategy, min_size=1, max_size=4), st.sampled_from(["valid", "revoked", "unknown", None]))
def test_one_id_reads_agree_with_the_reference(world: dict[str, Any], batch: list[Row], key: str | None) -> None:
    """A read of one id (the one-id statement, ``row_id = %s``) and of the same id twice or with an absent one
    (the array statement) answer as the reference, for stored rows with every field drawn, synchronous and
    asynchronous."""
    led = world["ledger"]
    collection = store(led, batch)
    key_id = world["key_ids"][key] if key else None

    async def scenario() -> None:
        try:
            for row in batch:
                for ids in ([row.row_id], [row.row_id, row.row_id], [row.row_id, "absent"], ["absent"]):
                    expected = await _outcome(ref.read_rows_async(led, "chroma", collection, ids, key_id))
                    assert expected[0] == "ok"
                    _same_outcome(await _outcome(led.read_rows_async("chroma", collection, ids, key_id)), expected)
                    _same_outcome(_outcome_sync(lambda: led.read_rows("chroma", collection, ids, key_id)), expected)
                    _same_outcome(_outcome_sync(lambda: ref.read_rows(led, "chroma", collection, ids, key_id)), expected)
        finally:
            await led.aclose()
    asyncio.run(scenario())
