"""Earlier code of `sidecar.stages.canonicalize`, kept as test references."""

from __future__ import annotations

import math
from typing import Any

from sidecar.stages.canonicalize import _FLOAT_BOUND, _INT64_MAX


def fast_members_fsum(value: Any, max_depth: int) -> int:
    """`canonicalize._fast_members` before its bound used `sum` (as of 77354c9): for a value orjson parsed: -1 unless the reference rules hold (nesting at most `max_depth`; ints in
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
                try:  # numbers only (no str, None or container: abs refuses those): one bound for all
                    total = math.fsum(map(abs, item))
                except (TypeError, OverflowError):
                    total = None
                if total is not None:
                    # fsum is correctly rounded, so it is at least the largest |x| (rounding is monotone):
                    # below the bound, every float is finite and below it, every int is in the signed
                    # 64-bit range (-2**63 itself is refused here and checked by the reference). NaN fails.
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
