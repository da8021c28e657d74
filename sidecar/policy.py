"""The policy decision point (PDP) adapter: the only module that imports cedarpy.

The policy set and schema are parsed once (`PolicyEngine.load`) and reused for every decision.
Row decisions are evaluated in one `cedarpy.is_authorized_batch` call per response.
Only Cedar's ``Allow`` allows; ``Deny``, ``NoDecision`` and any engine error deny (fail closed).

Source: Cedar 4 authorization semantics (docs.cedarpolicy.com, "Authorization");
cedarpy 4.12 (`is_authorized_batch`, `PolicySet`, `Schema`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy

from sidecar.errors import PolicyLoadError


@dataclass(frozen=True, slots=True)
class Decision:
    """One Cedar answer. `allowed` is True only for ``Allow``; `policies` are the determining policy ids."""

    allowed: bool
    policies: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CedarRequest:
    """principal/action/resource as ``(type, id)``; context a JSON-able dict (Cedar JSON format)."""

    principal: tuple[str, str]
    action: str
    resource: tuple[str, str]
    context: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "principal": {"type": self.principal[0], "id": self.principal[1]},
            "action": {"type": "Action", "id": self.action},
            "resource": {"type": self.resource[0], "id": self.resource[1]},
            "context": self.context or {},
        }


class PolicyEngine:
    """A loaded policy set + schema. Thread-safe and reusable; build with `PolicyEngine.load(dir)`."""

    MEMO_SIZE = 4096

    def __init__(self, policies_text: str, schema_text: str, policy_files: list[Path], schema_file: Path) -> None:
        self._memo: dict[str, Decision] = {}
        self.policies_text = policies_text
        self.schema_text = schema_text
        self.policy_files = policy_files
        self.schema_file = schema_file
        try:
            self._schema = cedarpy.Schema.from_str(schema_text)
        except Exception as exc:  # cedarpy raises ValueError/RuntimeError subclasses
            raise PolicyLoadError(f"schema {schema_file} failed to parse: {exc}") from exc
        try:
            self._policies = cedarpy.PolicySet.from_str(policies_text)
        except Exception as exc:
            raise PolicyLoadError(f"policies in {[str(p) for p in policy_files]} failed to parse: {exc}") from exc
        result = cedarpy.validate_policies(policies_text, self._schema)
        if not result.validation_passed:
            details = "; ".join(str(e) for e in result.errors)
            raise PolicyLoadError(f"policies do not validate against {schema_file}: {details}")
        # Cedar names policies policy0, policy1, ...; report the @id annotation where there is one.
        est = json.loads(cedarpy.policies_to_json_str(policies_text))
        self.policy_ids: dict[str, str] = {
            name: str(body.get("annotations", {}).get("id", name)) for name, body in est.get("staticPolicies", {}).items()
        }

    @classmethod
    def load(cls, directory: Path) -> "PolicyEngine":
        """Load ``*.cedarschema`` (exactly one) and ``*.cedar`` (at least one) from `directory`.

        Raises `PolicyLoadError` naming the file when anything is missing, unparsable or invalid.
        """
        directory = Path(directory)
        if not directory.is_dir():
            raise PolicyLoadError(f"policies directory {directory} does not exist")
        schemas = sorted(directory.glob("*.cedarschema"))
        if len(schemas) != 1:
            raise PolicyLoadError(f"expected exactly one *.cedarschema in {directory}, found {len(schemas)}")
        policy_files = sorted(directory.glob("*.cedar"))
        if not policy_files:
            raise PolicyLoadError(f"no *.cedar policy files in {directory}")
        text = "\n".join(p.read_text(encoding="utf-8") for p in policy_files)
        return cls(text, schemas[0].read_text(encoding="utf-8"), policy_files, schemas[0])

    def decide(self, requests: list[CedarRequest], entities: list[dict[str, Any]]) -> list[Decision]:
        """Evaluate `requests` against one shared entity list (Cedar JSON entity format).

        Returns one `Decision` per request, in order. Never raises: an engine error denies every request.
        A single request is memoised on its exact (request, entities) JSON: Cedar evaluation is a pure
        function of policy set, schema, request and entities, and the memo belongs to this policy set.
        """
        if not requests:
            return []
        entities_json = json.dumps(entities, sort_keys=True, separators=(",", ":"))
        if len(requests) == 1:
            key = json.dumps(requests[0].to_json(), sort_keys=True) + entities_json
            hit = self._memo.get(key)
            if hit is not None:
                return [hit]
            decision = self._decide([requests[0]], entities_json)[0]
            if not decision.errors:
                if len(self._memo) >= self.MEMO_SIZE:
                    self._memo.pop(next(iter(self._memo)))
                self._memo[key] = decision
            return [decision]
        return self._decide(requests, entities_json)

    def _decide(self, requests: list[CedarRequest], entities_json: str) -> list[Decision]:
        try:
            results = cedarpy.is_authorized_batch(
                [r.to_json() for r in requests], self._policies, entities_json, self._schema
            )
        except Exception as exc:  # fail closed on any engine/entity/schema error
            return [Decision(False, (), (f"engine error: {exc}",))] * len(requests)
        if len(results) != len(requests):
            return [Decision(False, (), ("engine returned a wrong number of results",))] * len(requests)
        out = []
        for res in results:
            allowed = res.decision == cedarpy.Decision.Allow
            diag = res.diagnostics
            reasons = tuple(self.policy_ids.get(r, r) for r in diag.reasons)
            out.append(Decision(allowed, reasons, tuple(str(e) for e in diag.errors)))
        return out
