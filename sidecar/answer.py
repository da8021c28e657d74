"""The bytes of a JSON answer to a client: exactly the standard library's
``json.dumps(value, separators=(",", ":"), allow_nan=False).encode()`` (`reference_bytes`: ASCII, compact,
NaN and infinities refused), written by orjson wherever orjson's bytes, with their non-ASCII characters
escaped, are provably those bytes (`answer_bytes`), a fraction of the cost.

Why the bytes stay identical, not only the parsed value: nothing in the sidecar hashes or signs an answer
(provenance and content HMACs are over stored content; the decision log and the metrics record no body), so
value equality would be sound too; but clients and caches may compare answers byte for byte, the
``content-length`` would move, and the wire test of the entry (``tests/unit/test_entry_direct_write.py``)
compares bytes with the old entry. Byte identity costs nothing on the common answer (ASCII text, numbers of
ordinary size); the others are the standard library's as before.

The argument, for a value orjson accepted with ``OPT_PASSTHROUGH_SUBCLASS|DATACLASS|DATETIME``:

1. orjson refuses (``TypeError``; then the standard library answers, or raises, as before): ints outside
   -2**63 .. 2**64-1; dict keys that are not exact ``str`` (the standard library writes int/float/bool/None
   keys as strings); strings with a lone surrogate (the standard library escapes it); nesting deeper than
   255 and circular values; subclasses of ``str``/``int``/``float``/``dict``/``list``/``tuple`` (named
   tuples too), dataclasses, ``datetime``/``date``/``time`` and every type it does not know. So every node
   is of an exact JSON type, a tuple, or one of the three types orjson writes and the standard library may
   not: ``enum.Enum`` members, ``uuid.UUID``, ``orjson.Fragment``.
2. `_same_form` walks the value: only exact ``dict``/``list``/``tuple``/``str``/``int``/``bool``/``None``
   and finite floats that are 0 or of magnitude at least 1e-4 pass. NaN and ±infinity (orjson writes
   ``null``, the standard library raises ``ValueError`` and the caller answers 500), the small floats of 3
   and the three types of 1 go to the standard library.
3. For those types both write the same structure: ``{"k":v,...}`` and ``[a,...]`` without whitespace, dict
   items in iteration order, tuples as arrays, ``true``/``false``/``null``, ints in decimal, and every finite
   float as ``float.__repr__`` does (shortest round-trip digits, ``1e+16``, ``-0.0``) — except floats of
   magnitude below 1e-4 (zero aside), which orjson writes ``0.00001`` or ``2.5e-7`` where repr writes
   ``1e-05``, ``2.5e-07`` (refused in 2).
4. Strings and keys: both escape ``"`` ``\\`` ``\\b`` ``\\f`` ``\\n`` ``\\r`` ``\\t`` alike and the other
   control characters as ``\\u00XX`` (lower-case hex); the standard library also escapes DEL and every
   non-ASCII character (``\\uXXXX``, surrogate pairs above U+FFFF), orjson writes them raw (UTF-8). They can
   occur only inside strings (the rest of the output is ASCII without DEL), so bytes that are ASCII without a
   DEL byte hold none; in bytes without DEL, every run of non-ASCII characters is inside one string, and is
   replaced (``ascii`` encoding with the error handler `_escaped`) by what the standard library's own string
   escaper (``json.encoder.encode_basestring_ascii``, the one ``json.dumps`` uses) writes for it.
5. Nesting within orjson's 255 levels is within the standard library's recursion limit at the depth of the
   caller (the ASGI entry), so the standard library would not have raised ``RecursionError`` either.

At import, orjson's bytes for a few probe values (floats at the edges of 3, the escapes of 4, non-ASCII text
escaped as in 4) are compared
with the standard library's; if any differs (another orjson release), every answer is the standard
library's. ``tests/unit/test_answer_bytes.py`` checks the whole rule against `reference_bytes` (Hypothesis).
"""

from __future__ import annotations

import codecs
import json
import json.encoder
import sys
from typing import Any

import orjson

_OPTION = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_MAX = sys.float_info.max
_PLAIN = frozenset((str, int, bool, type(None)))  # exact types both write alike, whatever the value
_SMALL = 1e-4  # below this magnitude (zero aside) orjson's float text is not repr's


