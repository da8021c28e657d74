"""Stage 6 — forward: one pooled async HTTP client to the backend; the only place httpx errors are mapped.

Client headers are never forwarded: every backend request carries only the sidecar's own headers
(content type and, if configured, the backend credential). Timeouts → `UpstreamTimeout` (504);
connection errors (a backend certificate that does not verify: a 502 saying so), 5xx, non-JSON bodies,
answers over the size cap (encoded, or decoded: `sidecar.stages.http1.decode_body`) → `UpstreamError` (502);
backend 4xx → `BackendClientError`.

Requests are `httpx.Request`s sent through an httpx transport — `sidecar.stages.http1.Http1Transport`
(pooled HTTP/1.1 with httptools; unit tests pass an `httpx.MockTransport`) — without httpx's Client layer. Backend bodies are encoded and decoded with
orjson; a backend answer orjson refuses (Python's ``NaN``, integers beyond 64 bits) is decoded again by
the standard library, so such a value only drops the row it is in (`sidecar.stages.authorize.well_formed_rows`)
as before. Client bodies are parsed by the strict parser of `sidecar.stages.canonicalize` (`parse_json_body`), never here.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import structlog

from sidecar.errors import BackendClientError, BackendServerError, UpstreamError, UpstreamTimeout
from sidecar.stages.http1 import (IDEMPOTENT_METHODS, Http1Transport, ResponseTooLarge, TLSVerificationFailed,
                                  decode_body)

IDEMPOTENT = {"memwarden.idempotent": True}
MAX_URL_LENGTH = 65536  # httpx refuses longer URLs (InvalidURL); such a call keeps going through httpx.Request

# The characters `urllib.parse.quote` always keeps (its ``_ALWAYS_SAFE``: ASCII letters, digits, ``_.-~``): a
# text made of them only is what ``quote(text, safe="")`` returns.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch


def quoted_path(segments: list[str]) -> str:
    """``"/".join(quote(s, safe="") for s in segments)``, without a `quote` call per segment when every
    character of every segment is one `quote` keeps (the segments of a Chroma path: names, UUIDs, verbs)."""
    if type(segments) is list:
        try:
            plain = _UNRESERVED("".join(segments))
        except TypeError:  # a segment that is not a str: `quote` decides (bytes are quoted, others refused)
            plain = None
        if plain is not None:
            return "/".join(segments)
    return "/".join(quote(s, safe="") for s in segments)


_NO_BODY_METHODS = ("GET", "HEAD", "DELETE", "OPTIONS")


def head_template(method: str, raw_headers: list[tuple[bytes, bytes]]) -> tuple[bytes, list[bytes], bool]:
    """`Http1Transport.head` of `method` and `raw_headers` with the target and the body length left open:
    (``method SP``, the header bytes split at each place a ``Content-Length`` value goes, whether there is
    one). `head_from` fills them in."""
    chunks: list[bytes] = []
    current = [b" HTTP/1.1\r\n"]
    for name, value in raw_headers:
        lower = name.lower()
        if lower in (b"transfer-encoding", b"connection", b"keep-alive", b"expect", b"upgrade"):
            continue
        if lower == b"content-length":
            current += [name, b": "]
            chunks.append(b"".join(current))
            current = [b"\r\n"]
            continue
        current += [name, b": ", value, b"\r\n"]
    chunks.append(b"".join(current))
    return method.encode() + b" ", chunks, len(chunks) > 1


def head_from(template: tuple[bytes, list[bytes], bool], method: str, target: bytes, length: int) -> bytes:
    """``Http1Transport.head(method, target, raw_headers, length)`` from ``head_template(method, raw_headers)``."""
    line, chunks, has_length = template
    if has_length:
        tail = str(length).encode().join(chunks)
    elif length or method not in _NO_BODY_METHODS:
        tail = chunks[0] + b"Content-Length: %d\r\n" % length
    else:
        tail = chunks[0]
    return b"".join((line, target, tail, b"\r\n"))


def encode(value: Any) -> bytes:
    """JSON bytes of `value` (orjson; the standard library for what orjson refuses, e.g. integers
    beyond 64 bits). orjson writes a non-finite float as ``null``; none reaches here, since client
    bodies are parsed strictly (non-finite numbers are 400) and the sidecar adds none."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def decode(content: bytes) -> Any:
    """The JSON value of a backend body (orjson; the standard library for what orjson refuses).
    Raises ValueError or RecursionError when it is not JSON."""
    return decode_exact(content)[0]


