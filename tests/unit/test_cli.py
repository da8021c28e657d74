"""`memwarden keys` and start-up failure of `memwarden serve` (the command line a user runs)."""

from __future__ import annotations

import json

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from sidecar.cli import app
from sidecar.ledger import SQLiteLedger

runner = CliRunner()


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    db = str(tmp_path / "l.db")
    out = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--fleet", "red", "--agent", "a1", "--trust", "2", "--ledger", db])
    assert out.exit_code == 0, out.output
    key = out.stdout.strip().splitlines()[0]
    assert key.startswith("mwk_")
    ledger = SQLiteLedger(db)
    p = ledger.authenticate(key)
    assert p is not None and (p.tenant, p.fleet, p.agent, p.trust) == ("acme", "red", "a1", 2)
    listed = runner.invoke(app, ["keys", "list", "--ledger", db])
    assert listed.exit_code == 0 and "acme" in listed.output
    assert key.split(".", 1)[1] not in listed.output  # the secret is shown once, at creation only
    key_id = key[4:].split(".", 1)[0]
    assert runner.invoke(app, ["keys", "revoke", key_id, "--ledger", db]).exit_code == 0
    assert ledger.authenticate(key) is None
    assert runner.invoke(app, ["keys", "revoke", key_id, "--ledger", db]).exit_code == 1
    admin = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--admin", "--ledger", db])
    assert admin.exit_code == 0 and ledger.authenticate(admin.stdout.strip().splitlines()[0]).kind == "admin"  # type: ignore[union-attr]


def test_keys_create_rejects_bad_input(tmp_path: Path) -> None:
    db = str(tmp_path / "l.db")
    assert runner.invoke(app, ["keys", "create", "--tenant", "acme", "--ledger", db]).exit_code == 2
    assert runner.invoke(app, ["keys", "create", "--tenant", "acme", "--admin", "--fleet", "f", "--ledger", db]).exit_code == 2
    assert runner.invoke(app, ["keys", "create", "--tenant", "a/b", "--fleet", "f", "--agent", "x", "--ledger", db]).exit_code == 2
    assert runner.invoke(app, ["keys", "create", "--tenant", "a", "--fleet", "f", "--agent", "x", "--trust", "7", "--ledger", db]).exit_code == 2


def test_keys_create_with_roles(tmp_path: Path) -> None:
    db = str(tmp_path / "l.db")
    out = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--fleet", "red", "--agent", "a1", "--trust", "1",
                              "--role", "pii-reader", "--role", "oncall", "--ledger", db])
    assert out.exit_code == 0, out.output
    p = SQLiteLedger(db).authenticate(out.stdout.strip().splitlines()[0])
    assert p is not None and p.roles == ("oncall", "pii-reader")
    listed = runner.invoke(app, ["keys", "list", "--ledger", db, "--format", "json"])
    assert [json.loads(line)["roles"] for line in listed.stdout.splitlines()] == [["oncall", "pii-reader"]], listed.output
    bad = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--fleet", "red", "--agent", "a2", "--role", "has space",
                              "--ledger", db])
    assert bad.exit_code == 2 and "role" in bad.output, bad.output
    bad = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--admin", "--role", "auditor", "--ledger", db])
    assert bad.exit_code == 2 and "roles" in bad.output, bad.output
    assert len(SQLiteLedger(db).list_keys()) == 1


def test_serve_refuses_to_start_with_invalid_policies(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    schema = Path(__file__).resolve().parents[2] / "policies" / "memwarden.cedarschema"
    (policies / "s.cedarschema").write_text(schema.read_text())
    (policies / "p.cedar").write_text('permit(principal, action, resource) when { resource.nonexistent == "x" };')
    proc = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", "1", "--policies", str(policies),
                           "--ledger", str(tmp_path / "l.db")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "policy set refused (invalid)" in out and f"{policies}/p.cedar:1" in out and "nonexistent" in out
    assert "mw-policies-" not in out  # the operator's path, never the snapshot's
