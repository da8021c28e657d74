"""`Upstream`'s request head from a template per (method, body presence) (`forward.head_template`,
`head_from`) is byte for byte `Http1Transport.head` (kept, and still what `handle_async_request` sends):
Hypothesis over methods, header lists (framing headers to drop, no, one or several ``Content-Length``,
any case, non-ASCII bytes), targets and lengths (0 included); and `Upstream` sends the head it sent before."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.stages.forward import Upstream, head_from, head_template
from sidecar.stages.http1 import Http1Transport

names = st.one_of(st.sampled_from([b"Host", b"content-type", b"Content-Length", b"content-length", b"CONTENT-LENGTH",
                                   b"Transfer-Encoding", b"connection", b"Keep-Alive", b"expect", b"Upgrade",
                                   b"accept", b"Authorization", b"x-\xff"]), st.binary(min_size=1, max_size=6))
headers = st.lists(st.tuples(names, st.binary(max_size=8)), max_size=8)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "get"])


@settings(max_examples=1500, deadline=None)
@given(methods, headers, st.binary(max_size=20), st.integers(0, 2**40))
@example("GET", [(b"Host", b"h")], b"/", 0)
@example("POST", [(b"Host", b"h")], b"/", 0)
@example("POST", [(b"Content-Length", b"2"), (b"content-length", b"9")], b"/x", 17)
@example("DELETE", [(b"Content-Length", b"2")], b"/x", 0)
def test_head_from_its_template_is_the_transports_head(method: str, raw: Any, target: bytes, length: int) -> None:
    assert head_from(head_template(method, raw), method, target, length) == Http1Transport.head(method, target, raw, length)


@settings(max_examples=200, deadline=None)
@given(methods, st.booleans(), st.sampled_from([b"/api/v2/x", b"/"]), st.integers(0, 10**6),
       st.sampled_from([None, "tok"]), st.sampled_from([None, "X-API-Key", "Authorization"]))
def test_upstream_head_is_the_one_sent_before(method: str, has_body: bool, target: bytes, length: int,
                                              token: Any, header: Any) -> None:
    u = Upstream("http://127.0.0.1:1/prefix", timeout_s=1, max_connections=1, token=token, auth_header=header)
    for _ in range(2):  # the second time from the template
        assert u._head(method, target, has_body, length) == \
            Http1Transport.head(method, target, u._raw_headers(method, has_body), length)
