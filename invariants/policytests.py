"""Policy unit tests: concrete requests with an expected decision, run through Cedar.

File format (``DIR/tests/*.json``)::

    {
      "description": "free text",
      "entities": [ <Cedar JSON entities shared by every case> ],
      "cases": [
        {"name": "agent reads its own agent-scope row",
         "principal": {"type": "Agent", "id": "t1/f1/a1"},
         "action":    {"type": "Action", "id": "read"},
         "resource":  {"type": "Memory", "id": "m:agent"},
         "context":   {},                       # optional
         "entities":  [ ... ],                  # optional, added to the shared ones
         "expect":    "allow" | "deny",
         "reasons":   ["read-agent-scope"]}     # optional: expected determining @ids
      ]
    }

Every case is evaluated with the schema (cedarpy.is_authorized), so a request or entity
that does not conform to the schema is denied (and fails an ``allow`` case). A case Cedar allows although
its principal or resource entity is absent from its entities fails: the proofs assume both are present
(``invariants.report.ASSUMPTIONS``), so such an allow is one no proof covers.
Errors: ``PolicyTestFileError`` (exit 2) for a malformed file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine import Policy, authorize
from .errors import PolicyTestFileError

__all__ = ["PolicyTestResult", "run_test_file", "run_test_files"]


@dataclass
class PolicyTestResult:
    file: str
    name: str
    passed: bool
    expected: str
    actual: str
    reasons: list[str]
    errors: list[str]
    message: str = ""


def _case_request(case: dict[str, Any]) -> dict[str, Any]:
    return {k: case[k] for k in ("principal", "action", "resource")} | {"context": case.get("context", {})}


def _absent(case: dict[str, Any], entities: list[dict[str, Any]]) -> list[str]:
    """Which of ``principal`` and ``resource`` of a case has no entity in ``entities``."""
    have = {(str((e.get("uid") or {}).get("type")), str((e.get("uid") or {}).get("id")))
            for e in entities if isinstance(e, dict)}
    return [k for k in ("principal", "resource")
            if isinstance(case[k], dict) and (str(case[k].get("type")), str(case[k].get("id"))) not in have]


def run_test_file(path: Path, policies: list[Policy], schema_text: str, label: str | None = None
                  ) -> list[PolicyTestResult]:
    """Run one test file; returns one result per case. ``label`` names the file in results and
    errors (default: ``path``)."""
    name_of_file = label or str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        cases = doc["cases"]
        shared = doc.get("entities", [])
        if not isinstance(cases, list) or not isinstance(shared, list):
            raise TypeError("`cases` and `entities` must be lists")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PolicyTestFileError(f"{name_of_file}: {exc}") from exc
    out = []
    for i, case in enumerate(cases):
        name = case.get("name", f"case {i}")
        expect = case.get("expect")
        if expect not in ("allow", "deny") or not all(k in case for k in ("principal", "action", "resource")):
            raise PolicyTestFileError(f"{name_of_file}: {name}: needs principal, action, resource and expect allow|deny")
        try:
            res = authorize(_case_request(case), policies, shared + case.get("entities", []), schema_text)
        except (ValueError, TypeError) as exc:
            out.append(PolicyTestResult(name_of_file, name, expect == "deny", expect, "deny", [], [str(exc)],
                                      f"Cedar rejected the request: {exc}"))
            continue
        actual = "allow" if res.allow else "deny"
        ok = actual == expect
        msg = ""
        if not ok:
            msg = f"expected {expect}, got {actual}"
        absent = _absent(case, shared + case.get("entities", []))
        if res.allow and absent:
            # The proofs assume the principal and the resource are in the entity store (README "Assumptions");
            # a request Cedar allows without them is one no proof covers.
            ok, msg = False, (f"Cedar allows a request whose {' and '.join(absent)} "
                              "entity is absent from the case's entities; the proofs assume both are present")
        want = case.get("reasons")
        if ok and want is not None and sorted(want) != sorted(res.reasons):
            ok, msg = False, f"expected reasons {sorted(want)}, got {sorted(res.reasons)}"
        out.append(PolicyTestResult(name_of_file, name, ok, expect, actual, sorted(res.reasons), sorted(res.errors), msg))
    return out


def run_test_files(paths: list[Path], policies: list[Policy], schema_text: str,
                   labels: list[str] | None = None) -> list[PolicyTestResult]:
    return [r for i, p in enumerate(paths) for r in run_test_file(p, policies, schema_text,
                                                                  labels[i] if labels else None)]
