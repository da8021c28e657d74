"""The policy set in force: one admission gate (start-up and reload), metered decisions, shadow mode.

`PolicyHandle` stands where the stages expect a `PolicyEngine` (it has the same `decide`).

Admission (`admit`), the only way a policy set comes into force — at start-up (the app factory,
so ``memwarden serve``, ``memwarden stack``, the demo and every test build go through it) and on
every reload: the policy directory (and ``INVARIANTS_DIR``) is copied to a snapshot; the snapshot is
checked by the gate of ``invariants.gate`` in a subprocess with a timeout (parse, Cedar schema
validation, every invariant — the package's baseline, the directory's own, the pinned ones — and the
policy unit tests, answered as JSON naming the operator's paths, never the snapshot's); only a set
that passes is loaded into a `PolicyEngine`. There is no switch that skips the check. A set that
passed is remembered for the process by the SHA-256 of everything the gate read (policy directory,
pinned invariants, baseline), so building another app on the same set does not re-run the prover.

At start-up a refused set raises `PolicyRefused` (``memwarden serve`` exits 2 with every problem, one
line each). On reload it keeps the last known good set and is reported: a ``policy_reload_rejected``
log event, ``memwarden_policy_reloads_total{result=...}`` (``invalid``, ``invariant_violation``,
``test_failed``, ``unproved``, ``error``), ``memwarden_policy_last_reload_success 0``. The new engine
replaces the old one in one reference assignment, so a request (which pins the set on its first
decision) is decided by one set, never a mix.

Every Cedar evaluation error seen at runtime is counted (``memwarden_cedar_evaluation_errors_total
{action,policy}``) and reaches the decision log, in shadow mode too.

Shadow mode (dry run, ``SHADOW_MODE=reads|all``): every decision is evaluated, counted and logged, and a
Deny of a shadowed action is returned as an Allow marked `Decision.would_deny` — except a request across
tenants (principal and resource, or a redistribute's target fleet, in different tenants, or a tenant that
cannot be read off the entity store): tenant isolation stays enforced. ``reads`` shadows the read actions
only (`SHADOW_READS`: read, list, search), so a denied write, update, redistribution or delete is refused as
in enforcement and shadow mode never overwrites or destroys data a policy protects; ``all`` shadows every
action. Authentication, routing, tombstones and the ledger's row states are enforced as always.

Only an evaluation error of a policy counts as one (``memwarden_cedar_evaluation_errors_total``). A request
the schema makes not applicable (`sidecar.policy.NOT_APPLICABLE`: an operator on a tenant route, an action
the schema does not declare such as ``reassert``) is a deny of its own, counted in
``memwarden_cedar_not_applicable_total{action,principal_type}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import structlog

from invariants.gate import GateResult
from invariants.project import BASELINE_DIR
from sidecar.errors import PolicyLoadError
from sidecar.metrics import Metrics
from sidecar.policy import NOT_APPLICABLE, CedarRequest, Decision, PolicyEngine

log = structlog.get_logger("memwarden.policy")

SHADOW_POLICY = "shadow-mode:would-deny"
# The actions ``SHADOW_MODE=reads`` shadows: those that only read (rows, a collection's listing, a search).
SHADOW_READS = frozenset({"read", "list", "search"})
SHADOW_MODES = {False: "off", True: "reads", "off": "off", "reads": "reads", "all": "all"}

# Gate results that passed, by the SHA-256 of everything the gate read (see `admit`).
_ADMITTED: dict[str, GateResult] = {}
_ADMITTED_LOCK = threading.Lock()


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


class PolicyRefused(PolicyLoadError):
    """The gate refused a policy set. `result` is the gate status (``invalid``, ``invariant_violation``,
    ``test_failed``, ``unproved``) or ``error`` (the check could not run); `problems` one line each."""

    def __init__(self, result: str, problems: list[str], directory: Path) -> None:
        self.result, self.problems, self.directory = result, list(problems), Path(directory)
        super().__init__(f"policy set in {directory} refused ({result}):\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class PolicySet:
    """One admitted policy set: its engine, the SHA-256 of the policy directory (`sha256`, as in
    readyz and the decision log), when it came into force (Unix seconds) and the gate's answer."""

    engine: PolicyEngine
    sha256: str
    loaded_at: float
    gate: GateResult
    source: str  # digest of policy directory + pinned invariants: what the watcher compares


