"""The thinnest Python HTTP/1.1 passthrough: the reference floor of one Python hop (a script, not a test).

A raw asyncio server; each client connection gets its own raw upstream connection, and every request
and response is relayed byte for byte (Content-Length or chunked framing), with no parsing beyond the
framing. No governance, no pooling, no timeouts: it measures what one Python hop costs.

    .venv/bin/python bench/passthrough.py --listen 8081 --upstream 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio


async def read_message(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 message (head and body) as bytes; raises IncompleteReadError at EOF."""
    head = await reader.readuntil(b"\r\n\r\n")
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return head + (await reader.readexactly(length) if length else b"")
    parts = [head]
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        parts += [size_line, await reader.readexactly(size + 2)]
        if size == 0:
            return b"".join(parts)


async def serve(upstream_host: str, upstream_port: int, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    up_r, up_w = await asyncio.open_connection(upstream_host, upstream_port)
    try:
        while True:
            up_w.write(await read_message(client_r))
            client_w.write(await read_message(up_r))
            await client_w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        up_w.close()
        client_w.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    ap.add_argument("--upstream", required=True, help="host:port")
    args = ap.parse_args()
    host, _, port = args.upstream.rpartition(":")

    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: serve(host, int(port), r, w), "127.0.0.1", args.listen)
        async with server:
            await server.serve_forever()

    try:
        import uvloop  # installed with uvicorn[standard]; the sidecar runs on it too

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


if __name__ == "__main__":
    main()
