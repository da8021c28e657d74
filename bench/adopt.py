"""Adoption benchmark (a script, not a test): `memwarden adopt chroma` over a collection of `--rows` rows
written straight into a fresh `chroma run` (no sidecar), SQLite ledger. Prints the wall time and rows/s of
the adoption (the `memwarden adopt` process, start-up included), of a second run over the adopted collection
(nothing to adopt: every row already governed, none re-stamped) and of the dry run, and checks the result
(ledger rows = rows the rules cover; the rest listed as uncovered; every covered row stamped in Chroma).

    nice -n 10 .venv/bin/python bench/adopt.py [--rows 100000] [--page 1000] [--dim 8] [--json out.json]

Rows cycle through five metadata patterns; the rules map two authors to owners, a visibility key to the
scope and leave 1 row in 50 uncovered (an unknown visibility value).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from memwarden_eval.harness import start_chroma
from sidecar.ledger import SQLiteLedger

TENANT, DATABASE, COLLECTION = "acme", "default_database", "legacy"
PATTERNS = [{"author": "support-bot", "visibility": "private"}, {"author": "importer", "visibility": "team"},
            {"visibility": "public"}, {"author": "support-bot"}, {"team": "blue"}]
RULES = f'''
tenant = "{TENANT}"

[[collection]]
name = "{COLLECTION}"
owner = "red/importer"
scope = "fleet"

[scope_from]
key = "visibility"
values = {{ private = "agent", team = "fleet", public = "tenant" }}

[[map]]
metadata = {{ author = "support-bot" }}
owner = "red/support"

[[map]]
metadata = {{ team = "blue" }}
owner = "blue/importer"
'''


def metadata(i: int) -> dict[str, Any]:
    if i % 50 == 49:
        return {"visibility": "secret", "n": i}  # no scope for it: uncovered
    return {**PATTERNS[i % len(PATTERNS)], "n": i}


def seed(url: str, rows: int, dim: int) -> float:
    rnd = random.Random(7)
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=600, trust_env=False) as http:
        http.post("/api/v2/tenants", json={"name": TENANT}).raise_for_status()
        http.post(f"/api/v2/tenants/{TENANT}/databases", json={"name": DATABASE}).raise_for_status()
        coll = http.post(f"/api/v2/tenants/{TENANT}/databases/{DATABASE}/collections", json={"name": COLLECTION})
        coll.raise_for_status()
        base = f"/api/v2/tenants/{TENANT}/databases/{DATABASE}/collections/{coll.json()['id']}"
        for start in range(0, rows, 5000):
            batch = range(start, min(rows, start + 5000))
            http.post(f"{base}/add", json={
                "ids": [f"row-{i}" for i in batch],
                "embeddings": [[rnd.random() for _ in range(dim)] for _ in batch],
                "documents": [f"legacy memory number {i}" for i in batch],
                "metadatas": [metadata(i) for i in batch]}).raise_for_status()
    return time.perf_counter() - started


def adopt(url: str, ledger: Path, rules: Path, page: int, *extra: str) -> tuple[float, dict[str, Any]]:
    exe = Path(sys.executable).with_name("memwarden")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")}
    started = time.perf_counter()
    r = subprocess.run([str(exe), "adopt", "chroma", "--rules", str(rules), "--ledger", str(ledger), "--backend-url", url,
                        "--page", str(page), "--format", "json", *extra], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if r.returncode != 0:
        raise SystemExit(f"memwarden adopt failed ({r.returncode}): {r.stderr[-2000:]}")
    return seconds, json.loads(r.stdout)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--page", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    covered = sum(1 for i in range(args.rows) if i % 50 != 49)
    with tempfile.TemporaryDirectory(prefix="mw-bench-adopt-") as tmp:
        work = Path(tmp)
        chroma = start_chroma(work / "chroma")
        try:
            ledger_path = work / "ledger.db"
            ledger = SQLiteLedger(ledger_path)
            for fleet, agent in (("red", "importer"), ("red", "support"), ("blue", "importer")):
                ledger.create_key("agent", TENANT, fleet, agent, 1)
            ledger.close()
            rules = work / "rules.toml"
            rules.write_text(RULES)
            seeded = seed(chroma.url, args.rows, args.dim)
            print(f"seeded {args.rows} rows straight into Chroma in {seeded:.1f} s", flush=True)
            dry_s, dry = adopt(chroma.url, ledger_path, rules, args.page, "--dry-run")
            assert dry["adopted"] == covered and dry["scanned"] == args.rows, dry
            first_s, first = adopt(chroma.url, ledger_path, rules, args.page)
            assert first["adopted"] == covered and len(first["uncovered"]) == args.rows - covered, first
            again_s, again = adopt(chroma.url, ledger_path, rules, args.page)
            assert (again["adopted"], again["already_governed"], again["restamped"]) == (0, covered, 0), again
            ledger = SQLiteLedger(ledger_path)
            try:
                n = ledger._db.execute("SELECT COUNT(*) FROM rows WHERE status = 'active'").fetchone()[0]
            finally:
                ledger.close()
            assert n == covered, (n, covered)
            with httpx.Client(base_url=chroma.url, timeout=600, trust_env=False) as http:
                base = f"/api/v2/tenants/{TENANT}/databases/{DATABASE}/collections/{first['collection']}"
                got = http.post(f"{base}/get", json={"where": {"mw_tenant": {"$eq": TENANT}}, "include": []}).json()
            assert len(got["ids"]) == covered, len(got["ids"])
        finally:
            chroma.stop()
    result = {"rows": args.rows, "covered": covered, "page": args.page, "dry_run_s": round(dry_s, 1),
              "adopt_s": round(first_s, 1), "adopt_rows_per_s": round(args.rows / first_s),
              "rerun_s": round(again_s, 1), "rerun_rows_per_s": round(args.rows / again_s),
              "by_scope": first["by_scope"], "by_owner": first["by_owner"]}
    print(f"dry run: {dry_s:.1f} s; adopt: {first_s:.1f} s ({args.rows / first_s:.0f} rows/s, {covered} adopted, "
          f"{args.rows - covered} uncovered); re-run: {again_s:.1f} s ({args.rows / again_s:.0f} rows/s, 0 adopted)")
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
