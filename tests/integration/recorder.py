"""A real HTTP backend (uvicorn in a thread, 127.0.0.1) that records every request it receives and
answers like a tiny Chroma: used to prove that rejected requests reach nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from memwarden_eval.harness import free_port


@dataclass
class Received:
    method: str
    raw_path: bytes
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class Recorder:
    """ASGI app: records, then answers 200 with a Chroma-shaped body for the route."""

    received: list[Received] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.received.append(Received(scope["method"], scope.get("raw_path", b""), scope.get("query_string", b""),
                                      list(scope["headers"]), body))
        path = scope["path"]
        if path.endswith("/get"):
            payload = b'{"ids":[],"documents":[],"metadatas":[],"included":["documents","metadatas"]}'
        elif path.endswith("/heartbeat"):
            payload = b'{"nanosecond heartbeat":1}'
        else:
            payload = b"true"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


class RecordingServer:
    def __init__(self) -> None:
        self.app = Recorder()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def start(self) -> "RecordingServer":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("recorder did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
