"""Stage 1 — canonicalize: decode the request exactly once and reject ambiguity before any decision.

Rejections (400 unless stated): ``//``, ``.``/``..`` segments, encoded ``/ \\ . %`` (incl. double
encoding) or ``; ? #`` inside a segment, ``;`` path parameters, control characters and invalid UTF-8
in the path, query, header names or values, a request target that is not origin-form (absolute-form
``http://host/…``, authority- or asterisk-form) or carries a ``#fragment``, method-override
headers/parameters, repeated query parameters, ``Content-Length`` with ``Transfer-Encoding`` or
conflicting lengths; JSON bodies with duplicate keys at any depth, non-finite numbers (``NaN``,
``Infinity``, ``1e999``), integers outside the signed 64-bit range, lone UTF-16 surrogates in strings
or keys, or nesting deeper than the limit; bodies over the limit → 413. A body is parsed by orjson where
that is certain to give the strict standard-library parser's value, else by that parser (`parse_json_body`).
Client identity headers are stripped (never used). Sources: RFC 3986 §3.3 and §6.2.2; RFC 9112 §3.2 and §6.3; RFC 9110 §7.1;
RFC 8259 §6–8 (numbers, strings); advisories for Envoy (CVE-2019-9901 path normalisation), Istio and
OPA path-confusion classes.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson

from sidecar.errors import BadRequest, PayloadTooLarge, Unauthorized

METHOD_OVERRIDE_HEADERS = {"x-http-method-override", "x-http-method", "x-method-override"}
METHOD_OVERRIDE_PARAMS = {"_method"}
# Stripped from every request and never read: identity and routing must come from the sidecar only.
IDENTITY_HEADER_PREFIXES = ("x-forwarded-", "x-envoy-", "x-memwarden-")  # all begin with "x" (`canonical_headers`)
IDENTITY_HEADERS = {
    "x-agent-id", "x-tenant-id", "x-user-id", "x-fleet-id", "x-trust", "x-real-ip", "forwarded",
    "x-original-url", "x-rewrite-url", "x-original-uri", "x-chroma-token",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SEGMENT_FORBIDDEN = set("/\\;?#%")
_PLAIN_PATH = re.compile(r"(?:/[A-Za-z0-9._~-]*)+")  # RFC 3986 unreserved characters between slashes
_PLAIN_PATH_BYTES = b"/ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-"  # the same, as bytes


def _decode_segment(raw: str) -> str:
    if ";" in raw:
        raise BadRequest("path parameters (';') are not accepted")
    try:
        decoded = unquote_to_bytes(raw).decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise BadRequest("path is not valid UTF-8") from exc
    if any(c in _SEGMENT_FORBIDDEN for c in decoded) or _CONTROL.search(decoded):
        raise BadRequest("path segment contains an encoded separator or control character")
    if decoded in (".", ".."):
        raise BadRequest("dot segments are not accepted")
    return decoded


def canonical_path(raw_path: bytes) -> list[str]:
    """Split and decode a raw request path into segments. Raises `BadRequest` on any ambiguity.

    ``b"/api/v2/x%20y"`` → ``["api", "v2", "x y"]``; a trailing slash yields a final empty segment
    (which no route matches).

    A path of RFC 3986 unreserved characters and slashes only, starting with one, is split as it is (each
    segment decodes to itself: no percent sign, control character or non-ASCII byte), found by deleting
    those bytes (``bytes.translate``) instead of a regular expression; every other path, and one with
    ``//`` or a dot segment, is answered by `_decoded_path` (the same segments or the same error)."""
    if type(raw_path) is bytes and raw_path[:1] == b"/" and not raw_path.translate(None, _PLAIN_PATH_BYTES) \
            and b"//" not in raw_path and b"/." not in raw_path:  # no "//", no segment starting with "."
        return raw_path[1:].decode("ascii").split("/")
    return _decoded_path(raw_path)


def _decoded_path(raw_path: bytes) -> list[str]:
    """`canonical_path` of any path: decoded, checked, split and every segment decoded (`_decode_segment`)
    unless it is plain (`_PLAIN_PATH`)."""
    try:
        path = raw_path.decode("ascii")
    except UnicodeDecodeError as exc:
        raise BadRequest("path must be ASCII (percent-encode other bytes)") from exc
    if not path.startswith("/") or _CONTROL.search(path):
        raise BadRequest("path must start with '/' and contain no control characters")
    if "//" in path:
        raise BadRequest("empty path segments ('//') are not accepted")
    raw_segments = path[1:].split("/")
    if _PLAIN_PATH.fullmatch(path):  # unreserved characters only: each segment decodes to itself
        for s in raw_segments:
            if s in (".", ".."):
                raise BadRequest("dot segments are not accepted")
        return raw_segments
    return [_decode_segment(s) for s in raw_segments]


