"""README "In front of the Chroma you already run", executed as written: its `memwarden keys create` and
`memwarden adopt` lines and its rules file, against a real `chroma run` holding rows written straight into it,
then the official client through a real sidecar (started as `memwarden serve`, on 127.0.0.1)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import chromadb
import pytest

from memwarden_eval.harness import Server, start_chroma, start_sidecar
from tests.integration.conftest import chroma_client, unit_vectors

pytestmark = pytest.mark.integration
README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text()
    start = text.index("## In front of the Chroma you already run")
    return text[start:text.index("\n## ", start + 1)]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), re.S)


def _commands(prefix: str) -> list[list[str]]:
    """The `memwarden <prefix> …` lines of the section's sh blocks, comments removed."""
    out = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith(f"memwarden {prefix}"):
                out.append(shlex.split(line)[1:])
    return out


# Rows as the team wrote them, straight into Chroma (no memwarden): id → (metadata, document)
ROWS = {
    "t-private": ({"agent": "triage", "visibility": "private"}, "triage's own notes on ticket 41"),
    "red-team": ({"team": "red", "visibility": "team"}, "red fleet: escalate VIP tickets to tier 2"),
    "blue-team": ({"team": "blue", "visibility": "team"}, "blue fleet: refunds above 500 need a second approver"),
    "public": ({"visibility": "public"}, "office closed on the 24th"),
    "no-visibility": ({"team": "red"}, "red fleet: old macro list"),
    "secret": ({"team": "red", "visibility": "secret"}, "the vault combination"),
}


@pytest.fixture(scope="module")
def existing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A Chroma server with a collection `support` (default tenant and database) the team already uses."""
    chroma = start_chroma(tmp_path_factory.mktemp("walkthrough") / "chroma")
    coll = chroma_client(chroma.port, "default_tenant").create_collection("support")
    vecs = unit_vectors(len(ROWS), seed=24)
    coll.add(ids=list(ROWS), embeddings=vecs, metadatas=[m for m, _ in ROWS.values()],
             documents=[d for _, d in ROWS.values()])
    yield chroma
    chroma.stop()


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_the_walkthrough_as_written(existing: Server, tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MEMWARDEN_")},
           "MEMWARDEN_BACKEND_URL": existing.url, "MEMWARDEN_LEDGER_PATH": str(tmp_path / "ledger.db"), "COLUMNS": "200"}
    # 1. the sidecar in front; before adoption the collection is refused, not adopted silently
    side = start_sidecar(existing.url, tmp_path / "ledger.db", Path(__file__).resolve().parents[2] / "policies")
    try:
        # 2. the keys, as the README creates them
        keys: dict[str, str] = {}
        creates = _commands("keys create")
        assert len(creates) >= 3
        for args in creates:
            proc = _run(args, env, tmp_path)
            assert proc.returncode == 0, proc.stderr
            name = args[args.index("--agent") + 1] if "--agent" in args else "admin"
            keys[name] = proc.stdout.strip()
        client = {name: chromadb.HttpClient(host="127.0.0.1", port=side.port, headers={"X-API-Key": key},
                                            settings=chromadb.config.Settings(anonymized_telemetry=False))
                  for name, key in keys.items()}
        with pytest.raises(Exception) as refused:
            client["triage"].get_collection("support")
        assert "adopt it first" in str(refused.value), refused.value

        # 3. adopt with the README's rules file: dry run, then the real run, then once more
        (rules,) = _blocks("toml")
        (tmp_path / "adopt.toml").write_text(rules)
        dry, real = _commands("adopt")
        assert "--dry-run" in dry and "--dry-run" not in real
        out = _run(dry, env, tmp_path)
        assert out.returncode == 0, out.stderr
        assert re.search(r"would adopt 5\b", out.stdout) and re.search(r"not covered 1\b", out.stdout), out.stdout
        assert "secret" in out.stdout
        out = _run(real, env, tmp_path)
        assert out.returncode == 0 and re.search(r"\badopted 5\b", out.stdout), out.stdout + out.stderr
        assert (tmp_path / "adopt-report.json").exists()
        again = _run(real, env, tmp_path)                             # idempotent: nothing new, nothing changed
        assert again.returncode == 0, again.stderr
        assert re.search(r"\badopted 0\b", again.stdout) and re.search(r"already governed 5\b", again.stdout), again.stdout

        # 4. the clients, changed only in host, port and key; the default tenant is the data's tenant
        def readable(name: str) -> list[str]:
            return sorted(client[name].get_collection("support").get()["ids"])

        assert readable("triage") == ["no-visibility", "public", "red-team", "t-private"]
        assert readable("billing") == ["blue-team", "public"]
        assert readable("importer") == ["no-visibility", "public", "red-team"]
        assert sorted(client["admin"].get_collection("support").get()["ids"]) == sorted(set(ROWS) - {"secret"})
        billing = client["billing"].get_collection("support")
        assert billing.get(ids=["red-team"])["ids"] == billing.get(ids=["never-written"])["ids"] == []
        hits = client["triage"].get_collection("support").query(query_embeddings=unit_vectors(1, seed=5), n_results=4)
        assert sorted(hits["ids"][0]) == readable("triage")          # n_results over readable rows
        # what changes for agents: writes are stamped, mw_scope is a request, a delete is final
        mine = client["triage"].get_collection("support")
        mine.add(ids=["new"], embeddings=unit_vectors(1, seed=9), documents=["follow-up"], metadatas=[{"mw_scope": "agent"}])
        assert mine.get(ids=["new"], include=["metadatas"])["metadatas"][0]["mw_owner"] == "default_tenant/red/triage"
        mine.delete(ids=["new"])
        with pytest.raises(Exception):
            mine.add(ids=["new"], embeddings=unit_vectors(1, seed=9), documents=["again"])
    finally:
        side.stop()
