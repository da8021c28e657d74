"""Differential benchmark (a script, not a test): the Z3 model against cedarpy on many generated examples.

    nice -n 10 .venv/bin/python bench/differential.py --examples 100000 --workers 2 [--seed 1]
        [--deep-share 0.2] [--out .policy-check/differential]

Each example is a generated policy set of 1-4 policies, an entity store and a request
(``tests/invariants/strategies.py``: the whole literal space Cedar accepts — escape text, every escape
spelling, quotes, backslashes, ``*`` and ``\\*`` in ``like`` patterns, empty strings, non-BMP characters and
characters above Z3's range, ids with ``/``, ``::``, whitespace and unicode, both ends of the Long range
and overflow, sets with duplicates), on the memwarden schema or (``--deep-share`` of them) on a schema
with a six-level entity hierarchy. Cedar validates the set (invalid sets are counted and skipped);
then the Z3 model's decision, determining and erroring policies (``invariants.concrete.evaluate``) must
equal cedarpy's. CI runs the same comparison on a few thousand Hypothesis examples
(tests/invariants/test_differential.py); this script runs far more, without Hypothesis' engine.

Prints the number of disagreements (goal 0; each is written, with its whole input, to
``--out/disagreements.jsonl`` so it can become a regression test), how often each construct occurred in
the validated examples, and throughput.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import time
from collections import Counter
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHUNK = 250  # examples per task (progress granularity)
LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1


def _walk(node: Any, out: Counter[str]) -> None:
    """Count the constructs of a policy AST (cedarpy.pst dataclasses) and features of its literals."""
    from cedarpy import pst

    if isinstance(node, (list, tuple)):
        for x in node:
            _walk(x, out)
        return
    if isinstance(node, dict):
        for x in node.values():
            _walk(x, out)
        return
    if not is_dataclass(node):
        return
    name = type(node).__name__
    if isinstance(node, (pst.UnaryOp, pst.BinaryOp)):
        out[f"op {node.op}"] += 1
    elif name not in ("EntityType", "EntityUid", "Var", "When", "Unless", "Template", "Char", "Wildcard"):
        out[f"node {name}"] += 1
    if isinstance(node, pst.StringLit):
        _string_features("string literal", node.value, out)
    elif isinstance(node, pst.EntityLit):
        _string_features("entity id", node.value.id, out)
    elif isinstance(node, pst.LongLit) and node.value in (LONG_MIN, LONG_MAX):
        out["long literal at a bound"] += 1
    elif isinstance(node, pst.Like):
        chars = [e.value for e in node.pattern if isinstance(e, pst.Char)]
        if any(isinstance(e, pst.Wildcard) for e in node.pattern):
            out["like: wildcard"] += 1
        if "*" in chars:
            out["like: literal star"] += 1
        if not node.pattern:
            out["like: empty pattern"] += 1
        _string_features("like pattern", "".join(chars), out)
    for f in fields(node):
        _walk(getattr(node, f.name), out)


def _string_features(what: str, s: str, out: Counter[str]) -> None:
    feats = {
        "empty": s == "", "backslash": "\\" in s, "quote": '"' in s, "escape text": "\\u{" in s or "\\x" in s,
        "control char": any(ord(c) < 0x20 or c == "\x7f" for c in s), "non-BMP": any(ord(c) > 0xFFFF for c in s),
        "above Z3 range": any(ord(c) > 0x2FFFF for c in s), "star": "*" in s, "slash": "/" in s, "::": "::" in s,
        "whitespace": any(c.isspace() for c in s), "non-ASCII": any(ord(c) > 0x7F for c in s),
    }
    for k, v in feats.items():
        if v:
            out[f"{what}: {k}"] += 1


def _source_features(text: str, out: Counter[str]) -> None:
    for spelling in ("\\u{", "\\x", "\\n", "\\r", "\\t", "\\\\", "\\0", "\\'", '\\"', "\\*"):
        if spelling in text:
            out[f"source spelling {spelling}"] += 1


def _data_features(entities: list[dict[str, Any]], out: Counter[str]) -> None:
    parents = {(e["uid"]["type"], e["uid"]["id"]): [(p["type"], p["id"]) for p in e.get("parents", [])]
               for e in entities}

    def depth(k: tuple[str, str], seen: frozenset[tuple[str, str]] = frozenset()) -> int:
        return 1 + max((depth(p, seen | {k}) for p in parents.get(k, []) if p not in seen), default=0)

    d = max((depth(k) for k in parents), default=0)
    out[f"hierarchy depth {d}"] += 1
    for e in entities:
        for v in e.get("attrs", {}).values():
            if isinstance(v, list) and len(v) != len({json.dumps(x, sort_keys=True) for x in v}):
                out["set value with duplicates"] += 1
                return


_SCHEMAS: dict[str, Any] = {}


def _schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """Per worker process, once: the schema models (``invariants.schema``) and cedarpy's pre-parsed
    ``Schema`` handles (validation and authorization then skip re-parsing the schema text per call)."""
    if not _SCHEMAS:
        import cedarpy

        from invariants.schema import parse_schema
        from tests.invariants.strategies import DEEP_SCHEMA

        texts = {"memwarden": (REPO / "policies" / "memwarden.cedarschema").read_text(encoding="utf-8"),
                 "deep": DEEP_SCHEMA}
        _SCHEMAS["models"] = {k: parse_schema(v) for k, v in texts.items()}
        _SCHEMAS["handles"] = {k: cedarpy.Schema.from_str(v) for k, v in texts.items()}
    return _SCHEMAS["models"], _SCHEMAS["handles"]


def run_chunk(task: tuple[int, int, float]) -> dict[str, Any]:
    """Run `n` examples from seed `seed`; returns counts, coverage, disagreements and the slowest examples."""
    seed, n, deep_share = task
    import cedarpy

    from invariants.concrete import evaluate
    from invariants.engine import authorize, parse_text
    from tests.invariants.strategies import RandomDraw, gen_scenario

    models, schemas = _schemas()
    rng = random.Random(seed)
    draw = RandomDraw(rng)
    counts: Counter[str] = Counter()
    cover: Counter[str] = Counter()
    bad: list[dict[str, Any]] = []
    slow: list[tuple[float, int, int]] = []  # (seconds, seed, index) of the slowest examples
    for i in range(n):
        t0 = time.perf_counter()
        which = "deep" if rng.random() < deep_share else "memwarden"
        text, entities, request = gen_scenario(draw, models[which])
        counts["generated"] += 1
        if not cedarpy.validate_policies(text, schemas[which]).validation_passed:
            counts["invalid (skipped)"] += 1
            continue
        counts[f"checked ({which} schema)"] += 1
        pols = parse_text(text, "generated.cedar").policies
        try:
            cedar = authorize(request, pols, entities, schemas[which]).to_json()
            model = evaluate(models[which], pols, request, entities)
        except Exception as exc:  # a crash of either side is a disagreement too
            cedar, model = {"exception": repr(exc)}, {}
        if model != cedar:
            counts["disagreements"] += 1
            if len(bad) < 50:
                bad.append({"schema": which, "policies": text, "request": request, "entities": entities,
                            "model": model, "cedar": cedar})
            continue
        ex: Counter[str] = Counter()
        ex[f"decision {cedar['decision']}"] += 1
        ex[f"schema {which}"] += 1
        if cedar["errors"]:
            ex["evaluation error"] += 1
        for p in pols:
            _walk(p.ast, ex)
        _source_features(text, ex)
        _data_features(entities, ex)
        for role in ("principal", "resource"):
            _string_features(f"request {role} id", request[role]["id"], ex)
        cover.update(set(ex))  # examples containing each construct
        slow = sorted(slow + [(time.perf_counter() - t0, seed, i)], reverse=True)[:5]
    return {"counts": counts, "cover": cover, "bad": bad, "slow": slow}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deep-share", type=float, default=0.2, help="share of examples on the deep-hierarchy schema")
    ap.add_argument("--out", type=Path, default=Path(".policy-check/differential"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bad_file = args.out / "disagreements.jsonl"
    bad_file.write_text("", encoding="utf-8")
    tasks = []
    left, i = args.examples, 0
    while left > 0:
        tasks.append((args.seed * 1_000_000 + i, min(CHUNK, left), args.deep_share))
        left -= CHUNK
        i += 1
    counts: Counter[str] = Counter()
    cover: Counter[str] = Counter()
    slow: list[tuple[float, int, int]] = []
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for res in pool.imap_unordered(run_chunk, tasks):
            counts.update(res["counts"])
            slow = sorted(slow + res["slow"], reverse=True)[:5]
            cover.update(res["cover"])
            with bad_file.open("a", encoding="utf-8") as f:
                for b in res["bad"]:
                    f.write(json.dumps(b) + "\n")
            done = counts["generated"]
            el = time.perf_counter() - t0
            print(f"  {done:>7}/{args.examples} examples, {counts['disagreements']} disagreements, "
                  f"{done / el:.1f}/s, {el / 60:.1f} min", flush=True)
    el = time.perf_counter() - t0
    checked = sum(v for k, v in counts.items() if k.startswith("checked"))
    print(f"\ndifferential: {counts['generated']} examples generated, {checked} checked "
          f"({counts['invalid (skipped)']} invalid, skipped), seed {args.seed}, {args.workers} workers, "
          f"{el:.0f} s ({counts['generated'] / el:.1f} examples/s)")
    for k in sorted(counts):
        print(f"  {k:<40}{counts[k]:>9}")
    print(f"DISAGREEMENTS: {counts['disagreements']} (goal 0){'; see ' + str(bad_file) if counts['disagreements'] else ''}")
    print("slowest checked examples: " + ", ".join(f"{t:.2f} s (task seed {sd}, example {i})" for t, sd, i in slow))
    print("\ncoverage (checked examples containing each construct):")
    for k, v in sorted(cover.items()):
        print(f"  {k:<44}{v:>9}  {100 * v / max(checked, 1):6.1f} %")


if __name__ == "__main__":
    main()
