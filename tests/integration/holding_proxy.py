"""A reverse proxy (uvicorn in a thread, 127.0.0.1) in front of a real backend that can hold one request: the first
request matching `hold(method, path_suffix)` is kept back — `arrived` is set when it comes in — until `release()`,
then forwarded. Everything else is forwarded at once. Used to land a second request while a first one is inside
its backend call, on real servers, without timing."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import uvicorn

from memwarden_eval.harness import free_port

_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive"}


class HoldingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.arrived = threading.Event()
        self._release = threading.Event()
        self._rule: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self.forwarded: list[tuple[str, str]] = []  # (method, path) of every request forwarded, in order
        config = uvicorn.Config(self._app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
                                interface="asgi3")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def start(self) -> "HoldingProxy":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("proxy did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._release.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def hold(self, method: str, path_suffix: str) -> None:
        """Hold the next request whose method is `method` and whose path ends with `path_suffix`."""
        with self._lock:
            self.arrived.clear()
            self._release.clear()
            self._rule = (method, path_suffix)

    def release(self) -> None:
        self._release.set()

    def _held(self, method: str, path: str) -> bool:
        with self._lock:
            if self._rule is not None and method == self._rule[0] and path.endswith(self._rule[1]):
                self._rule = None
                return True
            return False

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path = scope["method"], scope["path"]
        if self._held(method, path):
            self.arrived.set()
            await asyncio.to_thread(self._release.wait, 120)
        self.forwarded.append((method, path))
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k.lower() not in _HOP]
        url = self.upstream + scope.get("raw_path", path.encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
            r = await client.request(method, url, content=body, headers=headers)
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in r.headers.items()
               if k.lower().encode() not in _HOP and k.lower() != "content-encoding"]
        await send({"type": "http.response.start", "status": r.status_code, "headers": out})
        await send({"type": "http.response.body", "body": r.content})
