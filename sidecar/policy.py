"""The policy decision point (PDP) adapter: the only module that imports cedarpy.

The policy set and schema are parsed once (`PolicyEngine.load`) and reused for every decision.
Row decisions are evaluated in one `cedarpy.is_authorized_batch` call per response.
Only Cedar's ``Allow`` allows; ``Deny``, ``NoDecision`` and any engine error deny (fail closed).

Source: Cedar 4 authorization semantics (docs.cedarpolicy.com, "Authorization");
cedarpy 4.12 (`is_authorized_batch`, `PolicySet`, `Schema`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import cedarpy
import orjson

from sidecar.errors import PolicyLoadError

# Deny reasons of a Cedar answer (the decision log's ``reason``). ``not_applicable``: the schema makes the request
# one that cannot be asked — its action is not declared, or does not apply to the principal's or the resource's
# type (``appliesTo``): an operator key on a tenant route, the forgotten-content rule's ``reassert`` when the
# schema has no such action. Denied without asking Cedar; not an evaluation error of any policy.
NO_PERMIT, FORBID, EVALUATION_ERROR, NOT_APPLICABLE = "no_permit", "forbid", "evaluation_error", "not_applicable"


def applicability(schema_text: str) -> dict[str, tuple[frozenset[str], frozenset[str]]] | None:
    """Per action the schema declares, the principal and resource types it applies to (``appliesTo``), read
    with the policy checker's schema parser (`invariants.schema.parse_schema`); None when that parser does not
    take this schema (then every request goes to Cedar, which reports an inapplicable one as an error)."""
    from invariants.schema import parse_schema

    try:
        schema = parse_schema(schema_text)
    except Exception:  # noqa: BLE001 - a construct the checker does not model: no pre-check
        return None
    return {name: (frozenset(a.principals), frozenset(a.resources)) for name, a in schema.actions.items()}

def canonical_json(value: Any) -> str:
    """One canonical JSON text per JSON value (object keys sorted): orjson's compact form, or — for what
    orjson refuses (an integer beyond 64 bits, a lone surrogate, a non-string key) — the standard
    library's ``sort_keys`` form behind a marker, so the two forms never produce the same text for
    different values. Equal texts ⇔ equal JSON values (types kept: ``1``, ``1.0`` and ``true`` differ).
    Used for memo and class keys and for the entity JSON handed to Cedar (any valid JSON of the
    same value parses to the same entities)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return "\x00" + json.dumps(value, sort_keys=True)


_QUOTED = re.compile(r"`[^`]*`|\"(?:[^\"\\]|\\.)*\"")
_POLICY_IN_ERROR = re.compile(r"policy `(policy\d+)`")


@dataclass(frozen=True, slots=True)
class Decision:
    """One Cedar answer. `allowed` is True only for ``Allow``; `policies` are the determining policy ids
    (for a Deny: the forbids that matched). `errors` are the evaluation errors Cedar reported, one
    ``"<policy id>: <message>"`` each with every quoted value elided (no entity ids or attribute values),
    and `error_policies` the ids of the policies that raised them — Cedar skips such a policy, so an
    erroring forbid lets the request through. `reason` of a Deny: ``forbid`` (a forbid matched),
    ``evaluation_error`` (no permit held and some policy errored, or the engine failed), ``not_applicable``
    (the schema makes the request not applicable: Cedar was not asked) or ``no_permit``; empty for an Allow. `would_deny`: shadow mode turned this Deny into an Allow (`reason` kept)."""

    allowed: bool
    policies: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    reason: str = ""
    error_policies: tuple[str, ...] = ()
    would_deny: bool = False