def check_target(target: bytes | None) -> None:
    """The raw request target as the client sent it (``scope["extensions"]["memwarden"]["target"]``,
    set by `sidecar.server`; None when the server does not pass it). Raises `BadRequest` unless it is
    origin-form (``/path[?query]``) without a fragment: uvicorn would hand the application only the
    path of ``GET http://other/api/...`` and drop ``#...``, so what is decided would not be what was sent."""
    if target is None:
        return
    if not target.startswith(b"/"):
        raise BadRequest("request target must be origin-form ('/path?query'); absolute-form and other forms are not accepted")
    if b"#" in target:
        raise BadRequest("request target must not contain a fragment ('#')")


def canonical_query(query_string: bytes) -> dict[str, str]:
    """Parse a query string into unique scalar parameters. Raises `BadRequest` on repeats or bad bytes."""
    if not query_string:
        return {}
    try:
        text = query_string.decode("ascii")
    except UnicodeDecodeError as exc:
        raise BadRequest("query string must be ASCII") from exc
    if "#" in text:
        raise BadRequest("request target must not contain a fragment ('#')")
    out: dict[str, str] = {}
    for part in text.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        try:
            name = unquote_to_bytes(name.replace("+", " ")).decode("utf-8")
            value = unquote_to_bytes(value.replace("+", " ")).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest("query parameter is not valid UTF-8") from exc
        if _CONTROL.search(name) or _CONTROL.search(value):
            raise BadRequest("query parameter contains a control character")
        if name in METHOD_OVERRIDE_PARAMS:
            raise BadRequest("method override parameters are not accepted")
        if name in out:
            raise BadRequest(f"query parameter {name!r} is repeated")
        out[name] = value
    return out


_CONTROL_BYTES = re.compile(rb"[\x00-\x1f\x7f]")
_CONTROL_BYTES_BUT_TAB = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def canonical_headers(raw_headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, list[str]], list[str]]:
    """Validate headers; return (name → values, stripped identity header names).

    Raises `BadRequest` for control characters, method overrides or conflicting framing headers.

    Each name and value is decoded (ASCII, UTF-8) and must be printable (`str.isprintable`: false for
    U+0000–U+001F and U+007F, as for some other characters); the first header that does not decode or
    is not printable — a control character, a tab, a non-printable character the reference accepts — hands
    the whole list to `_reference_headers`, which answers (the same error for the same first header, or
    the same result). A method override before it is refused here, as the reference refuses it there."""
    headers: dict[str, list[str]] = {}
    stripped: list[str] = []
    special = _SPECIAL_HEADERS
    try:
        for raw_name, raw_value in raw_headers:
            # UTF-8 (the default: no encoding name to look up) and ASCII-only is what decoding as ASCII accepts
            name = raw_name.decode().lower()
            value = raw_value.decode()
            if not (name.isascii() and name.isprintable() and value.isprintable()):
                return _reference_headers(raw_headers)
            kind = special.get(name)
            if kind is None and (name[:1] != "x" or not name.startswith(IDENTITY_HEADER_PREFIXES)):
                values = headers.get(name)
                if values is None:
                    headers[name] = [value]
                else:
                    values.append(value)
            elif kind is _OVERRIDE:
                raise BadRequest("method override headers are not accepted")
            else:
                stripped.append(name)
    except (UnicodeDecodeError, AttributeError, TypeError, ValueError):  # not bytes pairs: the reference says
        return _reference_headers(raw_headers)
    return _framing_checked(headers), stripped


_OVERRIDE, _IDENTITY = "override", "identity"
# Every header name `canonical_headers` does not keep as it is, by what it does with it (one look-up).
_SPECIAL_HEADERS = {**{n: _IDENTITY for n in IDENTITY_HEADERS}, **{n: _OVERRIDE for n in METHOD_OVERRIDE_HEADERS}}


def _framing_checked(headers: dict[str, list[str]]) -> dict[str, list[str]]:
    lengths = headers.get("content-length", [])
    if lengths and "transfer-encoding" in headers:
        raise BadRequest("Content-Length together with Transfer-Encoding is not accepted")
    if len(lengths) > 1 and len({v.strip() for v in lengths}) > 1:
        raise BadRequest("conflicting Content-Length headers")
    return headers


