"""The policy set in force: metered decisions, hot reload (watch or SIGHUP) and shadow mode.

`PolicyHandle` stands where the stages expect a `PolicyEngine` (it has the same `decide`).

Reload: the policy directory is copied to a snapshot, the snapshot is loaded (parse + schema
validation, `PolicyEngine.load`) and checked with ``policy-check`` (the DESIGN §3 invariants and
the policy unit tests shipped in the directory); only when both pass does the new engine replace
the old one, in one reference assignment, so a request sees either the old or the new set, never a
mix. Anything else keeps the last known good set and is reported: a ``policy_reload_rejected`` log
event and ``memwarden_policy_reloads_total{result="invalid"|"invariant_violation"}``,
``memwarden_policy_last_reload_success 0``.

Shadow mode (dry run): every decision is evaluated, counted and logged, but a Deny is returned as
Allow so the request is forwarded as if allowed. Authentication, routing, tombstones and
the ledger's row states are still enforced: only Cedar's verdict is not.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from sidecar.errors import PolicyLoadError
from sidecar.metrics import Metrics
from sidecar.policy import CedarRequest, Decision, PolicyEngine

log = structlog.get_logger("memwarden.policy")

SHADOW_POLICY = "shadow-mode:would-deny"


def policy_digest(directory: Path) -> str:
    """SHA-256 over the names and bytes of every file under `directory` (sorted), for change detection."""
    h = hashlib.sha256()
    root = Path(directory)
    files: list[Path] = []
    # followlinks: a Kubernetes ConfigMap volume holds symlinks (``invariants -> ..data/invariants``);
    # hidden entries (``..data``, ``..2026_…``) are the kubelet's and are skipped.
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        files += [Path(dirpath) / f for f in filenames if not f.startswith(".")]
    for p in sorted(files):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def check_invariants(directory: Path, timeout_s: float) -> tuple[bool, str]:
    """Run ``policy-check DIRECTORY`` (this interpreter); (passed, last lines of its output)."""
    with tempfile.TemporaryDirectory(prefix="mw-policy-check-") as tmp:
        cmd = [sys.executable, "-c", "from invariants.cli import main; main()", str(directory),
               "--format", "text", "--counterexamples", str(Path(tmp) / "cx")]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False, f"policy-check did not finish within {timeout_s}s"
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
    return proc.returncode == 0, tail


class PolicyHandle:
    """The engine in force plus its reload and shadow state. Thread-safe; `decide` never raises."""

    def __init__(self, directory: Path, metrics: Metrics, *, shadow: bool = False, check: bool = True,
                 check_timeout_s: float = 120.0, engine: PolicyEngine | None = None) -> None:
        self.directory = Path(directory)
        self.metrics = metrics
        self.shadow = shadow
        self.check = check
        self.check_timeout_s = check_timeout_s
        self._lock = threading.Lock()
        self.digest = policy_digest(self.directory)
        self.engine = engine or PolicyEngine.load(self.directory)
        self.loaded_at = time.time()
        self.last_error: str | None = None
        self._rejected_digest: str | None = None
        metrics.set_policy_set(self.digest)
        metrics.shadow_mode.set(1 if shadow else 0)
        if shadow:
            log.warning("shadow_mode_enabled", message="SHADOW MODE: Cedar decisions are logged but NOT enforced")

    # -- decisions --------------------------------------------------------------------------
    def decide(self, requests: list[CedarRequest], entities: list[dict[str, Any]]) -> list[Decision]:
        engine = self.engine  # one read: the whole batch is decided by one policy set
        t0 = time.perf_counter()
        decisions = engine.decide(requests, entities)
        self.metrics.observe_cedar([r.action for r in requests], [d.allowed for d in decisions], time.perf_counter() - t0)
        if not self.shadow:
            return decisions
        denied = [(r, d) for r, d in zip(requests, decisions) if not d.allowed]
        if not denied:
            return decisions
        for action in {r.action for r, _ in denied}:
            self.metrics.shadow_would_deny.labels(action).inc(sum(1 for r, _ in denied if r.action == action))
        log.warning("shadow_would_deny", principal=f"{denied[0][0].principal[0]}::{denied[0][0].principal[1]}",
                    actions=sorted({r.action for r, _ in denied}), count=len(denied),
                    resources=[f"{r.resource[0]}::{r.resource[1]}" for r, _ in denied[:20]],
                    policies=sorted({p for _, d in denied for p in d.policies}),
                    errors=[e for _, d in denied for e in d.errors][:5])
        return [d if d.allowed else Decision(True, (*d.policies, SHADOW_POLICY), d.errors) for d in decisions]

    # -- reload -----------------------------------------------------------------------------
    def reload(self, force: bool = False) -> str:
        """Try to replace the policy set from `directory`. Returns ``ok``, ``unchanged``, ``invalid``,
        ``invariant_violation`` or ``error`` (policy-check could not run); a failure keeps the last
        known good set."""
        with self._lock:
            try:
                digest = policy_digest(self.directory)
            except OSError as exc:
                return self._reject("invalid", f"policy directory unreadable: {exc}")
            if digest == self.digest and not force:
                self.metrics.policy_reloads.labels("unchanged").inc()
                return "unchanged"
            with tempfile.TemporaryDirectory(prefix="mw-policies-") as tmp:
                snapshot = Path(tmp) / "policies"
                try:
                    shutil.copytree(self.directory, snapshot, symlinks=False,
                                    ignore=shutil.ignore_patterns(".*"))
                    if policy_digest(snapshot) != digest:
                        return self._reject("invalid", "policy directory changed while it was being read; will retry")
                    engine = PolicyEngine.load(snapshot)
                except (PolicyLoadError, OSError) as exc:
                    return self._reject("invalid", str(exc), digest)
                if self.check:
                    try:
                        passed, output = check_invariants(snapshot, self.check_timeout_s)
                    except Exception as exc:  # policy-check could not run: not proved, so not applied
                        return self._reject("error", f"policy-check did not run: {exc}", digest)
                    if not passed:
                        return self._reject("invariant_violation", output, digest)
            self.engine = engine
            old, self.digest = self.digest, digest
            self.loaded_at, self.last_error = time.time(), None
            self.metrics.policy_reloads.labels("ok").inc()
            self.metrics.policy_last_reload_ok.set(1)
            self.metrics.set_policy_set(digest)
            log.info("policy_reloaded", old_sha256=old, sha256=digest, invariants_checked=self.check)
            return "ok"

    def _reject(self, result: str, detail: str, digest: str | None = None) -> str:
        self.last_error = f"{result}: {detail}"
        if digest is not None:
            self._rejected_digest = digest
        self.metrics.policy_reloads.labels(result).inc()
        self.metrics.policy_last_reload_ok.set(0)
        log.error("policy_reload_rejected", result=result, detail=detail[-2000:], kept_sha256=self.digest)
        return result

    async def watch(self, interval_s: float) -> None:
        """Poll the directory every `interval_s` seconds and reload when its content changed
        (works with Kubernetes ConfigMap symlink swaps). A rejected content is not retried until it changes."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                digest = await asyncio.to_thread(policy_digest, self.directory)
            except OSError:
                continue
            if digest != self.digest and digest != self._rejected_digest:
                try:
                    await asyncio.to_thread(self.reload)
                except Exception:  # never let the watcher die; reload() itself reports failures
                    log.exception("policy_watch_error")

    def status(self) -> dict[str, Any]:
        return {"sha256": self.digest, "loaded_at": self.loaded_at, "last_reload_error": self.last_error,
                "shadow_mode": self.shadow}
