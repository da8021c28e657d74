"""Adoption rules: the governance `memwarden adopt` gives each existing backend row (TOML, one file per tenant).

Shape (every table optional except ``tenant``; unknown keys are errors)::

    tenant = "acme"                       # the memwarden tenant (on Chroma also the Chroma tenant)

    [defaults]                            # the last layer: for rows no more specific rule covers
    scope = "fleet"                       # agent | fleet | tenant | restricted
    owner = "red/importer"                # fleet/agent; a row no layer gives an owner is not adopted
    fleet = "red"                         # default: the owner's fleet
    readers = ["blue/analyst"]            # restricted rows: fleet/agent names
    labels = ["imported"]                 # Memory.labels (policies may read them), sorted and deduplicated

    [scope_from]                          # a row's own metadata key → its scope (wins over every layer)
    key = "visibility"
    values = { public = "tenant", team = "fleet", private = "agent" }   # default: the scope names themselves
    readers_key = "shared_with"           # restricted rows: "fleet/agent,fleet/agent" in this metadata key
    labels_key = "tags"                   # labels: "pii,finance" in this metadata key (wins over every layer)

    [[collection]]                        # Chroma: a collection to adopt, with its defaults (a layer)
    name = "support"
    database = "default_database"         # default
    scope = "tenant"

    [mem0]                                # Mem0: the deployment, with its defaults (a layer)
    deployment = "default"                # MEMWARDEN_MEM0_DEPLOYMENT of the sidecar

    [[map]]                               # the first layer: first entry whose conditions all hold
    agent_id = "support-bot"              # Mem0 agent_id / user_id / run_id of the row, and/or
    metadata = { team = "blue" }          # metadata values (exact, typed)
    owner = "blue/support"
    scope = "fleet"
    labels = ["pii"]

Per row: the owner comes from the first layer that names one ([[map]] match, then the collection or
``[mem0]``, then ``[defaults]``); the fleet from the owner's layer or a more specific one, else the owner's
fleet; the scope from ``scope_from`` when the row has that key (a value it does not map leaves the row
uncovered), else from the first layer that sets one; readers likewise; labels from ``labels_key`` when the row
has it (a value that is not a label list leaves the row uncovered), else from the first layer that sets them
(``labels = []`` sets none). A row no layer gives an owner and a
scope is *uncovered*: not adopted, so it stays denied, and it is listed. Conditions and ``scope_from`` never
read ``mw_*`` keys: governed keys already in a backend row were written around memwarden and are not trusted.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sidecar.governance import SCOPES, agent_id
from sidecar.ledger.base import check_names

NATIVE_IDS = ("agent_id", "user_id", "run_id")
_NAME = r"^[^/:\s]+$"
_AGENT = r"^[^/:\s]+/[^/:\s]+$"
Scalar = str | int | float | bool


class RulesError(ValueError):
    """The rules file is unreadable or invalid; the message names the file and the key."""


class _Layer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str | None = Field(default=None, pattern=_AGENT)
    fleet: str | None = Field(default=None, pattern=_NAME)
    scope: str | None = None
    readers: tuple[str, ...] | None = None
    labels: tuple[str, ...] | None = None

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else check_names("label", v)

    @field_validator("scope")
    @classmethod
    def _scope(cls, v: str | None) -> str | None:
        if v is not None and v not in SCOPES:
            raise ValueError(f"must be one of {', '.join(SCOPES)}")
        return v

    @field_validator("readers")
    @classmethod
    def _readers(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        import re

        if v is not None and not all(re.match(_AGENT, r) for r in v):
            raise ValueError("readers are fleet/agent names")
        return v


class _Collection(_Layer):
    name: str = Field(min_length=1)
    database: str = Field(default="default_database", min_length=1)


class _Mem0(_Layer):
    deployment: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]+$")


class _Map(_Layer):
    agent_id: str | None = Field(default=None, min_length=1)
    user_id: str | None = Field(default=None, min_length=1)
    run_id: str | None = Field(default=None, min_length=1)
    metadata: dict[str, Scalar] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _conditions(self) -> "_Map":
        if not self.metadata and not any(getattr(self, k) for k in NATIVE_IDS):
            raise ValueError("a [[map]] entry needs a condition: agent_id, user_id, run_id or metadata")
        if any(k.startswith("mw_") for k in self.metadata):
            raise ValueError("conditions may not read mw_* keys (governed keys in backend rows are not trusted)")
        return self


class _ScopeFrom(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1)
    values: dict[str, str] | None = None
    readers_key: str | None = Field(default=None, min_length=1)
    labels_key: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "_ScopeFrom":
        for k in (self.key, self.readers_key, self.labels_key):
            if k is not None and k.startswith("mw_"):
                raise ValueError("scope_from may not read mw_* keys (governed keys in backend rows are not trusted)")
        bad = sorted(v for v in (self.values or {}).values() if v not in SCOPES)
        if bad:
            raise ValueError(f"values must map to one of {', '.join(SCOPES)} (got {', '.join(bad)})")
        return self


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(pattern=_NAME)
    defaults: _Layer = Field(default_factory=_Layer)
    scope_from: _ScopeFrom | None = None
    collection: list[_Collection] = Field(default_factory=list)
    mem0: _Mem0 | None = None
    map: list[_Map] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> "_File":
        seen = [(c.database, c.name) for c in self.collection]
        if len(set(seen)) != len(seen):
            raise ValueError("a collection is listed twice")
        return self


@dataclass(frozen=True)
class Assignment:
    """The governance of one adopted row: agent uids ``tenant/fleet/agent``; `rule` names the deciding layer."""

    owner: str
    fleet: str
    scope: str
    readers: tuple[str, ...]
    rule: str
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Uncovered:
    """A row the rules do not cover: it is not adopted (it stays denied). `reason` is for the listing."""

    reason: str


@dataclass(frozen=True)
class Rules:
    """A validated rules file. `sha256` is its content hash (recorded as the adopted rows' source)."""

    path: str
    sha256: str
    spec: _File

    @property
    def tenant(self) -> str:
        return self.spec.tenant

    def collections(self) -> list[_Collection]:
        return list(self.spec.collection)

    def mem0(self) -> _Mem0 | None:
        return self.spec.mem0

    def agents(self) -> set[str]:
        """Every agent uid the rules name (owners and readers), to check against the ledger's agents."""
        layers: list[_Layer] = [self.spec.defaults, *self.spec.collection, *self.spec.map]
        if self.spec.mem0 is not None:
            layers.append(self.spec.mem0)
        out: set[str] = set()
        for layer in layers:
            for name in ([layer.owner] if layer.owner else []) + list(layer.readers or ()):
                fleet, agent = name.split("/")
                out.add(agent_id(self.tenant, fleet, agent))
        return out

    def _uid(self, name: str) -> str:
        fleet, agent = name.split("/")
        return agent_id(self.tenant, fleet, agent)

    def assign(self, base: _Layer, native: Mapping[str, Any], metadata: Mapping[str, Any]) -> Assignment | Uncovered:
        """The governance of one row (`native`: its Mem0 agent_id/user_id/run_id; `metadata`: its plain
        metadata) under the layers [first matching [[map]] entry, `base` (a collection or [mem0]), [defaults]]."""
        layers: list[tuple[str, _Layer]] = []
        for n, entry in enumerate(self.spec.map):
            if all(getattr(entry, k) is None or native.get(k) == getattr(entry, k) for k in NATIVE_IDS) and \
                    all(k in metadata and _same(metadata[k], v) for k, v in entry.metadata.items()):
                layers.append((f"map[{n}]", entry))
                break
        layers += [(_label(base), base), ("defaults", self.spec.defaults)]
        owner_at = next((i for i, (_, layer) in enumerate(layers) if layer.owner), None)
        if owner_at is None:
            return Uncovered("no rule names an owner")
        owner = layers[owner_at][1].owner
        assert owner is not None
        fleet = next((layer.fleet for _, layer in layers[:owner_at + 1] if layer.fleet), owner.split("/")[0])
        rule = layers[0][0]
        sf = self.spec.scope_from
        if sf is not None and sf.key in metadata:
            value = metadata[sf.key]
            mapping = sf.values if sf.values is not None else {s: s for s in SCOPES}
            if not isinstance(value, str) or value not in mapping:
                return Uncovered(f"{sf.key}={value!r} maps to no scope")
            scope = mapping[value]
        else:
            found = next((layer.scope for _, layer in layers if layer.scope), None)
            if found is None:
                return Uncovered("no rule sets a scope")
            scope = found
        readers: tuple[str, ...] = ()
        if scope == "restricted":
            if sf is not None and sf.readers_key and sf.readers_key in metadata:
                raw = metadata[sf.readers_key]
                names = [x.strip() for x in raw.split(",") if x.strip()] if isinstance(raw, str) else None
                if names is None or not all(len(x.split("/")) == 2 and all(x.split("/")) for x in names):
                    return Uncovered(f"{sf.readers_key} is not a fleet/agent list")
                readers = tuple(dict.fromkeys(self._uid(x) for x in names))
            else:
                readers = tuple(self._uid(x) for x in next((layer.readers for _, layer in layers if layer.readers), ()))
        labels: tuple[str, ...] = next((layer.labels for _, layer in layers if layer.labels is not None), ())
        if sf is not None and sf.labels_key and sf.labels_key in metadata:
            raw = metadata[sf.labels_key]
            try:
                if not isinstance(raw, str):
                    raise ValueError
                labels = check_names("label", [x.strip() for x in raw.split(",") if x.strip()])
            except ValueError:
                return Uncovered(f"{sf.labels_key} is not a label list")
        return Assignment(self._uid(owner), fleet, scope, readers, rule, labels)


def _same(stored: Any, wanted: Scalar) -> bool:
    """Exact, typed equality (``True`` is not ``1``)."""
    return type(stored) is type(wanted) and stored == wanted


def _label(layer: _Layer) -> str:
    if isinstance(layer, _Collection):
        return f"collection {layer.database}/{layer.name}"
    if isinstance(layer, _Mem0):
        return f"mem0 {layer.deployment}"
    return "defaults"


def load_rules(path: Path) -> Rules:
    """Read and validate a rules file. Raises `RulesError` naming the file and the offending key."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise RulesError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RulesError(f"{path}: not valid TOML: {exc}") from exc
    try:
        spec = _File.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise RulesError(f"{path}: {loc}: {first['msg']}") from exc
    return Rules(str(path), hashlib.sha256(raw).hexdigest(), spec)