def reference_bytes(value: Any) -> bytes:
    """The standard library's compact JSON bytes of `value` (ASCII, non-finite floats refused). Raises
    ``ValueError`` (NaN/infinity, a circular value), ``TypeError`` (a type it cannot write) or
    ``RecursionError`` (nesting beyond the interpreter's limit)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _same_form(value: Any) -> bool:
    """For a value orjson wrote: True when every node is an exact ``dict``, ``list``, ``tuple``, ``str``,
    ``int``, ``bool``, ``None`` or a float that is 0 or finite of magnitude at least 1e-4 (dict keys are not
    looked at: orjson wrote them, so they are ``str``). A container of more than `_SHORT` children all of the
    scalar types of `_PLAIN` is checked in one pass over their types (``frozenset.issuperset`` of an iterator
    builds a set: dearer than looking at a few children); the others, and every short one, child by child."""
    stack: list[Any] = [(value,)]
    pop, push = stack.pop, stack.append
    small, big, plain, short = _SMALL, _MAX, _PLAIN.issuperset, _SHORT
    while stack:
        for child in pop():
            t = type(child)
            if t is str or t is int or child is None or t is bool:
                continue
            if t is float:
                # NaN fails every comparison, ±inf is beyond _MAX; 0.0 and -0.0 are written alike
                if not (small <= child <= big or -big <= child <= -small or child == 0.0):
                    return False
            elif t is dict:
                values = child.values()
                if len(values) <= short or not plain(map(type, values)):
                    push(values)
            elif t is list or t is tuple:
                if len(child) <= short or not plain(map(type, child)):
                    push(child)
            else:  # enum members, UUIDs, orjson fragments: orjson writes them, the standard library may not
                return False
    return True


_SHORT = 8  # `_same_form`: containers of at most this many children are walked child by child


def _escaped(exc: UnicodeError) -> tuple[str, int]:
    """The ``ascii`` codec's error handler of `_escape`: the run of non-ASCII characters it could not encode
    (all inside strings, point 4 of the module docstring) as the standard library's own string escaper writes
    them (``\\uXXXX``, lower-case hex, surrogate pairs above U+FFFF), and where to go on."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return _escape_ascii(exc.object[exc.start:exc.end])[1:-1], exc.end


_escape_ascii = json.encoder.encode_basestring_ascii  # what json.dumps(ensure_ascii=True) escapes strings and keys with
_ERRORS = "memwarden.answer-ascii"
codecs.register_error(_ERRORS, _escaped)


def _escape(out: bytes) -> bytes:
    """orjson's UTF-8 output `out`, without a DEL byte, with every non-ASCII character escaped as the standard
    library escapes it (`_escaped`)."""
    return out.decode("utf-8").encode("ascii", _ERRORS)


def _probes_agree() -> bool:
    """Whether this orjson writes the probe values as the standard library does (module docstring), its
    non-ASCII output once escaped (`_escaped`) included."""
    probes: list[Any] = [1e-4, -1e-4, 0.1, 1.0, -0.0, 0.0, 1e15, 1e16, 1.5e16, 123456789012345680.0, 1e22,
                         1e300, _MAX, -_MAX, 2 ** 64 - 1, -2 ** 63,
                         "\x00\x01\x1f\b\f\n\r\t\"\\/ ~", {"a": [1, 2.5, None, True, False, (1,)], "": {}},
                         {"é": ["é", "\u2028\u2029", "\ufeff", "😀", "\U0010ffff", "a\x80ÿ\u0100\uffff"], "\U0001f600": "x\u00e9y"}]
    try:
        for p in probes:
            out = orjson.dumps(p, option=_OPTION)
            if (out if out.isascii() else _escape(out)) != reference_bytes(p):
                return False
        return True
    except (TypeError, ValueError):
        return False


_FAST = _probes_agree()


def answer_bytes(value: Any) -> bytes:
    """`reference_bytes(value)`: the same bytes, or the same exception (``ValueError``, ``TypeError``,
    ``RecursionError``). orjson writes them when it accepts `value`, its output has no DEL byte and
    `_same_form` holds (module docstring), its non-ASCII characters escaped as the standard library escapes
    them (`_escape`); otherwise the standard library does."""
    if _FAST:
        try:
            out = orjson.dumps(value, option=_OPTION)
        except TypeError:  # orjson.JSONEncodeError included
            return reference_bytes(value)
        if b"\x7f" not in out and _same_form(value):
            return out if out.isascii() else _escape(out)
    return reference_bytes(value)
