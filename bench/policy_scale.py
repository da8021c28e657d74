"""policy-check at organisation scale (a script that prints figures, not a timed test; issue 38).

For generated policy sets of N policies (the default set plus generated permits/forbids that keep every
invariant true, ``bench/policy_check.py``'s generator) it prints, per N:

* proving: wall time of ``policy-check DIR`` on the set (exit 0) and the process's peak RSS;
* a violation: the same set with one widened permit (the fleet-scope read's ``trust >= 2`` relaxed to
  ``>= 0``) placed at the beginning, the middle or the end of the generated policies: wall time of
  ``policy-check DIR`` until it exits 1 with ``inv-scope`` on ``read`` VIOLATED and its counterexample
  replayed (Cedar's decision ``allow``), and peak RSS;
* a re-check: ``policy-check DIR --cache-dir C`` once to fill the cache, then one generated policy changed
  and the wall time of the next run.

Every run is a fresh ``policy-check`` process at the default timeout. Goals (issue 38, 2-core machine):
10,000 proved <= 30 s, a violation in 10,000 found <= 30 s, a one-policy re-check <= 5 s.

    .venv/bin/python bench/policy_scale.py [--sizes 100 1000 10000 30000] [--skip-violations]
                                           [--positions begin middle end]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.policy_check import POLICIES, generated_policy  # noqa: E402

EXE = Path(sys.executable).with_name("policy-check")
WIDENED_ID = "widened-fleet-read"
WIDENED = f'''@id("{WIDENED_ID}")
permit (principal is Agent, action == Action::"read", resource is Memory)
when {{ resource.tenant == principal.tenant && resource.scope == "fleet" &&
  (resource.fleet == principal.fleet || principal.trust >= 0) }};'''


def make_set(d: Path, n: int, widened: str | None = None, seed: int = 4) -> Path:
    """Write a policy directory ``d`` (schema + ``policies.cedar``) of ``n`` policies: the default set and
    generated ones; with ``widened`` ("begin", "middle", "end") one more, the widened fleet read, at that
    place among the generated policies. Returns ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(POLICIES / "memwarden.cedarschema", d)
    rng = random.Random(seed)
    default = (POLICIES / "default.cedar").read_text()
    gen = [generated_policy(i, rng) for i in range(n - default.count("@id("))]
    if widened is not None:
        gen.insert({"begin": 0, "middle": len(gen) // 2, "end": len(gen)}[widened], WIDENED)
    (d / "policies.cedar").write_text("\n\n".join([default] + gen) + "\n")
    return d


def _run_rss(target: Path, *extra: str) -> tuple[float, int, int, dict[str, Any]]:
    """``policy-check target --format json``: (wall seconds, exit code, peak RSS in MiB of that process, read
    through os.wait4, the JSON report)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as cx, tempfile.TemporaryFile("w+") as out, \
            tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([str(EXE), str(target), "--format", "json", "--counterexamples", cx, *extra],
                             stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
        try:
            doc = json.loads(text)
        except ValueError:
            err.seek(0)
            print(err.read()[-2000:], file=sys.stderr)
            raise SystemExit(f"policy-check {target} printed no JSON (exit {code})") from None
    return wall, code, usage.ru_maxrss // 1024, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000, 30000])
    ap.add_argument("--skip-violations", action="store_true")
    ap.add_argument("--positions", nargs="+", default=["begin", "middle", "end"],
                    choices=["begin", "middle", "end"], help="where the widened permit is placed")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, "
          f"{os.cpu_count()} cores")
    print(f"{'policies':>9} {'measure':<28} {'wall s':>8} {'peak MiB':>9}  result")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in args.sizes:
            d = make_set(root / f"p{n}", n)
            wall, code, rss, doc = _run_rss(d)
            print(f"{n:>9} {'prove':<28} {wall:>8.1f} {rss:>9}  exit {code} {doc['summary']}", flush=True)
            if not args.skip_violations:
                for where in args.positions:
                    w = make_set(root / f"w{n}-{where}", n, where)
                    wall, code, rss, doc = _run_rss(w)
                    hit = [r for r in doc["results"] if r["invariant"] == "inv-scope" and r["action"] == "read"]
                    ok = code == 1 and hit and hit[0]["status"] == "VIOLATED" and \
                        (hit[0]["counterexample"] or {}).get("cedar", {}).get("decision") == "allow"
                    print(f"{n:>9} {'violated, widened at ' + where:<28} {wall:>8.1f} {rss:>9}  exit {code} "
                          f"{'VIOLATED, replayed' if ok else 'NOT FOUND: ' + str(doc['summary'])}", flush=True)
                    shutil.rmtree(w)
            cache = root / f"cache{n}"
            _run_rss(d, "--cache-dir", str(cache))
            text = (d / "policies.cedar").read_text()
            mid = f'@id("gen-{(n - 16) // 2}")'
            assert mid in text
            # change one generated policy: its id's statement gains a harmless conjunct
            start = text.index(mid)
            stop = text.index("};", start)
            (d / "policies.cedar").write_text(text[:start] + text[start:stop] + " && true " + text[stop:])
            wall, code, rss, doc = _run_rss(d, "--cache-dir", str(cache))
            cached = sum(1 for r in doc["results"] if r.get("cached"))
            print(f"{n:>9} {'re-check after 1 change':<28} {wall:>8.1f} {rss:>9}  exit {code} "
                  f"{cached}/{len(doc['results'])} results from the cache", flush=True)
            shutil.rmtree(d)
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