def decode_exact(content: bytes) -> tuple[Any, bool]:
    """(`decode(content)`, whether orjson decoded it). A value orjson decoded holds only its exact types
    (dict with str keys, list, str, int, float, bool, None), finite floats, and strings and keys that are
    Unicode scalar values (it refuses NaN, infinities, ``1e999`` and lone surrogates, escaped or not), so
    of `sidecar.stages.canonicalize.well_formed`'s rules only the nesting depth is left to check
    (`sidecar.stages.canonicalize.nests_within`). Raises what `decode` raises."""
    try:
        return orjson.loads(content), True
    except orjson.JSONDecodeError:
        return json.loads(content), False


class Upstream:
    """Pooled client for one backend base URL. `call` returns the parsed JSON body of a 2xx answer."""

    def __init__(self, base_url: str, *, timeout_s: float, max_connections: int,
                 auth_header: str | None = None, token: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 max_response_bytes: int = 64 * 1024 * 1024, ssl_context: ssl.SSLContext | None = None) -> None:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if token:
            headers[auth_header or "Authorization"] = f"Bearer {token}" if (auth_header or "Authorization").lower() == "authorization" else token
        # httpx's request and response types and its transport interface, without its Client layer (URL
        # merging, cookie jar, auth and redirect machinery: ~1 ms per call on this machine, more than the
        # transport itself): the backend is one origin, redirects are never followed (3xx is 502), and
        # backend cookies are never kept. Idle connections are dropped after 2 s, below uvicorn's default
        # keep-alive timeout (5 s, the Mem0 REST server's), so a request rarely takes a connection the
        # backend is closing (and a read-only one is re-sent if it does, `Http1Transport`).
        self._transport = transport or Http1Transport(max_connections=max_connections, keepalive_expiry=2.0,
                                                      max_response_bytes=max_response_bytes, ssl_context=ssl_context)
        self._cap = max_response_bytes
        base = httpx.URL(base_url.rstrip("/") + "/")
        self._origin = f"{base.scheme}://{base.netloc.decode('ascii')}"
        self._prefix = base.raw_path.decode("ascii").rstrip("/")
        self._headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self._timeout = httpx.Timeout(timeout_s).as_dict()
        self.last_latency_us = 0
        # Our own transport is called without httpx's Request/Response objects (`Http1Transport.send`),
        # with the headers httpx would have sent (taken once per method and body presence from a real
        # `httpx.Request`) and the target it would have sent (the re-encoded path: unreserved characters
        # and percent-escapes only, so httpx would not change it — except for dot segments, which it
        # removes: those, query parameters and URLs over httpx's length limit go through `httpx.Request`).
        # A response with a Content-Encoding is decoded by `decode_body`, to at most the response cap. Any other
        # transport (tests' `httpx.MockTransport`) gets `httpx.Request`s.
        self._fast = self._transport if type(self._transport) is Http1Transport and base.scheme in ("http", "https") \
            else None
        self._tls = base.scheme == "https"
        self._host, self._port = base.host, base.port or (443 if self._tls else 80)
        self._header_sets: dict[tuple[str, bool], list[tuple[bytes, bytes]]] = {}
        self._head_templates: dict[tuple[str, bool], tuple[bytes, list[bytes], bool]] = {}

    def _raw_headers(self, method: str, has_body: bool) -> list[tuple[bytes, bytes]]:
        key = (method, has_body)
        raw = self._header_sets.get(key)
        if raw is None:
            raw = self._header_sets[key] = httpx.Request(method, self._origin + "/", headers=self._headers,
                                                         content=b"{}" if has_body else None).headers.raw
        return raw

    def _head(self, method: str, target: bytes, has_body: bool, length: int) -> bytes:
        """``Http1Transport.head(method, target, self._raw_headers(method, has_body), length)``, from a template
        made once per (method, body presence)."""
        key = (method, has_body)
        template = self._head_templates.get(key)
        if template is None:
            template = self._head_templates[key] = head_template(method, self._raw_headers(method, has_body))
        return head_from(template, method, target, length)

    async def close(self) -> None:
        await self._transport.aclose()

    async def _read(self, response: httpx.Response) -> bytes:
        """The body of `response` from a transport other than the hot path's, decoded (`decode_body`) under the
        response cap: read as received (``aiter_raw``), at most the cap, then decoded. A response the transport
        already read (`httpx.Response` built with ``content=``, as tests' `httpx.MockTransport` handlers do) was
        decoded by httpx when it was built; only its size is checked. Raises `ResponseTooLarge` and the errors of
        `decode_body`."""
        cap = self._cap
        if response.is_stream_consumed:
            body = response.content
            if len(body) > cap:
                raise ResponseTooLarge(f"the backend's answer is over the response cap of {cap} bytes "
                                       "(MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES)")
            return body
        parts: list[bytes] = []
        size = 0
        async for part in response.aiter_raw():
            size += len(part)
            if size > cap:
                raise ResponseTooLarge(f"the backend's answer is over the response cap of {cap} bytes "
                                       "(MEMWARDEN_BACKEND_MAX_RESPONSE_BYTES)")
            parts.append(part)
        return decode_body(response.headers.raw, b"".join(parts), cap)

    async def call(self, method: str, segments: list[str], *, json_body: Any = None,
                   params: dict[str, str] | None = None, idempotent: bool = False,
                   exact: list[bool] | None = None) -> Any:
        """Send one request; `segments` are re-encoded (RFC 3986 unreserved kept) into the path.
        `idempotent`: the request changes nothing in the backend (a read-only POST), so the transport
        may send it again on a fresh connection when a pooled one turns out closed by the backend.
        `exact`: a list to which, once the answer is decoded, whether orjson decoded it is appended
        (`decode_exact`; nothing is appended when the call raises or the body is empty).

        Returns the decoded JSON (any JSON value). Raises `UpstreamTimeout`, `UpstreamError` or
        `BackendClientError` (status and the backend's error text).
        """
        path = self._prefix + "/" + quoted_path(segments)
        if params:
            path += "?" + str(httpx.QueryParams(params))
        content = None if json_body is None else encode(json_body)
        started = time.perf_counter_ns()
        try:
            if self._fast is not None and not params and "." not in segments and ".." not in segments \
                    and len(self._origin) + len(path) <= MAX_URL_LENGTH:
                # The hot path: the bytes `httpx.Request` would have sent, without building it or a Response.
                head = self._head(method, path.encode("ascii"), content is not None, len(content or b""))
                status, headers, body = await self._fast.send(
                    method, head, content or b"", self._timeout,
                    idempotent or method.encode() in IDEMPOTENT_METHODS, self._host, self._port, tls=self._tls)
                if any(name.lower() == b"content-encoding" for name, _ in headers):
                    body = decode_body(headers, body, self._cap)
            else:
                extensions: dict[str, Any] = {"timeout": self._timeout}
                if idempotent:
                    extensions.update(IDEMPOTENT)
                request = httpx.Request(method, self._origin + path, headers=self._headers, content=content,
                                        extensions=extensions)
                response = await self._transport.handle_async_request(request)
                try:
                    status, body = response.status_code, await self._read(response)
                finally:
                    await response.aclose()
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("backend timed out") from exc
        except ResponseTooLarge as exc:
            raise UpstreamError(f"backend answer too large: {exc}") from exc
        except TLSVerificationFailed as exc:
            structlog.get_logger("memwarden.forward").warning(
                "backend_tls_verification_failed", backend=self._origin, reason=exc.reason)
            raise UpstreamError("backend TLS verification failed: its certificate is not trusted "
                                "(MEMWARDEN_BACKEND_CA_BUNDLE) or does not name the backend URL's host") from exc
        except httpx.DecodingError as exc:
            raise UpstreamError(f"backend answer not decodable: {exc}") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError("backend unreachable") from exc
        finally:
            self.last_latency_us = (time.perf_counter_ns() - started) // 1000
        if status >= 500:
            raise BackendServerError(status)
        try:
            payload, by_orjson = decode_exact(body) if body else (None, False)
        except (ValueError, RecursionError) as exc:
            raise UpstreamError("backend answered a non-JSON body") from exc
        if 400 <= status < 500:
            # The status is kept, the backend's text never: it may quote stored content (a row the caller may not
            # read, a document) or another tenant's names.
            raise BackendClientError(status, f"the backend rejected the request ({status})")
        if status >= 300:
            raise UpstreamError(f"backend answered {status}")
        if exact is not None and body:
            exact.append(by_orjson)
        return payload