_NOT_APPLICABLE = Decision(False, (), (), NOT_APPLICABLE)


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

    def __init__(self, policies_text: str, schema_text: str, policy_files: list[Path], schema_file: Path,
                 names: list[str] | None = None) -> None:
        self._memo: dict[str, Decision] = {}
        self._keyed_memo: dict[Any, Decision] = {}  # `decide_keyed`
        # Governance classes (`invariants.classes`): the resource attributes a row's class key holds, set
        # from the admission gate's analysis; None = one decision per row. `class_memo` keeps class
        # decisions of this policy set (`sidecar.stages.authorize.Authorizer.decide_rows`).
        self.row_classes: frozenset[str] | None = None
        self.class_memo: dict[Any, Decision] = {}
        self.policies_text = policies_text
        self.schema_text = schema_text
        self.policy_files = policy_files
        self.schema_file = schema_file
        # (action -> (principal types, resource types)) of the schema, or None: `applies`.
        self.applies_to = applicability(schema_text)
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
        # Cedar names policies policy0, policy1, ...; report the @id annotation where there is one, else
        # `names` (``file:line`` from `load`).
        est = json.loads(cedarpy.policies_to_json_str(policies_text))
        bodies = list(est.get("staticPolicies", {}).items())
        self.policy_ids: dict[str, str] = {
            name: str(body.get("annotations", {}).get("id") or (names[int(name[6:])] if names and name.startswith("policy")
                                                                 and name[6:].isdigit() and int(name[6:]) < len(names)
                                                                 else name))
            for name, body in bodies
        }

    @classmethod
    def load(cls, directory: Path, display: Path | None = None) -> "PolicyEngine":
        """Load ``*.cedarschema`` (exactly one) and ``*.cedar`` (at least one) from `directory`. A policy
        without ``@id`` is named ``<file>:<line>``; `display` names `directory` in those names and in errors.

        Raises `PolicyLoadError` naming the file when anything is missing, unparsable or invalid.
        """
        directory = Path(directory)
        shown = Path(display) if display is not None else directory
        if not directory.is_dir():
            raise PolicyLoadError(f"policies directory {shown} does not exist")
        schemas = sorted(directory.glob("*.cedarschema"))
        if len(schemas) != 1:
            raise PolicyLoadError(f"expected exactly one *.cedarschema in {shown}, found {len(schemas)}")
        policy_files = sorted(directory.glob("*.cedar"))
        if not policy_files:
            raise PolicyLoadError(f"no *.cedar policy files in {shown}")
        texts = [p.read_text(encoding="utf-8") for p in policy_files]
        from invariants.engine import parse_text  # statement splitter: file and line of every policy
        from invariants.errors import PolicyInvalid

        names: list[str] | None = []
        try:
            for path, text in zip(policy_files, texts):
                names += [p.id for p in parse_text(text, str(shown / path.name)).policies]  # type: ignore[operator]
        except PolicyInvalid:
            names = None  # the constructor reports the syntax error (after the schema's)
        return cls("\n".join(texts), schemas[0].read_text(encoding="utf-8"), [shown / p.name for p in policy_files],
                   shown / schemas[0].name, names)

    def decide(self, requests: list[CedarRequest], entities: list[dict[str, Any]]) -> list[Decision]:
        """Evaluate `requests` against one shared entity list (Cedar JSON entity format).

        Returns one `Decision` per request, in order. Never raises: an engine error denies every request.
        A single request is memoised on its exact (request, entities) JSON: Cedar evaluation is a pure
        function of policy set, schema, request and entities, and the memo belongs to this policy set.
        """
        if not requests:
            return []
        entities_json = canonical_json(entities)
        if entities_json.startswith("\x00"):  # what orjson refused: the standard library's text for Cedar
            entities_json = json.dumps(entities, sort_keys=True, separators=(",", ":"))
        if len(requests) == 1:
            key = canonical_json(requests[0].to_json()) + "\x00" + entities_json
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

    def decide_keyed(self, key: Any, request: Callable[[], CedarRequest],
                     entities: Callable[[], list[dict[str, Any]]]) -> Decision:
        """`decide` of one request, memoised on `key` instead of the request's and entities' JSON: `key`
        (hashable) must determine the request ``request()`` returns and the entity list ``entities()``
        returns — equal keys, equal request and entities — so neither need be built to find an answer
        already given. On a miss, both are called and the request decided by `decide`; an answer with
        evaluation errors is not kept (as in `decide`). Never raises (`decide`), except what `request` and
        `entities` raise."""
        hit = self._keyed_memo.get(key)
        if hit is not None:
            return hit
        decision = self.decide([request()], entities())[0]
        if not decision.errors:
            if len(self._keyed_memo) >= self.MEMO_SIZE:
                self._keyed_memo.pop(next(iter(self._keyed_memo)), None)
            self._keyed_memo[key] = decision
        return decision

    def applies(self, request: CedarRequest) -> bool:
        """Whether the schema lets `request` be asked: its action declared, applying to the principal's and the
        resource's types. True when the schema could not be read for this (`applicability` None)."""
        table = self.applies_to
        if table is None:
            return True
        types = table.get(request.action)
        return types is not None and request.principal[0] in types[0] and request.resource[0] in types[1]

    def _decide(self, requests: list[CedarRequest], entities_json: str) -> list[Decision]:
        """Cedar's answers to `requests`; a request the schema makes not applicable (`applies`) is answered
        `NOT_APPLICABLE` without Cedar, the others in one batch."""
        if self.applies_to is not None and not all(self.applies(r) for r in requests):
            asked = [r for r in requests if self.applies(r)]
            answers = iter(self._decide_cedar(asked, entities_json) if asked else [])
            return [next(answers) if self.applies(r) else _NOT_APPLICABLE for r in requests]
        return self._decide_cedar(requests, entities_json)

    def _decide_cedar(self, requests: list[CedarRequest], entities_json: str) -> list[Decision]:
        try:
            results = cedarpy.is_authorized_batch(
                [r.to_json() for r in requests], self._policies, entities_json, self._schema
            )
        except Exception as exc:  # fail closed on any engine/entity/schema error
            msg = _QUOTED.sub("…", str(exc))[:300]
            return [Decision(False, (), (f"engine: {msg}",), EVALUATION_ERROR, ("engine",))] * len(requests)
        if len(results) != len(requests):
            return [Decision(False, (), ("engine: wrong number of results",), EVALUATION_ERROR, ("engine",))] * len(requests)
        out = []
        for res in results:
            allowed = res.decision == cedarpy.Decision.Allow
            diag = res.diagnostics
            reasons = tuple(self.policy_ids.get(r, r) for r in diag.reasons)
            errors, erring = self._errors(diag.errors) if diag.errors else ((), ())
            reason = "" if allowed else FORBID if reasons else EVALUATION_ERROR if errors else NO_PERMIT
            out.append(Decision(allowed, reasons, errors, reason, erring))
        return out

    def _errors(self, raw: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Cedar's evaluation errors as ``"<policy id>: <message>"`` with quoted values elided, and the ids."""
        errors, ids = [], []
        for e in raw:
            m = _POLICY_IN_ERROR.search(e)
            pid = self.policy_ids.get(m.group(1), m.group(1)) if m else "?"
            message = _QUOTED.sub("…", e.split(": ", 1)[-1] if m else e)[:200]
            errors.append(f"{pid}: {message}")
            ids.append(pid)
        return tuple(errors), tuple(dict.fromkeys(ids))
