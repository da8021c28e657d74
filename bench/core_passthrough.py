"""The sidecar's server core without governance: the floor of memwarden's own stack (a script, not a test).

`memwarden serve`'s HTTP stack — uvicorn with the httptools protocol on uvloop, the connection guards
of `sidecar.server.guarded_protocol`, no proxy-headers layer — in front of a bare ASGI app that does the
least any JSON-governing proxy must: read the client's body and parse it (orjson), send it to the backend
through the forward stage (`sidecar.stages.forward.Upstream`: the pooled HTTP/1.1 transport, its timeouts
and error mapping), parse the backend's answer and encode it as the pipeline's response, and write it as
the pipeline entry does: the same encoder (`sidecar.answer.answer_bytes`: the standard library's bytes,
orjson where provably the same), a request id, and the answer's two ASGI sends (head and body leave in one
write: `sidecar.server.CoalescingTransport`). No authentication, no Cedar, no ledger, no row checks, no decision log, no metrics.
`bench/overhead.py --core` puts it beside direct, `bench/passthrough.py` (one raw Python hop) and
memwarden: memwarden minus this core is what governance costs; this core minus the passthrough is what
the framework costs.

    .venv/bin/python bench/core_passthrough.py --listen 8082 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
import uvicorn

from sidecar.answer import answer_bytes
from sidecar.errors import MemwardenError, to_body
from sidecar.exchange import new_request_id
from sidecar.server import ConnectionLimits, guarded_protocol
from sidecar.stages.forward import Upstream


def app_for(upstream: Upstream) -> Any:

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            while scope["type"] == "lifespan":
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await upstream.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        segments = scope["path"].strip("/").split("/")
        try:
            status, body = 200, await upstream.call(scope["method"], segments,
                                                    json_body=orjson.loads(raw) if raw else None, idempotent=True)
        except MemwardenError as exc:
            status, body = exc.status, to_body(exc)
        try:
            payload = answer_bytes(body)
        except (ValueError, TypeError, RecursionError):
            status, payload = 500, b'{"error":"internal","message":"internal error"}'
        request_id = new_request_id().encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
            (b"x-request-id", request_id)]})
        await send({"type": "http.response.body", "body": payload})
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    ap.add_argument("--upstream", required=True, help="the backend's base URL, http://host:port")
    args = ap.parse_args()
    upstream = Upstream(args.upstream, timeout_s=30.0, max_connections=64)
    uvicorn.run(app_for(upstream), host="127.0.0.1", port=args.listen, log_level="warning", access_log=False,
                http=guarded_protocol(ConnectionLimits()), proxy_headers=False, server_header=False, lifespan="on")


if __name__ == "__main__":
    main()
