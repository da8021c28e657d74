"""Earlier code of the answer encoding in `sidecar.app.PipelineMiddleware`, kept as a test reference."""

from __future__ import annotations

import json
import sys
from typing import Any

import orjson


def old_payload(body: Any) -> bytes:
    """The answer bytes as `PipelineMiddleware.__call__` made them before `sidecar.answer` (as of fe121ba).
    Raises ``ValueError``, ``TypeError`` or ``RecursionError``, which the entry answers as a 500."""
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


_PLAIN = frozenset((str, int, bool, type(None)))
_SMALL = 1e-4
_MAX = sys.float_info.max
_OPTION = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def same_form_h22j(value: Any) -> bool:
    """`sidecar.answer._same_form` as of 1b82edf (child by child, a container of plain scalars in one pass).
    For a value orjson wrote: True when every node is an exact ``dict``, ``list``, ``tuple``, ``str``,
    ``int``, ``bool``, ``None`` or a float that is 0 or finite of magnitude at least 1e-4 (dict keys are not
    looked at: orjson wrote them, so they are ``str``). A container whose children are all of the scalar
    types of `_PLAIN` is checked in one pass over their types, the others child by child."""
    stack: list[Any] = [(value,)]
    pop, push = stack.pop, stack.append
    small, big, plain = _SMALL, _MAX, _PLAIN.issuperset
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
                if not plain(map(type, values)):
                    push(values)
            elif t is list or t is tuple:
                if not plain(map(type, child)):
                    push(child)
            else:  # enum members, UUIDs, orjson fragments: orjson writes them, the standard library may not
                return False
    return True


def answer_bytes_h22j(value: Any) -> bytes:
    """`sidecar.answer.answer_bytes` as of 1b82edf: orjson's bytes when ASCII without DEL and `same_form_h22j`
    holds, else the standard library's (`old_payload`)."""
    try:
        out = orjson.dumps(value, option=_OPTION)
    except TypeError:
        return old_payload(value)
    if out.isascii() and b"\x7f" not in out and same_form_h22j(value):
        return out
    return old_payload(value)
