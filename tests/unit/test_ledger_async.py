"""The PostgreSQL ledger's asynchronous hot-path reads (`PostgresLedger.authenticate_async`,
`read_rows_async`, reached through `sidecar.ledger.offloop`) on a real PostgreSQL: the same answers as the
synchronous calls, a revocation made through another ledger (another replica) seen on the very next call,
and a ledger that cannot answer denied with `LedgerUnavailable` (503). Every ledger and pool opened here is
closed by the fixture's finalizer (the suite shares one server's connection limit)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable, Iterator

import psycopg
import pytest

from sidecar.errors import LedgerUnavailable
from sidecar.governance import Row
from sidecar.ledger import offloop
from sidecar.ledger.postgres import PostgresLedger
from tests.pgutil import fresh_schema, pg_url  # noqa: F401  (fixture)

Opener = Callable[..., PostgresLedger]


@pytest.fixture
def opener(pg_url: str) -> Iterator[Opener]:  # noqa: F811
    """Opens ledgers on one fresh schema (`max_size` 2 unless told); all closed at the end."""
    schema = fresh_schema()
    opened: list[PostgresLedger] = []

    def open_(**options: Any) -> PostgresLedger:
        opened.append(PostgresLedger(pg_url, schema=schema, min_size=options.pop("min_size", 0),
                                     max_size=options.pop("max_size", 2), **options))
        return opened[-1]
    yield open_
    for ledger in opened:
        ledger.close()


def run(coro_fn: Callable[[], Any], *ledgers: PostgresLedger) -> Any:
    """Run `coro_fn()` in a fresh event loop, closing the ledgers' asynchronous pools in that loop."""
    async def main() -> Any:
        try:
            return await coro_fn()
        finally:
            for ledger in ledgers:
                await ledger.aclose()
    return asyncio.run(main())


def row(rid: str, owner: str, status: str = "active", **kw: Any) -> Row:
    return Row(backend="chroma", collection="c1", row_id=rid, tenant="t", fleet=owner.split("/")[1], owner=owner,
               scope=kw.pop("scope", "fleet"), writer=owner, created_at=1, status=status, **kw)


def seed(ledger: PostgresLedger) -> None:
    ledger.create_key("agent", "t", "red", "a", 2, roles=["analyst"])
    ledger.create_key("agent", "t", "blue", "b", 1)
    rows = [row("r1", "t/red/a", readers=("t/blue/b",), labels=("pii",)), row("r2", "t/blue/b", scope="agent"),
            row("r3", "t/ghost/g"), row("r4", "t/red/a")]
    assert ledger.reserve_rows(rows) == []
    ledger.activate_rows("chroma", "c1", ["r1", "r2", "r3", "r4"])
    ledger.tombstone("chroma", "c1", ["r4"], "t/red/a", "req")


def test_read_rows_async_matches_the_synchronous_reads(opener: Opener) -> None:
    ledger = opener()
    seed(ledger)
    ids = ["r1", "r2", "r3", "r4", "missing", "r1"]
    want_rows = ledger.get_rows("chroma", "c1", ids)
    want_owners = ledger.agent_entities({r.owner for r in want_rows.values()})
    assert set(want_rows) == {"r1", "r2", "r3", "r4"} and want_rows["r4"].status == "deleted"
    assert set(want_owners) == {"t/red/a", "t/blue/b"}  # t/ghost/g is no agent the ledger knows
    rows, owners, key_ok = run(lambda: ledger.read_rows_async("chroma", "c1", ids), ledger)
    assert rows == want_rows and owners == want_owners and key_ok is True
    # nothing asked for that exists: no rows, and the key test still answers
    rows, owners, key_ok = run(lambda: ledger.read_rows_async("chroma", "c1", ["nope"], "0" * 16), ledger)
    assert rows == {} and owners == {} and key_ok is False
    rows, owners, _ = run(lambda: ledger.read_rows_async("chroma", "other", ["r1"]), ledger)
    assert rows == {} and owners == {}


def test_authenticate_async_matches_authenticate(opener: Opener) -> None:
    ledger = opener()
    rec, key = ledger.create_key("agent", "t", "red", "a", 2, roles=["analyst"])
    _, admin = ledger.create_key("admin", "t", None, None, 0)
    _, operator = ledger.create_key("operator", None, None, None, 0)
    candidates = [key, admin, operator, key + "x", key.replace(rec.key_id, "0" * 16), "garbage", "mwk_.", ""]

    async def both() -> list[Any]:
        return [await ledger.authenticate_async(k) for k in candidates]
    got = run(both, ledger)
    assert got == [ledger.authenticate(k) for k in candidates]
    assert got[0] is not None and (got[0].tenant, got[0].fleet, got[0].agent, got[0].trust, got[0].roles) == \
        ("t", "red", "a", 2, ("analyst",))
    assert [p is None for p in got] == [False, False, False, True, True, True, True, True]


def test_revocation_through_another_replica_is_seen_on_the_next_call(opener: Opener) -> None:
    """Two ledgers on one database stand for two replicas; the async reads of one see the other's revoke
    on the call right after it commits, both in authenticate and in read_rows' key re-check."""
    a, b = opener(), opener()
    seed(a)
    rec, key = a.create_key("agent", "t", "red", "z", 1)

    async def scenario() -> list[Any]:
        out = [await offloop.authenticate(a, key), (await offloop.read_rows(a, "chroma", "c1", ["r1"], rec.key_id))[2]]
        assert b.revoke_key(rec.key_id)  # the other replica, synchronous (the CLI's path)
        out += [await offloop.authenticate(a, key), (await offloop.read_rows(a, "chroma", "c1", ["r1"], rec.key_id))[2]]
        return out
    before_p, before_ok, after_p, after_ok = run(scenario, a)
    assert before_p is not None and before_p.key_id == rec.key_id and before_ok is True
    assert after_p is None and after_ok is False


