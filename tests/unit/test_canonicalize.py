"""Canonicalisation: one decode, and rejection of every ambiguous form (docs/design.md §1 stage 1)."""

from __future__ import annotations

import pytest

from sidecar.errors import BadRequest, PayloadTooLarge, Unauthorized
from sidecar.stages import canonicalize as c


@pytest.mark.parametrize("raw,segments", [
    (b"/api/v2/heartbeat", ["api", "v2", "heartbeat"]),
    (b"/api/v2/tenants/a%20b", ["api", "v2", "tenants", "a b"]),
    (b"/api/v2/x/", ["api", "v2", "x", ""]),
    (b"/", [""]),
])
def test_accepts(raw: bytes, segments: list[str]) -> None:
    assert c.canonical_path(raw) == segments


@pytest.mark.parametrize("raw", [
    b"//api/v2", b"/api//v2", b"/api/./v2", b"/api/../v2", b"/t/../t2/x", b"/api/%2e%2e/v2", b"/api/%2E/v2",
    b"/api/a%2Fb", b"/api/a%2fb", b"/api/a%5Cb", b"/api/a%252Fb", b"/api/a;b", b"/api/..;/x", b"/api/a%3Bb",
    b"/api/a%23b", b"/api/a%3Fb", b"/api/a%00b", b"/api/a\x00b", b"/api/a%0Ab", b"/api/a%ff", b"/api/\xc3\xa9",
    b"api/v2", b"/api/a%7Fb",
])
def test_rejects_ambiguous_paths(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        c.canonical_path(raw)


def test_query() -> None:
    assert c.canonical_query(b"limit=10&offset=0") == {"limit": "10", "offset": "0"}
    assert c.canonical_query(b"a=x%20y") == {"a": "x y"}
    for bad in (b"user_id=a&user_id=b", b"_method=DELETE", b"a=%00", b"a=%ff"):
        with pytest.raises(BadRequest):
            c.canonical_query(bad)


def test_headers_strip_identity_and_reject_overrides() -> None:
    headers, stripped = c.canonical_headers([
        (b"X-Agent-ID", b"a"), (b"X-Tenant-ID", b"t"), (b"X-Forwarded-For", b"1.2.3.4"), (b"Forwarded", b"for=x"),
        (b"X-Original-URL", b"/admin"), (b"X-Envoy-Original-Path", b"/x"), (b"Content-Type", b"application/json"),
    ])
    assert set(headers) == {"content-type"}
    assert set(stripped) == {"x-agent-id", "x-tenant-id", "x-forwarded-for", "forwarded", "x-original-url", "x-envoy-original-path"}
    for bad in ([(b"X-HTTP-Method-Override", b"DELETE")], [(b"X-Method-Override", b"PUT")],
                [(b"Content-Length", b"5"), (b"Transfer-Encoding", b"chunked")],
                [(b"Content-Length", b"5"), (b"Content-Length", b"6")], [(b"X-A", b"a\x00b")],
                [(b"X-A", b"\xff\xfe")], [(b"X-\xc3\xa9", b"v")]):
        with pytest.raises(BadRequest):
            c.canonical_headers(bad)


def test_credentials() -> None:
    assert c.credential({"authorization": ["Bearer k1"]}) == "k1"
    assert c.credential({"x-api-key": ["k1"]}) == "k1"
    assert c.credential({"authorization": ["Bearer k1"], "x-api-key": ["k1"]}) == "k1"
    assert c.credential({}) is None
    for bad in ({"authorization": ["Bearer a", "Bearer b"]}, {"authorization": ["Bearer a"], "x-api-key": ["b"]},
                {"authorization": ["Basic abc"]}, {"x-api-key": ["a", "a"]}):
        with pytest.raises(Unauthorized):
            c.credential(bad)


def test_json_body() -> None:
    assert c.parse_json_body(b'{"a": {"b": [1, 2]}}', "application/json") == {"a": {"b": [1, 2]}}
    assert c.parse_json_body(b"", None) is None
    for bad in (b'{"a": 1, "a": 2}', b'{"x": {"a": 1, "a": 2}}', b'[{"a": 1, "a": 1}]', b"{bad", b'{"a": NaN}',
                b'{"a": Infinity}', b"\xff"):
        with pytest.raises(BadRequest):
            c.parse_json_body(bad, "application/json")
    with pytest.raises(BadRequest):
        c.parse_json_body(b"{}", "text/plain")


def test_length() -> None:
    c.check_length(["10"], 10)
    with pytest.raises(PayloadTooLarge):
        c.check_length(["11"], 10)
    with pytest.raises(BadRequest):
        c.check_length(["-1"], 10)


# -- request targets and JSON limits (hardening round 2) ----------------------------------------------

@pytest.mark.parametrize("target", [b"http://other/api/v2/x", b"*", b"example.com:443", b"/api/v2/x#frag",
                                    b"/api/v2/x?a=1#frag"])
def test_only_origin_form_targets_without_fragment(target: bytes) -> None:
    with pytest.raises(BadRequest):
        c.check_target(target)


def test_origin_form_targets_pass_and_unknown_targets_are_not_checked() -> None:
    c.check_target(b"/api/v2/x?a=1")
    c.check_target(None)  # a server that does not pass the raw target
    with pytest.raises(BadRequest):
        c.canonical_query(b"a=1#frag")  # h11 leaves the fragment in the query string


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_json_depth_limit_is_exact_and_deep_documents_never_recurse_out() -> None:
    assert c.parse_json_body(nested(32), None, max_depth=32) is not None
    for depth in (33, 5000, 200_000):
        with pytest.raises(BadRequest, match="MEMWARDEN_MAX_JSON_DEPTH"):
            c.parse_json_body(nested(depth), None, max_depth=32)


@pytest.mark.parametrize("body,names", [
    (b'{"x": 1e999}', "finite"), (b'{"x": -1e400}', "finite"), (b'{"x": NaN}', "NaN"), (b'{"x": -Infinity}', "Infinity"),
    (b'{"x": 9223372036854775808}', "64-bit"), (b'{"x": -9223372036854775809}', "64-bit"), (b'{"x": 1' + b"0" * 5000 + b"}", "64-bit"),
    (b'{"x": "\\ud800"}', "surrogate"), (b'{"\\udc00": 1}', "surrogate"), (b'["ok", "\\ud83d"]', "surrogate"),
])
def test_numbers_and_strings_json_cannot_carry_are_refused(body: bytes, names: str) -> None:
    with pytest.raises(BadRequest, match=names):
        c.parse_json_body(body, None)


def test_edge_values_that_are_valid_pass() -> None:
    value = c.parse_json_body(b'{"a": -9223372036854775808, "b": 9223372036854775807, "c": 1.7976931348623157e308,'
                                         b' "d": "\\ud83d\\ude00"}', None)
    assert value == {"a": -(2 ** 63), "b": 2 ** 63 - 1, "c": 1.7976931348623157e308, "d": "\U0001F600"}


def test_filter_size_counts_conditions_at_every_depth() -> None:
    c.check_filter_size({"$and": [{"k": {"$eq": 1}}] * 10}, "where", 64)
    with pytest.raises(BadRequest, match="MEMWARDEN_MAX_FILTER_CLAUSES"):
        c.check_filter_size({"$or": [{"k": {"$in": list(range(40))}}]}, "where", 32)