def run_gate(snapshot: Path, display: Path, pinned: Path | None, pinned_display: Path | None,
             timeout_s: float) -> GateResult:
    """``python -m invariants.gate`` on `snapshot` in a subprocess (this interpreter), killed after
    `timeout_s` seconds; its JSON answer, or a result with status ``error`` saying why there is none."""
    cmd = [sys.executable, "-m", "invariants.gate", str(snapshot), "--display", f"{snapshot}={display}"]
    if pinned is not None:
        cmd += ["--invariants", str(pinned), "--display", f"{pinned}={pinned_display}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return GateResult("error", [f"policy-check did not finish within {timeout_s:g} s "
                                    "(MEMWARDEN_POLICY_CHECK_TIMEOUT_S)"])
    lines = proc.stdout.strip().splitlines()
    try:
        res = GateResult.from_json(json.loads(lines[-1]))
    except (IndexError, ValueError):
        err = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}")
        return GateResult("error", [f"policy-check could not run: {line}" for line in err.splitlines()])
    if (proc.returncode == 0) != res.passed:
        return GateResult("error", [f"policy-check answered {res.status} with exit status {proc.returncode}"])
    return res


def admit(directory: Path, invariants_dir: Path | None = None, timeout_s: float = 120.0) -> PolicySet:
    """Bring the policy set in `directory` through the gate (module docstring); raises `PolicyRefused`."""
    directory = Path(directory)
    pinned_dir = Path(invariants_dir) if invariants_dir is not None else None
    try:
        digest = policy_digest(directory)
        pinned_digest = policy_digest(pinned_dir) if pinned_dir is not None else ""
        if pinned_dir is not None and not pinned_dir.is_dir():
            raise PolicyRefused("invalid", [f"INVARIANTS_DIR {pinned_dir}: not a directory"], directory)
        if not directory.is_dir():
            raise PolicyRefused("invalid", [f"POLICIES_DIR {directory}: not a directory"], directory)
    except OSError as exc:
        raise PolicyRefused("invalid", [f"policy directory unreadable: {exc}"], directory) from exc
    source = hashlib.sha256(f"{digest}:{pinned_digest}".encode()).hexdigest()
    with tempfile.TemporaryDirectory(prefix="mw-policies-") as tmp:
        snapshot = Path(tmp) / "policies"
        pinned = Path(tmp) / "invariants" if pinned_dir is not None else None
        try:
            shutil.copytree(directory, snapshot, symlinks=False, ignore=shutil.ignore_patterns(".*"))
            if pinned is not None and pinned_dir is not None:
                shutil.copytree(pinned_dir, pinned, symlinks=False, ignore=shutil.ignore_patterns(".*"))
            if policy_digest(snapshot) != digest or (pinned is not None and policy_digest(pinned) != pinned_digest):
                raise PolicyRefused("invalid", ["policy directory changed while it was being read; will retry"],
                                    directory)
        except OSError as exc:
            raise PolicyRefused("invalid", [f"policy directory unreadable: {exc}"], directory) from exc
        key = hashlib.sha256(f"{source}:{policy_digest(BASELINE_DIR)}".encode()).hexdigest()
        with _ADMITTED_LOCK:
            gate = _ADMITTED.get(key)
        if gate is None:
            gate = run_gate(snapshot, directory, pinned, pinned_dir, timeout_s)
            if not gate.passed:
                raise PolicyRefused(gate.status, gate.problems, directory)
            with _ADMITTED_LOCK:
                _ADMITTED[key] = gate
        try:
            engine = PolicyEngine.load(snapshot, display=directory)
        except PolicyLoadError as exc:
            raise PolicyRefused("invalid", [str(exc).replace(str(snapshot), str(directory))], directory) from exc
    # Rows are decided per governance class only when the gate proved no policy tells them apart.
    engine.row_classes = frozenset(gate.row_classes) if gate.row_classes is not None else None
    return PolicySet(engine, digest, time.time(), gate, source)


def _tenant_of(uid: dict[str, Any] | None, by_uid: dict[tuple[str, str], dict[str, Any]]) -> str | None:
    if not isinstance(uid, dict):
        return None
    entity = by_uid.get((uid.get("type", ""), uid.get("id", "")))
    ref = (entity or {}).get("attrs", {}).get("tenant")
    if entity is not None and entity["uid"]["type"] == "Tenant":
        return str(entity["uid"]["id"])
    return str(ref["__entity"]["id"]) if isinstance(ref, dict) and "__entity" in ref else None


def same_tenant(request: CedarRequest, by_uid: dict[tuple[str, str], dict[str, Any]]) -> bool:
    """Whether the principal, the resource and every entity named in the context (a redistribute's
    target fleet) belong to one tenant, read off the entity store; False when any is unknown."""
    mine = _tenant_of({"type": request.principal[0], "id": request.principal[1]}, by_uid)
    if mine is None or _tenant_of({"type": request.resource[0], "id": request.resource[1]}, by_uid) != mine:
        return False
    for value in (request.context or {}).values():
        if isinstance(value, dict) and "__entity" in value and _tenant_of(value["__entity"], by_uid) != mine:
            return False
    return True


