"""Benchmark for policy-check (a script, not a test).

Times ``policy-check policies/`` and ``policy-check`` on a generated 1,000-policy set
(the default guards plus 987 generated permits/forbids that keep every invariant true,
so the run measures proving, the common CI case), and prints per-invariant solver time.
Goals from issue 4: <= 2 s and <= 30 s wall.

    .venv/bin/python bench/policy_check.py [--policies N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
POLICIES = REPO / "policies"
EXE = Path(sys.executable).with_name("policy-check")

GUARDS = '''@id("forbid-cross-tenant")
forbid (principal, action, resource) when { resource.tenant != principal.tenant };
@id("forbid-deleted")
forbid (principal, action, resource is Memory) when { resource.status == "deleted" };
'''


def generated_policy(i: int, rng: random.Random) -> str:
    n = rng.randrange(50)
    k = rng.randrange(7)
    pid = f'@id("gen-{i}")\n'
    if k == 0:  # a narrower fleet read for labelled rows
        return pid + (f'permit (principal is Agent, action == Action::"read", resource is Memory)\n'
                      f'when {{ resource.tenant == principal.tenant && resource.scope == "fleet" && '
                      f'resource.fleet == principal.fleet && resource.labels.contains("team-{n}") }};')
    if k == 1:  # role-gated tenant read
        return pid + (f'permit (principal is Agent, action == Action::"read", resource is Memory)\n'
                      f'when {{ resource.tenant == principal.tenant && resource.scope == "tenant" && '
                      f'principal.roles.contains("reader-{n}") }};')
    if k == 2:  # role-gated home-fleet write
        return pid + (f'permit (principal is Agent, action == Action::"write", resource is Memory)\n'
                      f'when {{ resource.tenant == principal.tenant && resource.owner == principal && '
                      f'resource.fleet == principal.fleet && principal.trust >= 1 && '
                      f'principal.roles.contains("writer-{n}") }};')
    if k == 3:  # quarantine label, lifted at trust 3
        return pid + (f'forbid (principal is Agent, action, resource is Memory)\n'
                      f'when {{ resource.labels.contains("quarantine-{n}") && principal.trust < 3 }};')
    if k == 4:  # a fleet frozen for low-trust agents
        return pid + (f'forbid (principal is Agent, action in [Action::"write", Action::"update", '
                      f'Action::"delete"], resource is Memory)\n'
                      f'when {{ resource.fleet == Fleet::"t{n % 5}/f{n}" && principal.trust < 2 }};')
    if k == 5:  # role-gated search
        return pid + (f'permit (principal is Agent, action == Action::"search", resource is Collection)\n'
                      f'when {{ resource.tenant == principal.tenant && principal.roles.contains("search-{n}") }};')
    return pid + (f'permit (principal is Agent, action == Action::"read", resource is Memory)\n'
                  f'when {{ resource.tenant == principal.tenant && resource.scope == "restricted" && '
                  f'resource.readers.contains(principal) && resource has subject && '
                  f'resource.subject like "topic-{n}*" }};')


def make_large(root: Path, n: int, seed: int = 4) -> Path:
    d = root / "large"
    d.mkdir()
    shutil.copy(POLICIES / "memwarden.cedarschema", d)
    rng = random.Random(seed)
    default = (POLICIES / "default.cedar").read_text()
    body = [default] + [generated_policy(i, rng) for i in range(n - default.count("@id("))]
    (d / "policies.cedar").write_text("\n\n".join(body) + "\n")
    assert (d / "policies.cedar").read_text().count("@id(") == n
    return d


def run(target: Path, out: Path) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    p = subprocess.run([str(EXE), str(target), "--format", "json", "--counterexamples", str(out)],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode not in (0,):
        print(p.stdout[-2000:], p.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"policy-check {target} exited {p.returncode}")
    return wall, json.loads(p.stdout)


def report(name: str, walls: list[float], rep: dict[str, Any], goal: float) -> None:
    per: dict[str, float] = {}
    for r in rep["results"]:
        per[r["invariant"]] = per.get(r["invariant"], 0.0) + r["solver_seconds"]
    print(f"\n{name}: wall median {statistics.median(walls):.2f}s (min {min(walls):.2f}, max {max(walls):.2f}, "
          f"n={len(walls)}), goal <= {goal:.0f}s: {'met' if max(walls) <= goal else 'MISSED'}")
    print(f"  in-process time {rep['wall_seconds']:.2f}s, results {rep['summary']}")
    print(f"  {'invariant':<26}{'solver s':>10}{'actions':>9}")
    for inv, secs in sorted(per.items(), key=lambda kv: -kv[1]):
        n = sum(1 for r in rep["results"] if r["invariant"] == inv)
        print(f"  {inv:<26}{secs:>10.3f}{n:>9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        walls: list[float] = []
        rep: dict[str, Any] = {}
        for _ in range(args.repeat):
            w, rep = run(POLICIES, root / "cex")
            walls.append(w)
        report("policy-check policies/", walls, rep, 2.0)
        large = make_large(root, args.policies)
        walls = []
        for _ in range(args.repeat):
            w, rep = run(large, root / "cex")
            walls.append(w)
        report(f"policy-check <generated {args.policies}-policy set>", walls, rep, 30.0)


if __name__ == "__main__":
    main()
