"""The admission gate: whether a policy directory may be enforced, and why not, one line per problem.

The sidecar admits a policy set at start-up and on every reload only through `admit` (run in a
subprocess, ``python -m invariants.gate``, so a runaway check can be killed on a timeout and its
answer is structured JSON, never a scraped tail of text). ``policy-check`` runs the same `evaluate`.

`admit(root, extra_invariants, display, timeout_s)` loads the directory (parse, Cedar schema
validation of policies and invariants), checks every invariant — the baseline shipped in this
package, the directory's own ``invariants/`` and the pinned extra ones (``invariants.project``) —
and runs the policy unit tests; it also says whether the sidecar may decide rows per governance class
(`invariants.classes`: ``row_classes``, ``row_decisions``), which is no reason to refuse a set. The
answer is a `GateResult`:

============================  =====================================================================
``status``                    meaning
============================  =====================================================================
``ok``                        everything proved, every policy test passed
``invalid``                   a file does not parse or validate, no schema, unreadable input
``invariant_violation``       an invariant is VIOLATED (counterexample replayed through Cedar),
                              VACUOUS, or an action is UNCOVERED
``test_failed``               a policy unit test failed
``unproved``                  some result is UNKNOWN, or the Z3 model and Cedar DISAGREE
``error``                     the check itself could not run (set by the caller: timeout, crash)
============================  =====================================================================

``problems`` holds one line per failure, naming files as ``display`` maps them (the operator's
paths). A violation reads: the invariant and its file:line, the action, the counterexample in one
line (`counterexample_line`) and the policy that permitted it with its file:line (`failure_line`).

Command line (JSON on stdout, exit 0 iff ``status == "ok"``)::

    python -m invariants.gate DIR [--invariants PATH]... [--display SRC=DST]... [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cache import VerdictCache
from .catalog import DEFAULT_TIMEOUT_S, CheckResult, check_invariants, describe
from .classes import ClassAnalysis, analyse
from .engine import Policy
from .errors import InputError, PolicyCheckError, PolicyInvalid, Unsupported
from .policytests import PolicyTestResult, run_test_files
from .project import Project, load_project
from .report import Report

__all__ = ["GateResult", "admit", "evaluate", "failure_line", "counterexample_line", "main"]

_VIOLATION = {"VIOLATED", "UNCOVERED", "VACUOUS"}
_UNPROVED = {"UNKNOWN", "DISAGREE"}


@dataclass
class GateResult:
    """The gate's answer (see the module docstring). Counts: policies in the set, invariants checked
    (``baseline`` of them from the package), policy unit-test cases run; ``seconds`` wall time."""

    status: str
    problems: list[str] = field(default_factory=list)
    policies: int = 0
    invariants: int = 0
    baseline: int = 0
    tests: int = 0
    seconds: float = 0.0
    # Governance classes (`invariants.classes`): the resource attributes the sidecar may decide rows by,
    # sorted, or None when some policy may tell rows apart by more (then one decision per row);
    # `row_decisions` says which in one line.
    row_classes: list[str] | None = None
    row_decisions: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "GateResult":
        """Parse `to_json` output; raises ValueError on anything else."""
        try:
            return cls(status=str(doc["status"]), problems=[str(p) for p in doc["problems"]],
                       policies=int(doc["policies"]), invariants=int(doc["invariants"]),
                       baseline=int(doc["baseline"]), tests=int(doc["tests"]), seconds=float(doc["seconds"]),
                       row_classes=None if doc.get("row_classes") is None else [str(a) for a in doc["row_classes"]],
                       row_decisions=str(doc.get("row_decisions", "")))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a gate result: {exc}") from exc


def evaluate(proj: Project, timeout_s: float = DEFAULT_TIMEOUT_S, cache_dir: Path | None = None) -> Report:
    """Check every invariant of `proj` (each must apply to some request: VACUOUS otherwise) and run its
    policy unit tests; the report ``policy-check`` renders. ``cache_dir``: reuse and store verdicts there
    (``invariants.cache``; None: no cache)."""
    rep = Report(proj.label(proj.root))
    required = frozenset(i.id for i in proj.invariants if i.kind != "unconstrained")
    cache = VerdictCache(cache_dir) if cache_dir is not None else None
    rep.results = check_invariants(proj.schema, proj.schema_text, proj.policies, proj.invariants, timeout_s,
                                   required=required, cache=cache)
    rep.tests = run_test_files(proj.test_files, proj.policies, proj.schema_text,
                               [proj.label(t) for t in proj.test_files])
    return rep


def _value(v: Any) -> str:
    if isinstance(v, dict) and "__entity" in v:
        return f'{v["__entity"]["type"]}::"{v["__entity"]["id"]}"'
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(v)


def _uid(u: dict[str, Any]) -> str:
    return f'{u["type"]}::"{u["id"]}"'


def counterexample_line(cex: dict[str, Any]) -> str:
    """One line: principal {attrs} action resource {attrs} [context] -> Cedar's decision.
    Entity references print as ``Type::"id"``; attributes in name order."""
    req = cex.get("request") or {}
    if not req:
        return "(no counterexample)"
    ents = {(e["uid"]["type"], e["uid"]["id"]): e for e in cex.get("entities", [])}

    def ent(u: dict[str, Any]) -> str:
        e = ents.get((u["type"], u["id"]))
        if e is None:
            return _uid(u) + " (not in the entity store)"
        return _uid(u) + " " + _value(e.get("attrs", {}))

    ctx = req.get("context") or {}
    cedar = cex.get("cedar") or {}
    out = f'{ent(req["principal"])} {req["action"]["id"]} {ent(req["resource"])}'
    if ctx:
        out += f" context {_value(ctx)}"
    return out + f' -> Cedar {cedar.get("decision", "?")}'


def failure_line(r: CheckResult, policies: list[Policy]) -> str:
    """One line for a failed result: status, invariant (file:line), action, the counterexample's English
    summary (``CheckResult.summary``), the policies to blame — those that permitted it, or that raised the
    evaluation error — each with file:line, then the counterexample itself in one line."""
    head = f"{r.status} {r.invariant}" + (f" ({r.file}:{r.line})" if r.file else "")
    if r.action != "-":
        head += f" on {r.action}"
    if r.counterexample is None:
        return f"{head}: {r.message}" if r.message else head
    if not r.summary:
        describe(r, policies)
    line = f"{head}: {r.summary}" if r.summary else head
    if r.counterexample.get("kind") == "never-errors" and r.blamed:
        line += "; evaluation error in " + ", ".join(map(str, r.blamed))
    elif r.blamed:
        verb = "denied (raised trust) by" if r.counterexample.get("kind") == "monotone" and \
            r.blamed != r.permitted_by else "permitted by"
        line += f"; {verb} " + ", ".join(map(str, r.blamed))
    elif r.message:
        line += f"; {r.message}"
    return line + f"; counterexample {counterexample_line(r.counterexample)}"


def _test_line(t: PolicyTestResult) -> str:
    return f"policy test failed {t.file}: {t.name}: {t.message}"


def admit(root: Path, extra_invariants: list[Path] | None = None, display: dict[Path, Path] | None = None,
          timeout_s: float = DEFAULT_TIMEOUT_S) -> GateResult:
    """Decide whether the policy directory `root` may be enforced (module docstring). Never raises for a
    bad policy set; the result says what is wrong."""
    t0 = time.perf_counter()
    shown = dict(display or {})

    def done(res: GateResult) -> GateResult:
        res.seconds = round(time.perf_counter() - t0, 3)
        return res

    try:
        proj = load_project(root, list(extra_invariants or []), display=shown)
        rep = evaluate(proj, timeout_s)
    except PolicyInvalid as exc:
        return done(GateResult("invalid", [f"{f}:{ln}: {pid}: {m}" for f, ln, pid, m in exc.problems]))
    except Unsupported as exc:
        return done(GateResult("unproved", [f"UNKNOWN: {exc}"]))
    except (InputError, PolicyCheckError) as exc:
        return done(GateResult("invalid", [str(exc)]))
    res = GateResult("ok", policies=len(proj.policies), invariants=len(proj.invariants),
                     baseline=len(proj.baseline_ids), tests=len(rep.tests))
    classes = row_classes(root, proj.schema_text)
    res.row_classes = sorted(classes.attributes) if classes.sound else None
    res.row_decisions = classes.describe()
    statuses = {r.status for r in rep.results}
    res.problems = [failure_line(r, proj.policies) for r in rep.results if r.status in _VIOLATION | _UNPROVED]
    res.problems += [_test_line(t) for t in rep.tests if not t.passed]
    if statuses & _VIOLATION:
        res.status = "invariant_violation"
    elif any(not t.passed for t in rep.tests):
        res.status = "test_failed"
    elif statuses & _UNPROVED:
        res.status = "unproved"
    return done(res)


def row_classes(root: Path, schema_text: str) -> ClassAnalysis:
    """`invariants.classes.analyse` on the ``*.cedar`` files of `root`, joined as the sidecar's engine
    loads them (`sidecar.policy.PolicyEngine.load`)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(Path(root).glob("*.cedar")))
    return analyse(text, schema_text)


def main(argv: list[str] | None = None) -> int:
    """``python -m invariants.gate``: print the `GateResult` as JSON; exit 0 iff it passed."""
    ap = argparse.ArgumentParser(prog="python -m invariants.gate", description="admission gate (JSON)")
    ap.add_argument("directory", type=Path)
    ap.add_argument("--invariants", "-i", type=Path, action="append", default=[])
    ap.add_argument("--display", action="append", default=[], metavar="SRC=DST",
                    help="name files under SRC as DST in every message")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="solver timeout per query, seconds")
    args = ap.parse_args(argv)
    display = {}
    for item in args.display:
        src, sep, dst = item.partition("=")
        if not sep:
            ap.error(f"--display needs SRC=DST, got {item!r}")
        display[Path(src)] = Path(dst)
    res = admit(args.directory, args.invariants, display, args.timeout)
    sys.stdout.write(json.dumps(res.to_json()) + "\n")
    return 0 if res.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