def _reference_headers(raw_headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, list[str]], list[str]]:
    """`canonical_headers` one header at a time (each decoded, then searched for control characters):
    the reference of its fast path, and the path of every header list that fails it."""
    headers: dict[str, list[str]] = {}
    stripped: list[str] = []
    for raw_name, raw_value in raw_headers:
        try:
            name = raw_name.decode("ascii").lower()
            value = raw_value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest("header name is not ASCII or header value is not UTF-8") from exc
        if _CONTROL.search(name) or _CONTROL.search(value.replace("\t", " ")):
            raise BadRequest("header contains a control character")
        if name in METHOD_OVERRIDE_HEADERS:
            raise BadRequest("method override headers are not accepted")
        if name in IDENTITY_HEADERS or name.startswith(IDENTITY_HEADER_PREFIXES):
            stripped.append(name)
            continue
        headers.setdefault(name, []).append(value)
    lengths = headers.get("content-length", [])
    if lengths and "transfer-encoding" in headers:
        raise BadRequest("Content-Length together with Transfer-Encoding is not accepted")
    if len({v.strip() for v in lengths}) > 1:
        raise BadRequest("conflicting Content-Length headers")
    return headers, stripped


def credential(headers: dict[str, list[str]]) -> str | None:
    """The single API key of the request (``Authorization: Bearer`` or ``X-API-Key``).

    Raises `Unauthorized` when more than one credential is present and they differ, or the
    Authorization scheme is not Bearer. Returns None when there is none.
    """
    api = headers.get("x-api-key")
    if api is not None and len(api) == 1 and "authorization" not in headers:  # one X-API-Key, nothing else
        return api[0].strip()
    auth = headers.get("authorization", [])
    api = headers.get("x-api-key", [])
    if len(auth) > 1 or len(api) > 1:
        raise Unauthorized("more than one credential")
    found: list[str] = []
    if auth:
        scheme, _, token = auth[0].strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must be 'Bearer <key>'")
        found.append(token.strip())
    if api:
        found.append(api[0].strip())
    if len(set(found)) > 1:
        raise Unauthorized("more than one credential")
    return found[0] if found else None


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise BadRequest(f"duplicate JSON key {key!r}")
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"non-finite JSON number {name} is not accepted")


INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _int64(text: str) -> int:
    if len(text) > 20:
        raise BadRequest(f"JSON integer {text[:24]}... is outside the signed 64-bit range")
    value = int(text)
    if not INT64[0] <= value <= INT64[1]:
        raise BadRequest(f"JSON integer {text} is outside the signed 64-bit range")
    return value