class PolicyHandle:
    """The policy set in force plus its reload and shadow state. Thread-safe; `decide` never raises.
    Construction admits `directory` (raises `PolicyRefused`)."""

    # The actions whose denials shadow mode turns into would-deny allows; None: every action (``all``).
    shadow_actions: frozenset[str] | None = None

    def __init__(self, directory: Path, metrics: Metrics, *, shadow: bool | str = False,
                 invariants_dir: Path | None = None, check_timeout_s: float = 120.0) -> None:
        """`shadow`: ``off``, ``reads`` or ``all`` (`Settings.shadow_mode`; True = ``reads``, False = ``off``).
        Raises `PolicyRefused` (the set in `directory` fails the gate), ValueError (another `shadow`)."""
        self.directory = Path(directory)
        self.invariants_dir = Path(invariants_dir) if invariants_dir is not None else None
        self.metrics = metrics
        if shadow not in SHADOW_MODES:
            raise ValueError(f"shadow mode {shadow!r}: off, reads or all")
        self.shadow_mode = SHADOW_MODES[shadow]
        self.shadow = self.shadow_mode != "off"
        self.shadow_actions = SHADOW_READS if self.shadow_mode == "reads" else None
        self.check_timeout_s = check_timeout_s
        self._lock = threading.Lock()
        self.current: PolicySet = admit(self.directory, self.invariants_dir, check_timeout_s)
        self.last_error: str | None = None
        self.last_problems: list[str] = []
        self._rejected_source: str | None = None
        metrics.set_policy_set(self.current.sha256)
        metrics.shadow_mode.set({"off": 0, "reads": 1, "all": 2}[self.shadow_mode])
        if self.shadow_mode == "reads":
            log.warning("shadow_mode_enabled", shadow_mode="reads", message="SHADOW MODE (reads): Cedar denials of "
                        "read, list and search are logged but NOT enforced; writes, updates and deletes are "
                        "(tenant isolation, authentication and the ledger too)")
        elif self.shadow_mode == "all":
            log.warning("shadow_mode_enabled", shadow_mode="all", message="SHADOW MODE (all): Cedar denials are "
                        "logged but NOT enforced, writes and deletes included: data the policies protect can be "
                        "overwritten or destroyed (tenant isolation, authentication and the ledger are enforced)")

    @property
    def mode(self) -> str:
        """The decision log's and readyz's ``mode``: ``enforce``, ``shadow`` (reads) or ``shadow-all``."""
        return {"off": "enforce", "reads": "shadow", "all": "shadow-all"}[getattr(self, "shadow_mode", "reads" if self.shadow else "off")]

    def shadows(self, action: str) -> bool:
        """Whether a denial of `action` is turned into a would-deny allow (shadow mode, and `action` shadowed)."""
        return self.shadow and (self.shadow_actions is None or action in self.shadow_actions)

    @property
    def engine(self) -> PolicyEngine:
        return self.current.engine

    @property
    def digest(self) -> str:
        return self.current.sha256

    # -- decisions --------------------------------------------------------------------------
    def decide(self, requests: list[CedarRequest], entities: list[dict[str, Any]],
               policy_set: PolicySet | None = None) -> list[Decision]:
        """Decide with `policy_set` (default: the one in force); metered; shadow mode applied."""
        ps = policy_set or self.current  # one read: the whole batch is decided by one policy set
        t0 = time.perf_counter()
        decisions = ps.engine.decide(requests, entities)
        self.metrics.observe_cedar([r.action for r in requests], [d.allowed for d in decisions], time.perf_counter() - t0)
        for r, d in zip(requests, decisions):
            if d.error_policies or d.reason == NOT_APPLICABLE:
                self._count_errors(r.action, r.principal[0], d)
        if not self.shadow or all(d.allowed for d in decisions):
            return decisions
        by_uid = {(e["uid"]["type"], e["uid"]["id"]): e for e in entities}
        out = []
        scope = self.shadow_actions
        for r, d in zip(requests, decisions):
            if d.allowed or (scope is not None and r.action not in scope) or d.reason == NOT_APPLICABLE \
                    or not same_tenant(r, by_uid):
                out.append(d)  # tenant isolation, and actions shadow mode does not cover, are enforced
                continue
            self.metrics.shadow_would_deny.labels(r.action).inc()
            out.append(dataclasses.replace(d, allowed=True, policies=(*d.policies, SHADOW_POLICY), would_deny=True))
        return out

    def decide_request(self, key: Any, action: str, request: Callable[[], CedarRequest],
                       entities: Callable[[], list[dict[str, Any]]], policy_set: PolicySet | None = None) -> Decision:
        """`decide` of one request of `action` whose answer `key` determines (`PolicyEngine.decide_keyed`:
        equal keys, equal request and entity list); ``request()`` (the `CedarRequest`) and ``entities()``
        are called only when the answer is not memoised, or in shadow mode (which reads the entities).
        Metered as `decide`."""
        ps = policy_set or self.current
        if self.shadow and (self.shadow_actions is None or action in self.shadow_actions):
            return self.decide([request()], entities(), ps)[0]
        t0 = time.perf_counter()
        decision = ps.engine.decide_keyed(key, request, entities)
        self.metrics.observe_cedar_one(action, decision.allowed, time.perf_counter() - t0)
        if decision.error_policies or decision.reason == NOT_APPLICABLE:
            self._count_errors(action, None, decision, request)
        return decision

    def _count_errors(self, action: str, principal_type: str | None, d: Decision,
                       request: Callable[[], CedarRequest] | None = None) -> None:
        """Count an answer's evaluation errors (``cedar_evaluation_errors_total{action,policy}``, one per erroring
        policy; an Allow may have some: an erroring forbid is skipped), or a request the schema makes not applicable (``cedar_not_applicable_total{action,
        principal_type}``; the principal type from `request` when not given)."""
        for pid in d.error_policies:
            self.metrics.cedar_evaluation_errors.labels(action, pid).inc()
        if d.reason == NOT_APPLICABLE:
            if principal_type is None:
                principal_type = request().principal[0] if request is not None else "unknown"
            self.metrics.cedar_not_applicable.labels(action, principal_type).inc()

    # -- reload -----------------------------------------------------------------------------
    def reload(self, force: bool = False) -> str:
        """Try to replace the policy set from `directory` through the gate. Returns ``ok``, ``unchanged``
        or the refusal's result (``invalid``, ``invariant_violation``, ``test_failed``, ``unproved``,
        ``error``); a refusal keeps the last known good set."""
        with self._lock:
            try:
                source = self._source()
            except OSError as exc:
                return self._reject("invalid", [f"policy directory unreadable: {exc}"])
            if source == self.current.source and not force:
                self.metrics.policy_reloads.labels("unchanged").inc()
                return "unchanged"
            try:
                new = admit(self.directory, self.invariants_dir, self.check_timeout_s)
            except PolicyRefused as exc:
                return self._reject(exc.result, exc.problems, source)
            except Exception as exc:  # the gate could not run: not proved, so not applied
                return self._reject("error", [f"policy-check did not run: {exc}"], source)
            old, self.current = self.current, new
            self.last_error, self.last_problems = None, []
            self.metrics.policy_reloads.labels("ok").inc()
            self.metrics.policy_last_reload_ok.set(1)
            self.metrics.set_policy_set(new.sha256)
            log.info("policy_reloaded", old_sha256=old.sha256, sha256=new.sha256, invariants=new.gate.invariants,
                     baseline_invariants=new.gate.baseline, policy_tests=new.gate.tests)
            return "ok"

    def _source(self) -> str:
        pinned = policy_digest(self.invariants_dir) if self.invariants_dir is not None else ""
        return hashlib.sha256(f"{policy_digest(self.directory)}:{pinned}".encode()).hexdigest()

    def _reject(self, result: str, problems: list[str], source: str | None = None) -> str:
        self.last_error = f"{result}: " + "; ".join(problems)
        self.last_problems = list(problems)
        if source is not None:
            self._rejected_source = source
        self.metrics.policy_reloads.labels(result).inc()
        self.metrics.policy_last_reload_ok.set(0)
        log.error("policy_reload_rejected", result=result, problems=problems, directory=str(self.directory),
                  kept_sha256=self.current.sha256)
        return result

    async def watch(self, interval_s: float) -> None:
        """Poll the directories every `interval_s` seconds and reload when their content changed
        (works with Kubernetes ConfigMap symlink swaps). A rejected content is not retried until it changes."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                source = await asyncio.to_thread(self._source)
            except OSError:
                continue
            if source != self.current.source and source != self._rejected_source:
                try:
                    await asyncio.to_thread(self.reload)
                except Exception:  # never let the watcher die; reload() itself reports failures
                    log.exception("policy_watch_error")

    def status(self) -> dict[str, Any]:
        g = self.current.gate
        return {"sha256": self.current.sha256, "loaded_at": self.current.loaded_at,
                "policies": g.policies, "invariants": g.invariants, "baseline_invariants": g.baseline,
                "policy_tests": g.tests, "last_reload_error": self.last_error,
                "last_reload_problems": self.last_problems or None, "shadow_mode": self.shadow,
                "shadowed_actions": (sorted(self.shadow_actions) if self.shadow_actions is not None else "all")
                if self.shadow else None}
