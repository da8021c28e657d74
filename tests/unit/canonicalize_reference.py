"""Earlier code of `sidecar.stages.canonicalize`, kept as test references."""

from __future__ import annotations

import math
from typing import Any

import orjson

from sidecar.stages.canonicalize import _FAST_MAX_DEPTH, _FLOAT_BOUND, _INT64_MAX, _STRING_TOKEN


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


def fast_members_sum(value: Any, max_depth: int) -> int:
    """`canonicalize._fast_members` before its bound used `math.hypot` (as of 1b82edf): for a value orjson parsed: -1 unless the reference rules hold (nesting at most `max_depth`; ints in
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


def fast_parse_regex(text: str, max_depth: int) -> tuple[bool, Any]:
    """`canonicalize._fast_parse` before the colon count (as of 1b82edf), with `fast_members_sum`: (True, value) when orjson parses `text` and the reference parser would give an equal value (same
    types, same floats); (False, None) on any doubt. Duplicate keys: orjson keeps the last value, so the
    object members in the tree are counted against the key tokens in the text; fewer means one collapsed."""
    if max_depth > _FAST_MAX_DEPTH:
        return False, None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, None
    members = fast_members_sum(value, max_depth)
    if members < 0:
        return False, None
    if members:
        tokens = _STRING_TOKEN.findall(text)
        if len(tokens) - tokens.count("") != members:
            return False, None
    return True, value
