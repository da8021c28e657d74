"""`canonicalize.canonical_path`'s fast path (a path of unreserved characters only) gives the segments,
or the error, of the segment-by-segment decoding it skips."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.errors import BadRequest
from sidecar.stages import canonicalize as c


def reference(raw_path: bytes) -> object:
    """canonical_path as it was before the fast path (commit 2b0d32e), returning the error text."""
    try:
        try:
            path = raw_path.decode("ascii")
        except UnicodeDecodeError as exc:
            raise BadRequest("path must be ASCII (percent-encode other bytes)") from exc
        if not path.startswith("/") or c._CONTROL.search(path):
            raise BadRequest("path must start with '/' and contain no control characters")
        if "//" in path:
            raise BadRequest("empty path segments ('//') are not accepted")
        return [c._decode_segment(s) for s in path[1:].split("/")]
    except BadRequest as exc:
        return str(exc)


def fast(raw: bytes) -> object:
    try:
        return c.canonical_path(raw)
    except BadRequest as exc:
        return str(exc)


segment = st.one_of(st.sampled_from([".", "..", "", "a", "api", "v2", "%2e", "%2E%2E", "x;y", "%2F", "~", "-_."]),
                    st.text(alphabet="abcXYZ019._~-%2fF;:@!$", max_size=6))


@settings(max_examples=3000, deadline=None)
@given(st.lists(segment, min_size=1, max_size=6))
def test_fast_path_agrees_with_segment_decoding(segments: list[str]) -> None:
    raw = ("/" + "/".join(segments)).encode()
    assert fast(raw) == reference(raw)


def test_plain_paths() -> None:
    assert c.canonical_path(b"/api/v2/tenants/t-1/databases/d_2/collections/0b1c-9~x/query") == \
        ["api", "v2", "tenants", "t-1", "databases", "d_2", "collections", "0b1c-9~x", "query"]
    assert c.canonical_path(b"/a/") == ["a", ""]
    for raw in (b"/a/../b", b"/./a", b"/a/.."):
        try:
            c.canonical_path(raw)
        except BadRequest as exc:
            assert str(exc) == "dot segments are not accepted"
        else:
            raise AssertionError(raw)