def _check_tree(value: Any, max_depth: int) -> None:
    """Depth of nested arrays/objects at most `max_depth`; no lone surrogate in any string or key.
    Iterative, so a deep document cannot exhaust the stack. Raises `BadRequest` naming the limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _no_surrogates(item)
            continue
        if isinstance(item, float) and not math.isfinite(item):
            raise BadRequest("JSON number out of range (not a finite 64-bit float, e.g. 1e999)")
        if not isinstance(item, (dict, list)):
            continue
        if depth > max_depth:
            raise BadRequest(f"JSON body nests deeper than the limit of {max_depth} levels (MEMWARDEN_MAX_JSON_DEPTH)")
        if isinstance(item, dict):
            for key, child in item.items():
                _no_surrogates(key)
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in item)


_FINITE = math.isfinite
_NO_CHECK = frozenset({int, bool, type(None)})


def _valid_tree(value: Any, max_depth: int) -> bool:
    """Whether `_check_tree` would accept `value` (same rules, any visiting order): containers are
    walked, scalars are checked where they are met (a long list of floats in bulk, ``map(math.isfinite)``),
    and every string and key is collected and encoded once (a lone surrogate fails the UTF-8 encoding
    of the joined text exactly when it fails the encoding of its own string: `str` never pairs code
    points). The fast path of `_check_tree` and `well_formed`; a refused value is walked again by
    `_check_tree` in its own order, so the error named is unchanged."""
    strings: list[str] = []
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        t = type(item)
        if t is dict:
            strings.extend(item)
            children: Any = item.values()
        elif t is list:
            children = item
            if len(item) > 8:
                types = set(map(type, item))
                if types == {float}:
                    if depth > max_depth or not all(map(_FINITE, item)):
                        return False
                    continue
                if types == {str}:
                    if depth > max_depth:
                        return False
                    strings.extend(item)
                    continue
                if types == {dict}:  # a column of objects (a backend's metadatas): each walked here, not stacked
                    d = depth + 1
                    if d > max_depth:  # the list, or the objects in it, too deep
                        return False
                    d += 1
                    for obj in item:
                        strings.extend(obj)
                        for child in obj.values():
                            t = type(child)
                            if t is str:
                                strings.append(child)
                            elif t is float:
                                if not _FINITE(child):
                                    return False
                            elif t not in _NO_CHECK:
                                stack.append((child, d))
                    continue
        elif t is str:
            strings.append(item)
            continue
        elif t is float:
            if not _FINITE(item):
                return False
            continue
        elif t in _NO_CHECK:
            continue
        else:  # subclasses and other types: the reference rules, in the reference walk
            try:
                _check_tree(item, max_depth - depth + 1)
            except BadRequest:
                return False
            continue
        if depth > max_depth:
            return False
        d = depth + 1
        for child in children:
            t = type(child)
            if t is str:
                strings.append(child)
            elif t is float:
                if not _FINITE(child):
                    return False
            elif t not in _NO_CHECK:
                stack.append((child, d))
    try:
        "".join(strings).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_surrogates(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest("JSON string contains a lone UTF-16 surrogate (not a Unicode scalar value)") from exc


# The fast path of `parse_json_body` (orjson), used only where it is certain to give what the reference
# parser (the standard library's, with the hooks above) gives. Every string token of a valid JSON text, in
# order: the group is ':' (with any whitespace before it) exactly when the token is an object key. The
# pattern matches at the opening quote of every string, so the scan never starts inside one.
_STRING_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?', re.S)
_INT64_MAX = 2 ** 63 - 1
# orjson holds an integer token in -2**63 .. 2**64-1 as an int and any other one as a float, whose magnitude
# is then at least 2**63; a float below this bound therefore came from a number token with a fraction or
# an exponent, as in the reference parser. Comparisons with it also refuse infinities and NaN.
_FLOAT_BOUND = 2.0 ** 63
_FAST_MAX_DEPTH = 256  # deeper limits: the reference parser only (its recursion limit decides near 1000)
# `math.hypot` of a list of numbers is its Euclidean norm, at least the largest |x| (which it finds exactly,
# in doubles; ints are converted correctly rounded) and computed to within an ulp or so; NaN gives NaN and
# an infinity inf. A norm below half `_FLOAT_BOUND` therefore proves every float finite and below the bound
# and every int in the signed 64-bit range, with a factor-2 margin for the rounding; any other norm, or an
# exception, only sends the list to the summed bound after it.
_hypot = math.hypot
_NORM_BOUND = _FLOAT_BOUND / 2


def _fast_members(value: Any, max_depth: int) -> int:
    """For a value orjson parsed: -1 unless the reference rules hold (nesting at most `max_depth`; ints in
    the signed 64-bit range; floats finite and below `_FLOAT_BOUND` in magnitude; no lone surrogate in a
    string or key; only the types orjson makes), else the number of object members in the tree."""
    members = 0
    strings: list[str] = []
    stack: list[tuple[Any, int]] = [([value], 0)]
    bound = _FLOAT_BOUND
    while stack:
        item, depth = stack.pop()
        if type(item) is dict:
            members += len(item)
            strings.extend(item)
            children: Any = item.values()
        else:  # a list
            children = item
            if len(item) > 8:
                # Numbers only (no str, None or container: hypot refuses those): the Euclidean norm, in C
                # without an object per element, bounds every |x| (below).
                try:
                    norm = _hypot(*item)
                except (TypeError, OverflowError):
                    norm = _NORM_BOUND
                if norm < _NORM_BOUND:
                    if depth > max_depth:
                        return -1
                    continue
                try:  # numbers only (no str, None or container: abs refuses those): one bound for all
                    total = sum(map(abs, item))
                except (TypeError, OverflowError):
                    total = None
                if total is not None:
                    # Every partial sum of non-negative terms is at least each term added so far (rounding is
                    # monotone; an exact int sum while all are ints), so the total is at least the largest |x|:
                    # below the bound, every float is finite and below it, every int is in the signed 64-bit
                    # range (-2**63 itself is refused here and checked by the reference). NaN and inf fail.
                    # A total that rounds up to the bound only sends the text to the reference parser.
                    if depth > max_depth or not total < bound:
                        return -1
                    continue
                if set(map(type, item)) == {str}:
                    if depth > max_depth:
                        return -1
                    strings.extend(item)
                    continue
        if depth > max_depth:
            return -1
        d = depth + 1
        for child in children:
            t = type(child)
            if t is str:
                strings.append(child)
            elif t is float:
                if not -bound < child < bound:
                    return -1
            elif t is int:
                if child > _INT64_MAX:
                    return -1
            elif t is dict or t is list:
                stack.append((child, d))
            elif child is not None and t is not bool:
                return -1
    try:
        "".join(strings).encode("utf-8")
    except UnicodeEncodeError:
        return -1
    return members


def _fast_parse(text: str, max_depth: int) -> tuple[bool, Any]:
    """(True, value) when orjson parses `text` and the reference parser would give an equal value (same
    types, same floats); (False, None) on any doubt. Duplicate keys: orjson keeps the last value, so the
    object members in the tree are counted against the colons in the text, and where those are more (a
    colon in a string, or a collapsed key) against its key tokens; fewer members means one collapsed."""
    if max_depth > _FAST_MAX_DEPTH:
        return False, None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, None
    members = _fast_members(value, max_depth)
    if members < 0:
        return False, None
    # Every ':' of a JSON text is a member's name separator (one per key token, a collapsed duplicate's
    # included) or inside a string, so the colons number at least the key tokens, which number at least the
    # members orjson kept: as many colons as members proves no key collapsed (and none in a string).
    if members and text.count(":") != members:
        tokens = _STRING_TOKEN.findall(text)
        if len(tokens) - tokens.count("") != members:
            return False, None
    return True, value


def parse_json_body(body: bytes, content_type: str | None, max_depth: int = 32) -> Any:
    """Parse a JSON body strictly: UTF-8; no duplicate keys; numbers finite 64-bit floats or signed
    64-bit integers; strings and keys Unicode scalar values (no lone surrogate); nesting at most
    `max_depth` arrays/objects. Empty body → None. Raises `BadRequest` naming what was refused.

    orjson parses first (`_fast_parse`); whatever it refuses or leaves in doubt is parsed by the
    reference (the standard library with strict hooks), which gives the value or the error."""
    if not body:
        return None
    if content_type is not None and "json" not in content_type.lower():
        raise BadRequest("request body must be application/json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("JSON body is not valid UTF-8") from exc
    ok, value = _fast_parse(text, max_depth)
    if ok:
        return value
    return _reference_parse(text, max_depth)


def _reference_parse(text: str, max_depth: int) -> Any:
    """The reference parser of `parse_json_body` for decoded `text`. Raises `BadRequest`."""
    try:
        value = json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant,
                           parse_int=_int64)
    except BadRequest:
        raise
    except RecursionError as exc:  # deeper than the interpreter's recursion limit
        raise BadRequest(f"JSON body nests deeper than the limit of {max_depth} levels (MEMWARDEN_MAX_JSON_DEPTH)") from exc
    except ValueError as exc:
        raise BadRequest("malformed JSON body") from exc
    if not _valid_tree(value, max_depth):
        _check_tree(value, max_depth)  # raises the reference walk's first error
    return value


def well_formed(value: Any, max_depth: int) -> bool:
    """Whether a backend value passes the rules a request body must pass (`_check_tree`): nesting at
    most `max_depth`, finite numbers, no lone surrogates. Used on each row a backend returns, so one
    malformed row is dropped instead of failing a response for the others."""
    return _valid_tree(value, max_depth)


def nests_within(value: Any, max_depth: int) -> bool:
    """`well_formed(value, max_depth)` of a value orjson decoded (`sidecar.stages.forward.decode_exact`: only
    orjson's exact types, finite floats, no lone surrogate in a string or key), where only the nesting is
    left to check: whether no array or object is nested deeper than `max_depth` levels (the outermost is
    level 1). Walks the containers level by level; a list of more than 8 items that holds no container is
    skipped in C (``map(type)``), its scalars never visited one by one."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return False
        nested: list[Any] = []
        for item in level:
            children = item.values() if type(item) is dict else item
            if len(item) > 8:
                types = set(map(type, children))
                if dict not in types and list not in types:
                    continue
            for child in children:
                t = type(child)
                if t is dict or t is list:
                    nested.append(child)
        level = nested
    return True


def check_filter_size(value: Any, name: str, limit: int) -> None:
    """At most `limit` conditions and operators (object keys) in a filter such as Chroma's ``where`` or
    Mem0's ``filters``. Raises `BadRequest` naming the filter and the limit."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            count += len(item)
            stack.extend(item)
        if count > limit:
            raise BadRequest(f"{name} has more than {limit} conditions (MEMWARDEN_MAX_FILTER_CLAUSES)")


def check_length(declared: list[str], limit: int) -> None:
    """Reject a declared Content-Length over `limit` bytes (413) or not a number (400)."""
    if declared:
        try:
            n = int(declared[0])
        except ValueError as exc:
            raise BadRequest("invalid Content-Length") from exc
        if n < 0:
            raise BadRequest("invalid Content-Length")
        if n > limit:
            raise PayloadTooLarge(f"body over {limit} bytes")
