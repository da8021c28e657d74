"""Instructions per call of the per-request steps issue 35 moved to public APIs (a script, not a test).

Run under callgrind with ``--dump-before=getppid``: each step runs `--n` times between two ``os.getppid()``
calls, so callgrind writes one profile part per step; ``summary`` prints each part's instructions ÷ n.
Run it on two trees (``PYTHONPATH=TREE``) to compare:

    valgrind --tool=callgrind --dump-before='os_getppid*' --callgrind-out-file=OUT/cg \\
        .venv/bin/python bench/internals_cost.py run --n 2000
    .venv/bin/python bench/internals_cost.py summary OUT --n 2000

Steps (each a get's worth): ``empty`` (the loop alone), ``exchange`` (`Exchange(...)` with its request id),
``route`` (`ChromaProfile.match` of a get's path), ``metrics`` (`Metrics.observe_exchange` of a get and one
request-level `observe_cedar_one`), ``read_body`` (`Pipeline._read_body` of a body uvicorn already holds, on
uvloop).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from callgrind_parts import part_totals

STEPS = ("empty", "exchange", "route", "metrics", "read_body")


def run(n: int) -> None:
    import uvloop

    from sidecar.backends.chroma import ChromaProfile
    from sidecar.exchange import Exchange
    from sidecar.metrics import Metrics
    from sidecar.pipeline import Pipeline

    path = "/api/v2/tenants/t/databases/d/collections/0b6c4c5e-8a4e-4d6e-9d0e-0c1f4a4d9b11/get"
    segments = path.strip("/").split("/")
    metrics = Metrics()
    ex = Exchange(method="POST", raw_path=path)
    ex.operation, ex.action, ex.decision, ex.rows_allowed = "get", "read", "allow", 1
    pipeline = Pipeline.__new__(Pipeline)
    pipeline.max_body_bytes, pipeline.body_timeout_s = 8 * 1024 * 1024, 30.0
    message = {"type": "http.request", "body": b'{"ids":["r1"]}', "more_body": False}

    async def receive() -> dict[str, object]:
        return message

    async def bodies(k: int) -> None:
        deadline = asyncio.get_running_loop().time() + 1e6
        for _ in range(k):
            await pipeline._read_body(receive, deadline)

    steps = {
        "empty": lambda: None,
        "exchange": lambda: Exchange(method="POST", raw_path=path),
        "route": lambda: ChromaProfile.match(None, "POST", segments),  # type: ignore[arg-type]
        "metrics": lambda: (metrics.observe_exchange(ex, 200), metrics.observe_cedar_one("read", True, 0.0003)),
    }
    for name, step in steps.items():  # warm-up, then one part per step
        for _ in range(50):
            step()
    uvloop.run(bodies(50))
    for name, step in steps.items():
        os.getppid()
        for _ in range(n):
            step()
    os.getppid()
    uvloop.run(bodies(n))  # the loop's start and end land in this part too (≈ constant, both trees)
    os.getppid()


def summary(out: Path, n: int) -> None:
    totals = part_totals(out)
    # parts: [before the first marker, then one per step]; the step parts are the ones after markers 1..5
    for name, total in zip(STEPS, totals[1:1 + len(STEPS)]):
        print(f"{name:10s} {total / n / 1000:8.1f}k instructions per call")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "summary"])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    if args.mode == "run":
        run(args.n)
    else:
        summary(args.out, args.n)


if __name__ == "__main__":
    main()
