"""Which ledger calls block the event loop: `LoopSpy` wraps a real `PostgresLedger` and notes, for every
synchronous method call, whether it ran on the event loop's thread (a blocking network round trip there
stalls every request in flight) or in a worker thread (`sidecar.ledger.offloop.call`). `serve` runs a real
sidecar app (`create_app` with the spy as its ledger, lifespan included) in this process, driven through
httpx's ASGI transport on one event loop, so the loop's thread is known."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Awaitable, Callable, TypeVar

import httpx
import psycopg

T = TypeVar("T")

# Memory-only (no round trip) or lifecycle methods; coroutine methods never block the loop.
NOT_NETWORK = frozenset({"cache_version", "pool_stats", "close", "aclose", "open_async"})


class LoopSpy:
    """Delegates everything to `inner`; `calls` lists (method, ran on the loop thread) of each synchronous call."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.blocking_io = inner.blocking_io
        self.async_io = inner.async_io
        self.loop_thread: int | None = None
        self.calls: list[tuple[str, bool]] = []
        self.fail: set[str] = set()  # methods that raise psycopg.OperationalError (an unreachable ledger)
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or name in NOT_NETWORK or not callable(attr) or inspect.iscoroutinefunction(attr):
            return attr

        def spied(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append((name, threading.get_ident() == self.loop_thread))
            if name in self.fail:
                raise psycopg.OperationalError(f"{name}: connection lost (LoopSpy)")
            return attr(*args, **kwargs)
        return spied

    def on_loop(self) -> list[str]:
        """The synchronous ledger calls made on the event loop thread since the last `reset`."""
        with self._lock:
            return [name for name, on_loop in self.calls if on_loop]

    def off_loop(self) -> list[str]:
        with self._lock:
            return [name for name, on_loop in self.calls if not on_loop]

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()


def serve(app: Any, spy: LoopSpy | None, scenario: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    """Run `scenario(client)` against `app` (started with its lifespan) on a fresh event loop whose thread
    `spy` (if any) watches; returns what the scenario returns."""
    async def main() -> T:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sidecar",
                                         timeout=60) as client:
                if spy is not None:
                    spy.loop_thread = threading.get_ident()
                try:
                    return await scenario(client)
                finally:
                    if spy is not None:
                        spy.loop_thread = None
    return asyncio.run(main())