def test_a_busy_async_pool_raises_ledger_unavailable(opener: Opener, pg_url: str) -> None:  # noqa: F811
    """Pool of one connection, held by a read blocked on a lock: the next read gets no connection within the
    timeout (``PoolTimeout``) and is denied with `LedgerUnavailable`; nothing was read for it."""
    ledger = opener(max_size=1, timeout_s=1.0)
    _, key = ledger.create_key("agent", "t", "red", "a", 2)
    with psycopg.connect(pg_url, autocommit=False) as locker:
        locker.execute(f'SET search_path = "{ledger.schema}"')  # type: ignore[arg-type]
        locker.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")

        async def scenario() -> tuple[BaseException | None, Any]:
            first = asyncio.create_task(offloop.authenticate(ledger, key))
            await asyncio.sleep(0.3)  # `first` holds the only connection, waiting on the lock
            err: BaseException | None = None
            try:
                await offloop.read_rows(ledger, "chroma", "c1", ["r1"])
            except LedgerUnavailable as exc:
                err = exc
            locker.rollback()
            return err, await first
        err, first = run(scenario, ledger)
    assert isinstance(err, LedgerUnavailable) and err.status == 503 and "PoolTimeout" in str(err)
    assert first is not None  # the blocked call completes once the lock goes


def test_lost_connections_raise_ledger_unavailable_then_recover(opener: Opener, pg_url: str) -> None:  # noqa: F811
    ledger = opener(max_size=1, min_size=1, timeout_s=1.0)
    app_name = f"mw-async-{uuid.uuid4().hex[:8]}"
    ledger._conn_kwargs["application_name"] = app_name  # noqa: SLF001 (tell this pool's backends apart)
    _, key = ledger.create_key("agent", "t", "red", "a", 2)

    async def scenario() -> list[str]:
        assert await offloop.authenticate(ledger, key) is not None
        with psycopg.connect(pg_url, autocommit=True) as admin:
            killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                                   (app_name,)).fetchall()
        assert killed
        outcomes = []
        for _ in range(10):
            try:
                p = await offloop.authenticate(ledger, key)
                outcomes.append("ok" if p is not None else "none")
                break
            except LedgerUnavailable:
                outcomes.append("503")
                await asyncio.sleep(0.3)
        return outcomes
    outcomes = run(scenario, ledger)
    assert outcomes[-1] == "ok" and set(outcomes) <= {"ok", "503"}, outcomes


def test_async_pool_connections_are_closed(opener: Opener, pg_url: str) -> None:  # noqa: F811
    """`aclose` (and `close` after its loop ended) leave no connection of the asynchronous pool open."""
    app_name = f"mw-async-{uuid.uuid4().hex[:8]}"

    def count() -> int:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            r = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app_name,)).fetchone()
        return int(r[0]) if r else -1

    def settled_count() -> int:  # a closed connection's server process leaves pg_stat_activity shortly after
        deadline = time.monotonic() + 5
        while (n := count()) != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return n

    ledger = opener(min_size=0)
    ledger._conn_kwargs["application_name"] = app_name  # noqa: SLF001 (set after the sync pool connected)

    async def use() -> int:
        await ledger.read_rows_async("chroma", "c1", ["r1"])
        return count()
    assert run(use, ledger) >= 1
    assert settled_count() == 0

    async def use_no_close() -> None:  # the loop ends without aclose: close() drops the connections
        await ledger.read_rows_async("chroma", "c1", ["r1"])
    asyncio.run(use_no_close())
    ledger.close()
    assert settled_count() == 0


def test_warm_collection_reads_a_missing_collection_in_a_worker_thread(opener: Opener) -> None:
    """`Authorizer.warm_collection` fills the collections cache off the event loop (a worker thread) when the
    entry is missing, and does nothing when it is there; the handler's synchronous lookup then hits memory."""
    import threading

    from sidecar.ledger import CollectionRecord
    from sidecar.ledger.cache import CachingLedger
    from sidecar.stages.authorize import Authorizer

    raw = opener()
    raw.register_collection(CollectionRecord("chroma", "c1", "t", "db", "mem", "t/red/a", 1))
    threads: list[str] = []

    class Spy:
        blocking_io = True

        def __getattr__(self, name: str) -> Any:
            return getattr(raw, name)

        def get_collection(self, backend: str, collection_id: str) -> Any:
            threads.append(threading.current_thread().name)
            return raw.get_collection(backend, collection_id)

    cache = CachingLedger(Spy(), lambda: 1, ttl_s=60)
    authz = Authorizer(policy=None, ledger=cache)  # type: ignore[arg-type]

    async def scenario() -> None:
        assert not cache.cached_collection("chroma", "c1")
        await authz.warm_collection("chroma", "c1")
        assert cache.cached_collection("chroma", "c1")
        await authz.warm_collection("chroma", "c1")  # cached: no second read
    asyncio.run(scenario())
    assert len(threads) == 1 and threads[0] != threading.main_thread().name
    rec = cache.get_collection("chroma", "c1")
    assert rec is not None and rec.name == "mem" and len(threads) == 1
