"""Issue 34, finding 12, through the command line (each case a `python -m sidecar.cli` process of this tree):

- every command that opens the ledger, given an unreachable PostgreSQL or a database that does not exist,
  prints one line naming the URL without its password and what to check, and exits non-zero (1; 3 for
  ``authz check``, whose 1 means deny) — no traceback;
- a ``.env`` in the working directory is read for its ``MEMWARDEN_*`` keys only: other programs' keys there
  (``OPENAI_API_KEY=…``) stop nothing, an unknown ``MEMWARDEN_*`` key or a bad value is refused in one line
  naming the key and the file."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sidecar.ledger import SQLiteLedger

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "hunter2-not-shown"


def memwarden(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`memwarden ARGS` of this tree in `cwd`, with only `env` set besides PATH and PYTHONPATH."""
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
                                            "HOME": str(cwd), **env})


def rules(tmp: Path) -> tuple[str, str]:
    (tmp / "chroma.toml").write_text('tenant = "x"\n[[collection]]\nname = "c"\n')
    (tmp / "mem0.toml").write_text('tenant = "x"\n')
    return str(tmp / "chroma.toml"), str(tmp / "mem0.toml")


# Every command that opens the ledger, and its exit status when it cannot.
COMMANDS = {
    "serve": (["serve", "--port", "1"], 1),
    "keys create": (["keys", "create", "--tenant", "t", "--admin"], 1),
    "keys list": (["keys", "list"], 1),
    "keys revoke": (["keys", "revoke", "0123456789abcdef"], 1),
    "ledger migrate": (["ledger", "migrate"], 1),
    "authz check": (["authz", "check", "--key-id", "0123456789abcdef", "--action", "read"], 3),
    "adopt chroma": (["adopt", "chroma", "--rules", "CHROMA_RULES"], 1),
    "adopt mem0": (["adopt", "mem0", "--rules", "MEM0_RULES"], 1),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("where", ["unreachable", "no-database"])
def test_a_ledger_that_cannot_be_opened_is_one_line(tmp_path: Path, command: str, where: str) -> None:
    database = f"mw_missing_{uuid.uuid4().hex[:8]}"
    # Nothing listens on port 1; the test cluster on 5432 trusts local connections (the password is not checked).
    host = "127.0.0.1:1" if where == "unreachable" else "127.0.0.1:5432"
    url = f"postgresql://postgres:{PASSWORD}@{host}/{database}"
    chroma_rules, mem0_rules = rules(tmp_path)
    args, status = COMMANDS[command]
    args = [chroma_rules if a == "CHROMA_RULES" else mem0_rules if a == "MEM0_RULES" else a for a in args]
    r = memwarden(tmp_path, *args, MEMWARDEN_LEDGER_URL=url, MEMWARDEN_LEDGER_TIMEOUT_S="1",
                  MEMWARDEN_METRICS_PORT="0")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == status and len(lines) == 1, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr
    line = lines[0]
    assert f"postgresql://postgres:***@{host}/{database} unavailable: " in line and PASSWORD not in line
    assert "check MEMWARDEN_LEDGER_URL" in line
    if where == "unreachable":
        assert "Connection refused" in line
    else:
        assert f'database "{database}" does not exist' in line


def test_an_sqlite_ledger_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("a file where the ledger's directory should be")
    r = memwarden(tmp_path, "keys", "list", "--ledger", str(tmp_path / "not-a-dir" / "ledger.db"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"ledger {tmp_path / 'not-a-dir' / 'ledger.db'}: " in lines[0] and "MEMWARDEN_LEDGER_PATH" in lines[0]


def test_dotenv_keys_of_other_programs_are_ignored(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("OPENAI_API_KEY=sk-not-ours\nANTHROPIC_API_KEY=also-not-ours\n"
                                   "export AWS_REGION=eu-west-1\nMEMWARDEN_LEDGER_PATH=from-dotenv.db\n")
    r = memwarden(tmp_path, "keys", "create", "--tenant", "t", "--admin")
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert key.startswith("mwk_")
    led = SQLiteLedger(tmp_path / "from-dotenv.db")  # the MEMWARDEN_ key of .env was read
    try:
        assert led.authenticate(key) is not None
    finally:
        led.close()


def test_a_wrong_key_in_dotenv_names_the_file(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("OPENAI_API_KEY=sk-not-ours\nMEMWARDEN_BACKEND_ULR=http://typo:1\n")
    r = memwarden(tmp_path, "keys", "list")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"memwarden: configuration refused: variable MEMWARDEN_BACKEND_ULR in {env_file}: not a memwarden setting"]
    env_file.write_text("OPENAI_API_KEY=sk-not-ours\nMEMWARDEN_BACKEND=chromadb\n")
    r = memwarden(tmp_path, "keys", "list")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"backend (MEMWARDEN_BACKEND in {env_file}): " in r.stderr and "chromadb" not in r.stderr
    # The environment wins over .env: a good value there is used, and the file is not blamed for it.
    r = memwarden(tmp_path, "keys", "list", MEMWARDEN_BACKEND="mem0")
    assert r.returncode == 0, r.stderr
    r = memwarden(tmp_path, "keys", "list", MEMWARDEN_BACKEND="nope")
    assert r.returncode == 2 and "backend (MEMWARDEN_BACKEND): " in r.stderr and str(env_file) not in r.stderr
