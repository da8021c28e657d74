"""`forward.quoted_path` (the backend path of `Upstream.call`) is the former per-segment `quote` exactly:
the same text for every list of segments, the same exception for what `quote` refuses (a lone surrogate,
a segment that is neither str nor bytes); the old expression is kept here as the reference."""

from __future__ import annotations

import asyncio
import string
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.stages import forward
from sidecar.stages.forward import Upstream, quoted_path


def reference_path(segments: Any) -> str:
    """The path of `Upstream.call` before the fast path (commit 77354c9)."""
    return "/".join(quote(s, safe="") for s in segments)


def outcome(f: Any, segments: Any) -> tuple[str, Any]:
    try:
        return "ok", f(segments)
    except Exception as exc:  # the same type and message as the reference
        return "raised", (type(exc), str(exc))


UNRESERVED = string.ascii_letters + string.digits + "_.-~"
NEAR = UNRESERVED + "/%?#[]@!$&'()*+,;= \n\t:" + "\u00e9\u212a\u0131\u00df\ufb01\U0001f600\ud800\udfff\x00\x7f"
segment = st.one_of(
    st.text(alphabet=UNRESERVED, max_size=12),
    st.text(alphabet=NEAR, max_size=8),
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=6),  # every code point, surrogates too
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(segment, max_size=10))
@example([])
@example([""])
@example(["", ""])
@example(["api", "v2", "tenants", "default_tenant", "databases", "default_database", "collections",
          "3f1c2a9e-0c4b-4d8e-9a57-2a3b1c4d5e6f", "get"])
@example(["a/b"])
@example(["K"])  # KELVIN SIGN: not an ASCII letter
@example(["a\n"])
@example(["\ud800"])
@example(["ok", "\udfff"])
def test_quoted_path_is_the_per_segment_quote(segments: list[str]) -> None:
    assert outcome(quoted_path, segments) == outcome(reference_path, segments)


@pytest.mark.parametrize("segments", [
    [b"a b", "c"], ["a", b"b"], [b""], ["a", 1], [None], ["a", ["b"]], ("a", "b c"), ("x", "y"), (),
    ["a", bytearray(b"/")],
])
def test_other_segment_types_behave_as_quote(segments: Any) -> None:
    assert outcome(quoted_path, segments) == outcome(reference_path, segments)


def test_an_iterator_of_segments_is_quoted_as_before() -> None:
    assert quoted_path(iter(["a", "b c"])) == reference_path(iter(["a", "b c"])) == "a/b%20c"
    assert quoted_path(s for s in ["a", "b"]) == "a/b"


@pytest.mark.parametrize("segments", [["api", "v2", "heartbeat"], ["api", "v2", "tenants", "t 1", "x/y", "\u00e9"],
                                      ["api", "v2", "c", "id~1.2_-"]])
def test_upstream_call_sends_the_reference_path(segments: list[str]) -> None:
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(200, json={})

    async def call() -> None:
        up = Upstream("http://backend:8000/prefix", timeout_s=5, max_connections=1,
                      transport=httpx.MockTransport(handler))
        try:
            await up.call("GET", segments)
        finally:
            await up.close()

    asyncio.run(call())
    assert seen == [("/prefix/" + reference_path(segments)).encode()]


def test_the_fast_path_is_taken_for_plain_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(forward, "quote", lambda s, safe: calls.append(s) or quote(s, safe=safe))
    assert quoted_path(["api", "v2", "x-1"]) == "api/v2/x-1" and calls == []
    assert quoted_path(["api", "a b"]) == "api/a%20b" and calls == ["api", "a b"]
