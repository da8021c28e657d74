"""What of a deleted memory stays on the backend's disk, and when it goes (a script that prints figures, not a
test): real `chroma run` and our Mem0 REST server (real `mem0ai` `Memory`), a real sidecar in front, and
`memwarden erase --verify --format json` as the only instrument.

    .venv/bin/python bench/erasure.py [--profile chroma|mem0|both] [--fillers 1000]

Each scenario writes unique marker texts through the sidecar, deletes them through the sidecar, and after each
step prints where `erase --verify --no-purge` finds each text (file: places, and the SQLite free-page hint);
``erase`` (the purge) runs only where a step says so. Chroma scenarios: a collection with Chroma's default
``hnsw.sync_threshold`` (1000) and one with 2; a row updated before its delete (its earlier text too); the
default collection again after `--fillers` more records. Mem0: history on disk (default) and
``HISTORY_DB_PATH=:memory:``; a memory updated before its delete. Servers bind 127.0.0.1; everything lives
in a temporary directory removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import uuid
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "evaluation"))  # memwarden_eval of this checkout (the harness)

from memwarden_eval.harness import start_chroma, start_mem0, start_sidecar  # noqa: E402

POLICIES = ROOT / "policies"
MEM0_KEY = "erasure-bench-" + uuid.uuid4().hex[:8]


def verify(ledger: Path, backend: str, data: Path, texts: dict[str, str], purge: bool, tmp: Path) -> dict[str, str]:
    """label -> where `memwarden erase --verify` finds that text (purging first when `purge`)."""
    listing = tmp / "texts.txt"
    listing.write_text("".join(t + "\n" for t in texts.values()), encoding="utf-8")
    env = {**os.environ, "MEMWARDEN_LEDGER_PATH": str(ledger), "MEMWARDEN_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "sidecar.cli", "erase", "--verify", "--data-path", str(data), "--text-file", str(listing),
            "--format", "json"] + ([] if purge else ["--no-purge"])
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    listing.unlink()
    if r.returncode not in (0, 1):
        raise SystemExit(f"erase failed ({r.returncode}): {r.stderr[-500:]}")
    doc = json.loads(r.stdout)
    out = {}
    for label, report in zip(texts, doc["verify"]["texts"]):
        parts = []
        for f in report["found"]:
            if f["places"]:
                where = ", ".join(f"{n} {k}" for k, n in sorted(f["where"].items()))
                parts.append(f"{f['file']}: {f['places']} ({where})")
            else:
                parts.append(f"{f['file']}: pieces {f['pieces']['found']}/{f['pieces']['of']}")
        out[label] = "; ".join(parts) or "not found"
    if purge:
        p = doc["purge"] or {}
        out["(purge)"] = f"ran {p.get('command')} in {p.get('seconds')} s" if p.get("ran") else (doc.get("purge_error") or p.get("what", ""))[:80]
    return out


def show(step: str, found: dict[str, str]) -> None:
    print(f"  {step}")
    for label, where in found.items():
        print(f"      {label:<28} {where}")


def chroma_scenarios(tmp: Path, fillers: int) -> None:
    from tests.integration.conftest import Stack, unit_vectors

    chroma = start_chroma(tmp / "chroma")
    sidecar = start_sidecar(chroma.url, tmp / "ledger.db", POLICIES)
    try:
        s = Stack(chroma, sidecar, tmp / "ledger.db")
        t = s.tenant("bench")
        s.client(t.admin_key, t.name).create_collection("fast", configuration={"hnsw": {"sync_threshold": 2}})
        key = s.key(t.name, "f1", "a1", trust=1)
        slow = s.client(key, t.name).get_collection("mem")
        fast = s.client(key, t.name).get_collection("fast")
        m = {name: f"erase-marker {uuid.uuid4().hex} {name}" for name in
             ("default: text", "default: earlier text", "sync 2: text", "sync 2: earlier text")}
        data, led = chroma.data_dir, s.ledger_path
        assert data is not None
        print(f"chromadb {version('chromadb')}: tenant collections 'mem' (default hnsw sync_threshold 1000) and 'fast' "
              "(sync_threshold 2)")
        for col, prefix in ((slow, "default"), (fast, "sync 2")):
            col.add(ids=["gone", "kept"], documents=[m[f"{prefix}: earlier text"], "an unrelated memory"], embeddings=unit_vectors(2))
            col.update(ids=["gone"], documents=[m[f"{prefix}: text"]], embeddings=unit_vectors(1, seed=7))
        show("after add + update (both texts written; the row holds the later one)", verify(led, "chroma", data, m, False, tmp))
        for col in (slow, fast):
            col.delete(ids=["gone"])
        show("after the governed delete", verify(led, "chroma", data, m, False, tmp))
        # The purge while clients keep writing and querying another collection through the sidecar.
        busy = s.client(key, t.name).get_collection("fast")
        answered, failed, stop = [0], [], threading.Event()

        def load() -> None:
            i = 0
            while not stop.is_set():
                try:
                    busy.add(ids=[f"load{i}"], documents=[f"load {i}"], embeddings=unit_vectors(1, seed=10_000 + i))
                    busy.query(query_embeddings=unit_vectors(1, seed=20_000 + i), n_results=2)
                    answered[0] += 2
                except Exception as exc:  # counted, not raised: the figure is how many fail
                    failed.append(type(exc).__name__)
                i += 1

        worker = threading.Thread(target=load)
        worker.start()
        try:
            show("after memwarden erase (chroma vacuum), clients writing and querying meanwhile",
                 verify(led, "chroma", data, m, True, tmp))
        finally:
            stop.set()
            worker.join()
        print(f"      requests during the purge: {answered[0]} answered, {len(failed)} failed {sorted(set(failed))}")
        for i in range(0, fillers, 100):
            slow.add(ids=[f"z{j}" for j in range(i, i + 100)], documents=[f"filler {j}" for j in range(i, i + 100)],
                     embeddings=unit_vectors(100, seed=i))
        show(f"after {fillers} more records written to 'mem'", verify(led, "chroma", data, m, False, tmp))
        show("after memwarden erase again", verify(led, "chroma", data, m, True, tmp))
        counts = (slow.count(), busy.count())
    finally:
        sidecar.stop()
        chroma.stop()
    chroma = start_chroma(data)  # the purges ran while Chroma served: is everything there after a restart?
    try:
        import chromadb

        direct = chromadb.HttpClient(host="127.0.0.1", port=chroma.port, tenant=t.name,
                                     settings=chromadb.config.Settings(anonymized_telemetry=False))
        again = (direct.get_collection("mem").count(), direct.get_collection("fast").count())
        print(f"  rows before / after a Chroma restart: {counts} / {again}" + ("" if again == counts else "  MISMATCH"))
    finally:
        chroma.stop()


def mem0_scenarios(tmp: Path) -> None:
    import httpx

    for history in (None, ":memory:"):
        base = tmp / ("mem0-mem" if history else "mem0-disk")
        mem0 = start_mem0(base / "data", MEM0_KEY, history_db=history)
        env = {"MEMWARDEN_BACKEND": "mem0", "MEMWARDEN_BACKEND_AUTH_HEADER": "X-API-Key", "MEMWARDEN_BACKEND_TOKEN": MEM0_KEY}
        sidecar = start_sidecar(mem0.url, base / "ledger.db", POLICIES, extra_env=env)
        try:
            from sidecar.ledger import SQLiteLedger

            led = SQLiteLedger(base / "ledger.db")
            try:
                _, key = led.create_key("agent", "bench", "f1", "a1", 1)
            finally:
                led.close()
            m = {"text": f"erase-marker {uuid.uuid4().hex} text", "earlier text": f"erase-marker {uuid.uuid4().hex} earlier text"}
            data = mem0.data_dir
            assert data is not None
            print(f"mem0ai {version('mem0ai')} (history_db_path {history or 'DATA/history.db'})")
            with httpx.Client(base_url=sidecar.url, headers={"X-API-Key": key}, timeout=60, trust_env=False) as h:
                r = h.post("/memories", json={"messages": [{"role": "user", "content": m["earlier text"]}], "user_id": "u1", "infer": False})
                memory = r.json()["results"][0]["id"]
                assert h.put(f"/memories/{memory}", json={"text": m["text"]}).status_code == 200
                show("after add + update", verify(base / "ledger.db", "mem0", data, m, False, tmp))
                assert h.delete(f"/memories/{memory}").status_code == 200
            show("after the governed delete", verify(base / "ledger.db", "mem0", data, m, False, tmp))
            show("after memwarden erase", verify(base / "ledger.db", "mem0", data, m, True, tmp))
        finally:
            sidecar.stop()
            mem0.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["chroma", "mem0", "both"], default="both")
    parser.add_argument("--fillers", type=int, default=1000, help="records written to the default collection after the purge")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memwarden-erasure-") as d:
        tmp = Path(d)
        if args.profile in ("chroma", "both"):
            chroma_scenarios(tmp, args.fillers)
        if args.profile in ("mem0", "both"):
            mem0_scenarios(tmp)


if __name__ == "__main__":
    main()
