"""Rendering results: rich text (default), JSON, SARIF 2.1.0 and JUnit XML; exit codes.

Exit codes (README "policy-check"): 0 everything proved and every policy test passed;
1 an invariant is violated or vacuous, an action is uncovered, a policy test failed, a policy is
invalid, or (``--compare``) some class of requests widened (a narrowing is reported and passes);
2 usage error; 3 some result is UNKNOWN (and nothing failed); 4 the Z3 model and Cedar disagree on
a counterexample.

A ``--compare`` report (``Report.diff`` set: an ``invariants.matrix.MatrixDiff``) is written as the
changed cells of the access matrix with a witness each (``invariants.explain``), plus the per-action
results ``newly-permitted``/``newly-denied`` (UNCHANGED, CHANGED = widened, NARROWED, UNKNOWN): JSON
``changes`` and ``results``; SARIF, besides the per-action results, one result per action, direction and
policy allowing the witnesses, at that policy, with its cells (``access-widened`` error,
``access-narrowed`` note); JUnit a suite
``access-changes`` with one case per changed cell (widened ones fail).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console

from .catalog import CheckResult
from .policytests import PolicyTestResult

__all__ = ["Report", "Problem", "exit_code", "render", "render_problems", "sarif_log", "ASSUMPTIONS"]

# What every PROVED rests on, printed with every report (text footer, JSON ``assumptions``, SARIF run
# properties). Checked where it can be: every counterexample holds both entities, and a policy test Cedar
# allows without them fails (``invariants.policytests``); the sidecar builds both entities for each request.
ASSUMPTIONS = (
    "every request's principal and resource entity is present in the entity store (so `principal has tenant` "
    "holds for every principal type declaring tenant; a request without them is outside the proofs)",
)

FAIL = {"VIOLATED", "UNCOVERED", "VACUOUS", "CHANGED"}
STYLE = {"PROVED": "green", "UNCHANGED": "green", "VIOLATED": "bold red", "CHANGED": "yellow", "NARROWED": "yellow",
         "UNKNOWN": "magenta", "DISAGREE": "bold white on red", "UNCOVERED": "red", "VACUOUS": "red"}


@dataclass
class Report:
    target: str
    results: list[CheckResult] = field(default_factory=list)
    tests: list[PolicyTestResult] = field(default_factory=list)
    saved: dict[tuple[str, str], str] = field(default_factory=dict)
    wall_seconds: float = 0.0
    diff: Any = None  # --compare: the access-matrix diff (invariants.matrix.MatrixDiff)
    old_policies: list[Any] = field(default_factory=list)  # --compare: the sets, to locate policies
    new_policies: list[Any] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        out["tests_passed"] = sum(t.passed for t in self.tests)
        out["tests_failed"] = sum(not t.passed for t in self.tests)
        return out


def exit_code(rep: Report) -> int:
    st = {r.status for r in rep.results}
    if "DISAGREE" in st:
        return 4
    if rep.diff is not None and rep.diff.widened:
        return 1
    if st & FAIL or any(not t.passed for t in rep.tests):
        return 1
    if "UNKNOWN" in st:
        return 3
    return 0


def _json(rep: Report) -> dict[str, Any]:
    return {
        "tool": "policy-check", "version": 1, "target": rep.target,
        "exit_code": exit_code(rep), "wall_seconds": round(rep.wall_seconds, 3),
        "summary": rep.summary(),
        "results": [{"invariant": r.invariant, "action": r.action, "status": r.status,
                     "solver_seconds": round(r.seconds, 4), "message": r.message,
                     "file": r.file, "line": r.line, "summary": r.summary,
                     "permitted_by": [x.to_json() for x in r.permitted_by],
                     "blamed": [x.to_json() for x in r.blamed],
                     "counterexample_file": rep.saved.get((r.invariant, r.action)),
                     "counterexample": r.counterexample} for r in rep.results],
        "tests": [asdict(t) for t in rep.tests],
        "assumptions": list(ASSUMPTIONS),
        **(_diff_json(rep) if rep.diff is not None else {}),
    }


def _diff_json(rep: Report) -> dict[str, Any]:
    from .explain import diff_json

    doc = diff_json(rep.diff, rep.target)
    return {k: doc[k] for k in ("widened", "unknown", "queries", "replays", "changes")}


def _loc(file: str, line: int, column: int = 0, message: str = "") -> dict[str, Any]:
    region: dict[str, Any] = {"startLine": max(line, 1)}
    if column > 0:
        region["startColumn"] = column
    loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": _uri(file)}, "region": region}}
    if message:
        loc["message"] = {"text": message}
    return loc


def _uri(path: str) -> str:
    """A SARIF artifact URI (RFC 3986 URI reference) for a file path as policy-check names it."""
    from urllib.parse import quote

    return quote(path.replace("\\", "/"), safe="/:@-._~!$&'()*+,;=")


_UNMODELLED_AT = re.compile(r"^(.+?):(\d+): (?:.*?: )?unmodelled construct: ")


def _sarif_result(r: CheckResult) -> dict[str, Any]:
    level = "error" if r.status in FAIL | {"DISAGREE"} else "note" if r.status == "NARROWED" else "warning"
    text = f"{r.status} on action {r.action}: " + (r.summary or r.message)
    if r.summary and r.blamed:
        text += " (" + ("evaluation error in " if (r.counterexample or {}).get("kind") == "never-errors"
                        else "permitted by ") + ", ".join(map(str, r.blamed)) + ")"
    res: dict[str, Any] = {"ruleId": r.invariant, "level": level, "message": {"text": text.strip()},
                           "properties": {"action": r.action, "status": r.status}}
    where = [b for b in r.blamed if b.file]
    inv_loc = _loc(r.file, r.line, 0, f"invariant {r.invariant}") if r.file else None
    at = _UNMODELLED_AT.match(r.message) if r.status == "UNKNOWN" else None
    if at and not where:
        # An unmodelled construct is in a policy (``Unsupported``: "file:line: id: unmodelled construct: …"):
        # the result is there, not in the invariant's file inside the installed package.
        res["locations"] = [_loc(at.group(1), int(at.group(2)), 0, "unmodelled construct")]
        if inv_loc is not None and at.group(1) != r.file:
            res["relatedLocations"] = [dict(inv_loc, id=0)]
    elif where:
        # The policy that permitted the counterexample is where a reviewer fixes it; the invariant it
        # breaks is related.
        res["locations"] = [_loc(b.file, b.line, b.column, f"policy {b.id}") for b in where[:1]]
        related = [_loc(b.file, b.line, b.column, f"policy {b.id}") for b in where[1:]]
        if inv_loc is not None:
            related.insert(0, inv_loc)
        if related:
            res["relatedLocations"] = [dict(x, id=i) for i, x in enumerate(related)]
    elif inv_loc is not None:
        res["locations"] = [inv_loc]
    if r.summary:
        res["properties"]["summary"] = r.summary
    if r.counterexample:
        res["properties"]["counterexample"] = r.counterexample
    return res


def sarif_log(results: list[dict[str, Any]], rules: list[str]) -> dict[str, Any]:
    """A SARIF 2.1.0 log (OASIS SARIF v2.1.0 §3.13) with one run of policy-check; columns count Unicode
    code points (``columnKind``)."""
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "policy-check", "informationUri": "https://www.cedarpolicy.com",
                                          "rules": [{"id": r} for r in rules]}},
                      "columnKind": "unicodeCodePoints",
                      "properties": {"assumptions": list(ASSUMPTIONS)},
                      "results": results}]}


def _sarif(rep: Report) -> dict[str, Any]:
    rules = sorted({r.invariant for r in rep.results})
    results = [_sarif_result(r) for r in rep.results if r.status not in ("PROVED", "UNCHANGED")]
    for t in rep.tests:
        if not t.passed:
            results.append({"ruleId": "policy-test", "level": "error",
                            "message": {"text": f"{t.name}: {t.message}"},
                            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(t.file)}}}]})
    if rep.diff is not None:
        results += _change_results(rep)
        rules += ["access-widened", "access-narrowed"]
    return sarif_log(results, rules + ["policy-test"])


def _change_results(rep: Report) -> list[dict[str, Any]]:
    """SARIF results for the changed cells: one per action, direction and policy that allows the witnesses
    (NEW's for a widening, OLD's for a narrowing), located at that policy, with every cell and its
    witness in ``properties.cells`` (a pull request that widens 200 classes through one permit gets one
    annotation on that permit, not 200)."""
    from .catalog import _refs
    from .explain import change_text

    groups: dict[tuple[str, str, str], list[tuple[Any, Any]]] = {}
    for c in rep.diff.changes:
        for w, rule in ((c.widen, "access-widened"), (c.narrow, "access-narrowed")):
            if w is not None:
                groups.setdefault((rule, c.action, ",".join(w.reasons)), []).append((c, w))
    out = []
    for (rule, action, _), items in groups.items():
        c0, w0 = items[0]
        pols = rep.new_policies if rule == "access-widened" else rep.old_policies
        n = len(items)
        text = (f"{'widened' if rule == 'access-widened' else 'narrowed'} {action} in {n} "
                f"class{'es' * (n != 1)} of requests, e.g. {change_text(c0, w0).split(' ', 1)[1]}")
        res: dict[str, Any] = {"ruleId": rule, "level": "error" if rule == "access-widened" else "note",
                               "message": {"text": text},
                               "properties": {"action": action, "cells": [
                                   {"class": c.coords, "principal": c.principal, "resource": c.resource,
                                    "old": c.old, "new": c.new, "witness": w.to_json()} for c, w in items]}}
        where = [r for r in _refs(w0.reasons, pols) if r.file]
        if where:
            res["locations"] = [_loc(where[0].file, where[0].line, where[0].column, f"policy {where[0].id}")]
            if where[1:]:
                res["relatedLocations"] = [dict(_loc(r.file, r.line, r.column, f"policy {r.id}"), id=i)
                                           for i, r in enumerate(where[1:])]
        out.append(res)
    return out


def _junit(rep: Report) -> str:
    suites = ET.Element("testsuites", name="policy-check")
    inv = ET.SubElement(suites, "testsuite", name="invariants", tests=str(len(rep.results)),
                        failures=str(sum(r.status in FAIL | {"DISAGREE"} for r in rep.results)),
                        skipped="0", errors=str(sum(r.status == "UNKNOWN" for r in rep.results)))
    for r in rep.results:
        case = ET.SubElement(inv, "testcase", classname=r.invariant, name=r.action, time=f"{r.seconds:.4f}")
        if r.status in FAIL | {"DISAGREE"}:
            f = ET.SubElement(case, "failure", message=f"{r.status}: {r.summary or r.message}", type=r.status)
            f.text = json.dumps(r.counterexample, indent=1) if r.counterexample else r.message
        elif r.status == "UNKNOWN":
            ET.SubElement(case, "error", message=f"UNKNOWN: {r.message}", type="UNKNOWN")
    ts = ET.SubElement(suites, "testsuite", name="policy-tests", tests=str(len(rep.tests)),
                       failures=str(sum(not t.passed for t in rep.tests)), skipped="0", errors="0")
    for t in rep.tests:
        case = ET.SubElement(ts, "testcase", classname=t.file, name=t.name)
        if not t.passed:
            ET.SubElement(case, "failure", message=t.message, type="decision")
    if rep.diff is not None:
        from .explain import change_text

        ch = rep.diff.changes
        cs = ET.SubElement(suites, "testsuite", name="access-changes", tests=str(len(ch)),
                           failures=str(sum(c.widened for c in ch)), skipped="0", errors="0")
        for c in ch:
            case = ET.SubElement(cs, "testcase", classname=c.action, name=change_text(c))
            if c.widen is not None:
                f = ET.SubElement(case, "failure", message=change_text(c, c.widen), type="WIDENED")
                f.text = json.dumps(c.widen.to_json(), indent=1)
            if c.narrow is not None:
                ET.SubElement(case, "system-out").text = change_text(c, c.narrow)
    return ET.tostring(suites, encoding="unicode")


def _cex_lines(cex: dict[str, Any]) -> list[str]:
    """A counterexample's request and entities, one line each (``Type::"id" {attr: value, …}``), for text."""
    from .summary import quote

    def val(v: Any) -> str:
        if isinstance(v, dict) and "__entity" in v:
            return f'{v["__entity"]["type"]}::{quote(str(v["__entity"]["id"]))}'
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {val(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, str):
            return quote(v)
        return json.dumps(v)

    req = cex.get("request") or {}
    out = []
    if req:
        ctx = f" context {val(req['context'])}" if req.get("context") else ""
        out.append(f"request: {val({'__entity': req['principal']})} {req['action']['id']} "
                   f"{val({'__entity': req['resource']})}{ctx}")
    for e in cex.get("entities") or []:
        parents = f" in [{', '.join(val({'__entity': p}) for p in e.get('parents') or [])}]" if e.get("parents") else ""
        out.append(f"entity {val({'__entity': e['uid']})}{parents} {val(e.get('attrs') or {})}")
    return out


def _text(rep: Report, console: Console) -> None:
    """Plain text that reads at any width down to 80 columns: proved invariants one wrapped line each, then
    one block per finding (status, invariant and action, its message or English summary, the permitting
    policies, the counterexample one entity a line, where it was saved), then tests and the footer."""
    from .explain import wrap

    w = console.width
    console.print(f"policy-check {rep.target}", highlight=False, markup=False)
    proved: dict[str, list[str]] = {}
    for r in rep.results:
        if r.status in ("PROVED", "UNCHANGED"):
            proved.setdefault(r.invariant, []).append(r.action)
    for inv, actions in proved.items():
        for line in wrap(f"PROVED {inv}: {', '.join(actions)}", w, "    "):
            console.print(line, highlight=False, markup=False)
    for r in rep.results:
        if r.status in ("PROVED", "UNCHANGED"):
            continue
        console.print("")
        console.print(f"[{STYLE.get(r.status, '')}]{r.status}[/] ", end="", highlight=False)
        console.print(f"{r.invariant} / {r.action} ({r.seconds * 1000:.0f} ms)", highlight=False, markup=False)
        body = [r.summary] if r.summary else [r.message] if r.message else []
        if r.blamed:
            body.append(("evaluation error in " if (r.counterexample or {}).get("kind") == "never-errors"
                         else "permitted by ") + ", ".join(map(str, r.blamed)))
        if r.status == "DISAGREE" and r.counterexample:
            body.append("Z3 model says: " + json.dumps(r.counterexample.get("model") or r.counterexample.get("new")))
            body.append("Cedar says: " + json.dumps(r.counterexample.get("cedar") or r.counterexample.get("old")))
        if r.counterexample:
            body += _cex_lines(r.counterexample)
        if (r.invariant, r.action) in rep.saved:
            body.append(f"saved: {rep.saved[(r.invariant, r.action)]}")
        for text in body:
            for line in wrap(text, w - 2, "    "):
                console.print("  " + line, highlight=False, markup=False)
    if rep.tests:
        failed = [t for t in rep.tests if not t.passed]
        console.print(f"policy tests: {len(rep.tests) - len(failed)} passed, {len(failed)} failed")
        for t in failed:
            for i, line in enumerate(wrap(f"FAIL {t.file}: {t.name}: {t.message}", w - 2, "    ")):
                console.print("  " + line, highlight=False, markup=False)
    for a in ASSUMPTIONS:
        for line in wrap(f"assumes: {a}", w, "    "):
            console.print(line, highlight=False, markup=False)
    s = rep.summary()
    for line in wrap(", ".join(f"{k}={v}" for k, v in s.items()) + f"; wall {rep.wall_seconds:.2f}s; "
                     f"exit {exit_code(rep)}", w, "    "):
        console.print(line, highlight=False, markup=False)


def _markdown(rep: Report) -> str:
    """GitHub-flavoured markdown for a pull-request comment: a table of the findings (and, for --compare,
    of the changed cells with their replayed witnesses), the proved invariants in one line, the footer."""
    from .explain import _md, diff_markdown

    out = [f"### policy-check `{rep.target}`", ""]
    if rep.diff is not None:
        out += diff_markdown(rep.diff) if rep.diff.changes else ["No class of requests changed."]
        out.append("")
    bad = [r for r in rep.results if r.status not in ("PROVED", "UNCHANGED")]
    if bad:
        out += ["| status | invariant | action | finding | policies |", "|---|---|---|---|---|"]
        for r in bad:
            out.append(f"| **{r.status}** | {_md(r.invariant)} | {r.action} | {_md(r.summary or r.message)} | "
                       f"{_md(', '.join(map(str, r.blamed)))} |")
        out.append("")
    proved = sorted({r.invariant for r in rep.results if r.status == "PROVED"})
    if proved:
        out += [f"PROVED: {', '.join(proved)}", ""]
    failed = [t for t in rep.tests if not t.passed]
    if rep.tests:
        out.append(f"Policy tests: {len(rep.tests) - len(failed)} passed, {len(failed)} failed")
        out += [f"- FAIL `{t.file}`: {_md(t.name)}: {_md(t.message)}" for t in failed]
        out.append("")
    out += [f"Assumes: {a}" for a in ASSUMPTIONS]
    out.append(f"\nExit {exit_code(rep)}; " + ", ".join(f"{k}={v}" for k, v in rep.summary().items()))
    return "\n".join(out) + "\n"


def _compare_text(rep: Report, console: Console) -> None:
    """``--compare``: the changed cells with their witnesses (``explain.render_diff``), then the
    per-action answer in one line each and the exit code."""
    from .explain import render_diff

    render_diff(rep.diff, rep.target, console)
    for status in ("CHANGED", "NARROWED", "UNKNOWN", "DISAGREE"):
        hit = [r for r in rep.results if r.status == status]
        if hit:
            word = {"CHANGED": "newly permitted", "NARROWED": "newly denied"}.get(status, status)
            console.print(f"[{STYLE.get(status, '')}]{word}[/]: " + ", ".join(sorted({r.action for r in hit})),
                          highlight=False)
    for r in rep.results:
        if (r.invariant, r.action) in rep.saved:
            console.print(f"saved: {rep.saved[(r.invariant, r.action)]}", highlight=False, markup=False)
    console.print(f"wall {rep.wall_seconds:.2f}s; exit {exit_code(rep)}")


@dataclass(frozen=True)
class Problem:
    """A check that could not run: an input that does not parse or validate (``rule`` ``policy-invalid``,
    ``schema-invalid``), a construct the translator does not model (``unknown``) or bad input
    (``input-error``). ``line``/``column`` are 1-based, 0 when unknown."""

    rule: str
    message: str
    file: str = ""
    line: int = 0
    column: int = 0
    policy: str = "-"

    def where(self) -> str:
        if not self.file:
            return ""
        return f"{self.file}:{self.line}" + (f":{self.column}" if self.column else "") + ": "


def render_problems(problems: list[Problem], code: int, fmt: str, console: Console, target: str = "") -> None:
    """Write problems that stopped the check in ``fmt``: never an empty document — SARIF has one result
    per problem at its file:line:column, JUnit one failing (or, exit 3, erroring) test case, JSON an
    ``invalid`` list with ``exit_code``; text goes to stderr."""
    level = "warning" if code == 3 else "error"
    if fmt == "json":
        console.file.write(json.dumps({"tool": "policy-check", "version": 1, "target": target, "exit_code": code,
                                       "invalid": [{"rule": p.rule, "file": p.file, "line": p.line, "column": p.column,
                                                    "policy": p.policy, "message": p.message} for p in problems]},
                                      indent=2) + "\n")
    elif fmt == "sarif":
        results = []
        for p in problems:
            res: dict[str, Any] = {"ruleId": p.rule, "level": level, "message": {"text": p.message},
                                   "properties": {"policy": p.policy, "exit_code": code}}
            if p.file:
                res["locations"] = [_loc(p.file, p.line, p.column)]
            results.append(res)
        console.file.write(json.dumps(sarif_log(results, sorted({p.rule for p in problems})), indent=2) + "\n")
    elif fmt == "junit":
        suites = ET.Element("testsuites", name="policy-check")
        tag = "error" if code == 3 else "failure"
        suite = ET.SubElement(suites, "testsuite", name="load", tests=str(len(problems)),
                              failures=str(len(problems) if tag == "failure" else 0),
                              errors=str(len(problems) if tag == "error" else 0), skipped="0")
        for p in problems:
            case = ET.SubElement(suite, "testcase", classname=p.rule, name=f"{p.where()}{p.policy}".strip() or p.rule)
            if p.file:
                case.set("file", p.file)
                case.set("line", str(p.line))
            f = ET.SubElement(case, tag, message=p.message, type=p.rule)
            f.text = f"{p.where()}{p.message}"
        console.file.write(ET.tostring(suites, encoding="unicode") + "\n")
    elif fmt == "markdown":
        lines = [f"### policy-check `{target}`", "", "| problem | where | policy | message |", "|---|---|---|---|"]
        for p in problems:
            lines.append(f"| {p.rule} | {p.where().rstrip(': ')} | {p.policy} | {p.message.replace('|', '/')} |")
        console.file.write("\n".join(lines) + f"\n\nExit {code}\n")
    else:
        err = Console(stderr=True, soft_wrap=True)  # a file:line is never broken across lines
        word = {"unknown": "UNKNOWN", "input-error": "error"}.get(problems[0].rule if problems else "", "invalid")
        for p in problems:
            err.print(f"{p.where()}[red]{word}[/] {p.policy}: {p.message}" if p.policy != "-" else
                      f"{p.where()}[red]{word}[/]: {p.message}", markup=True, highlight=False)


def render(rep: Report, fmt: str, console: Console) -> None:
    """Write the report to ``console`` in ``fmt`` (text, json, sarif, junit, markdown)."""
    if fmt == "text" and rep.diff is not None:
        _compare_text(rep, console)
    elif fmt == "text":
        _text(rep, console)
    elif fmt == "markdown":
        console.file.write(_markdown(rep))
    elif fmt == "json":
        console.file.write(json.dumps(_json(rep), indent=2) + "\n")
    elif fmt == "sarif":
        console.file.write(json.dumps(_sarif(rep), indent=2) + "\n")
    else:
        console.file.write(_junit(rep) + "\n")
