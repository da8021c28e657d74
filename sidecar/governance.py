"""The governance model of docs/design.md §2 as Python values, and its mapping to Cedar entities.

Entity ids are tenant-qualified (see policies/memwarden.cedarschema):
``Tenant::"t"``, ``Fleet::"t/f"``, ``Agent::"t/f/a"``, ``TenantAdmin::"t/admin/<key id>"``,
``Namespace::"t/<database>"``, ``Collection::"<backend>:<uuid>"``, ``Memory::"<backend>:<uuid>:<row id>"``,
``Operator::"<key id>"`` (a deployment-level key, no tenant) and ``Deployment::"chroma"`` / ``Deployment::"mem0:<name>"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SCOPES = ("agent", "fleet", "tenant", "restricted")
STATUSES = ("active", "superseded", "deleted")
# Rows in these ledger states are never served; a "pending" row is a write reservation.
SERVABLE = ("active", "superseded")
Scope = Literal["agent", "fleet", "tenant", "restricted"]


def ref(type_: str, id_: str) -> dict[str, Any]:
    """A Cedar JSON entity reference ``{"__entity": {"type", "id"}}``."""
    return {"__entity": {"type": type_, "id": id_}}


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller. `kind` is "agent" (tenant, fleet, agent, trust 0-3), "admin" (tenant-wide)
    or "operator" (the deployment; `tenant` is "" — no tenant name is empty, so it matches none)."""

    kind: Literal["agent", "admin", "operator"]
    key_id: str
    tenant: str
    fleet: str | None = None
    agent: str | None = None
    trust: int = 0
    roles: tuple[str, ...] = ()
    # UTC microseconds after which the credential that named this principal is no longer valid (an API key with an
    # expiry, `memwarden keys create --expires-in`, or in a rotation's grace period), None: no expiry. Read by the key
    # caches so that no cached principal outlives its key (`sidecar.ledger.cache`); not compared, hashed or shown, and
    # keyword-only (positional construction and ``match`` see the fields above only).
    expires_at: int | None = field(default=None, compare=False, repr=False, kw_only=True)
    # The Cedar uid ``(type, id)``: ``("Agent", "t/f/a")``, ``("TenantAdmin", "t/admin/<key id>")`` or
    # ``("Operator", "<key id>")``. A function of the fields above, made once (`__post_init__`) and read on
    # every decision; not compared or hashed (it follows from what is).
    uid: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind == "operator":
            uid = ("Operator", self.key_id)
        elif self.kind == "admin":
            uid = ("TenantAdmin", f"{self.tenant}/admin/{self.key_id}")
        else:
            uid = ("Agent", agent_id(self.tenant, self.fleet or "", self.agent or ""))
        object.__setattr__(self, "uid", uid)

    @property
    def fleet_uid(self) -> str:
        return f"{self.tenant}/{self.fleet}"

    def entities(self) -> list[dict[str, Any]]:
        """The principal and its ancestors (Fleet, Tenant) as Cedar JSON entities."""
        if self.kind == "operator":
            return [{"uid": {"type": "Operator", "id": self.key_id}, "attrs": {}, "parents": []}]
        tenant = {"uid": {"type": "Tenant", "id": self.tenant}, "attrs": {}, "parents": []}
        if self.kind == "admin":
            me = {"uid": {"type": "TenantAdmin", "id": self.uid[1]}, "attrs": {"tenant": ref("Tenant", self.tenant)}, "parents": []}
            return [me, tenant]
        return [
            agent_entity(self.tenant, self.fleet or "", self.agent or "", self.trust, self.roles),
            fleet_entity(self.tenant, self.fleet or ""),
            tenant,
        ]

    def describe(self) -> str:
        kind, ident = self.uid
        return f"{kind}::{ident}"


def agent_id(tenant: str, fleet: str, agent: str) -> str:
    return f"{tenant}/{fleet}/{agent}"


def agent_entity(tenant: str, fleet: str, agent: str, trust: int, roles: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "uid": {"type": "Agent", "id": agent_id(tenant, fleet, agent)},
        "attrs": {
            "tenant": ref("Tenant", tenant),
            "fleet": ref("Fleet", f"{tenant}/{fleet}"),
            "trust": trust,
            "roles": list(roles),
        },
        "parents": [{"type": "Fleet", "id": f"{tenant}/{fleet}"}],
    }


def fleet_entity(tenant: str, fleet: str) -> dict[str, Any]:
    return {
        "uid": {"type": "Fleet", "id": f"{tenant}/{fleet}"},
        "attrs": {"tenant": ref("Tenant", tenant)},
        "parents": [{"type": "Tenant", "id": tenant}],
    }


def deployment_entity(deployment: str) -> dict[str, Any]:
    """``Deployment::"<deployment>"`` (``chroma`` or ``mem0:<name>``): the backend as a whole."""
    return {"uid": {"type": "Deployment", "id": deployment}, "attrs": {}, "parents": []}


def namespace_entity(tenant: str, database: str) -> dict[str, Any]:
    return {
        "uid": {"type": "Namespace", "id": f"{tenant}/{database}"},
        "attrs": {"tenant": ref("Tenant", tenant)},
        "parents": [{"type": "Tenant", "id": tenant}],
    }


def collection_entity(backend: str, collection_id: str, tenant: str, database: str) -> dict[str, Any]:
    return {
        "uid": {"type": "Collection", "id": f"{backend}:{collection_id}"},
        "attrs": {"tenant": ref("Tenant", tenant)},
        "parents": [{"type": "Namespace", "id": f"{tenant}/{database}"}],
    }


@dataclass(slots=True)
class Row:
    """Governance metadata of one backend row, keyed by (backend, collection, row_id).

    `owner`/`writer` and each of `readers` are agent ids ``"t/f/a"``; times are UTC microseconds.
    """

    backend: str
    collection: str
    row_id: str
    tenant: str
    fleet: str
    owner: str
    scope: str
    writer: str
    created_at: int
    status: str = "active"
    readers: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    request_id: str = ""
    subject: str | None = None
    predicate: str | None = None
    object: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Provenance and supersession (docs/design.md §4). `derived_from` holds (collection, row id) parents;
    # `single_valued` marks a triple whose predicate is declared single-valued (policies/single_valued.txt).
    source: str = ""
    derived_from: tuple[tuple[str, str], ...] = ()
    single_valued: bool = False
    supersedes: tuple[str, str] | None = None  # (collection, row id) this row replaced
    superseded_by: tuple[str, str] | None = None
    superseded_at: int | None = None
    content_hmac: str | None = None
    # The same text's HMACs under earlier normalisations (`sidecar.provenance.legacy_content_digests`; never
    # stored): deleted content recorded before an upgrade still matches (`Provenance.forgotten`).
    content_legacy: tuple[str, ...] = ()

    @property
    def uid(self) -> tuple[str, str]:
        return ("Memory", f"{self.backend}:{self.collection}:{self.row_id}")

    def entity(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "tenant": ref("Tenant", self.tenant),
            "fleet": ref("Fleet", f"{self.tenant}/{self.fleet}"),
            "owner": ref("Agent", self.owner),
            "scope": self.scope,
            "status": self.status,
            "readers": [ref("Agent", r) for r in self.readers],
            "labels": list(self.labels),
        }
        for name in ("subject", "predicate", "object"):
            value = getattr(self, name)
            if value is not None:
                attrs[name] = value
        # Optional backend attributes declared in the schema (e.g. Mem0's user_id/run_id).
        for name, value in (self.extra.get("cedar") or {}).items():
            attrs.setdefault(name, value)
        return {
            "uid": {"type": "Memory", "id": self.uid[1]},
            "attrs": attrs,
            "parents": [{"type": "Fleet", "id": f"{self.tenant}/{self.fleet}"}],
        }


def stamped_as(meta: Any, row: Row) -> bool:
    """Whether a row's metadata as the backend answered it (`meta`) was stamped under the ledger row's governance:
    scope, fleet, readers and labels, what an update changes and Cedar decides on. Readers and labels are stamped
    comma-joined (Chroma: ``"t/f/a,t/f/b"``) or as lists (Mem0).

    A backend stores a row's content and metadata together (a Chroma record, a Mem0 memory), and an update writes
    the new governance's stamp with the new content before the ledger takes the new governance. A row stamped
    otherwise than its ledger row is content of another governance: written by an update whose ledger write has not
    landed, or read before one that has (docs/design.md §2.6, reads during an update); it is never decided on.
    True for metadata never stamped (no ``mw_scope``: a row `sidecar.adopt` registered and has not stamped yet),
    which no update leaves behind: an update stamps, and both backends merge an update's metadata into the row's."""
    if type(meta) is not dict or "mw_scope" not in meta:
        return True
    if meta["mw_scope"] != row.scope or meta.get("mw_fleet") != row.fleet:
        return False
    for value, names in ((meta.get("mw_readers"), row.readers), (meta.get("mw_labels"), row.labels)):
        if not (value == list(names) if type(value) is list else (value or "") == ",".join(names)):
            return False
    return True


def fact_partition(row: "Row") -> str:
    """The visibility partition of a row (docs/design.md §4, README "Supersession"): single-valued facts are
    single-valued within one (tenant, collection, partition). Chosen so that every principal that may
    write a row into a partition may read every fact in it (default policies): ``agent:<owner>`` (only the
    owner writes and reads it), ``fleet:<tenant>/<fleet>`` (written by the fleet at trust >= 1 or by
    trust 3, read by the fleet or trust >= 2), ``tenant`` (the whole tenant), and
    ``restricted:<owner>|<sorted readers>`` (only its owner writes it)."""
    if row.scope == "agent":
        return f"agent:{row.owner}"
    if row.scope == "fleet":
        return f"fleet:{row.tenant}/{row.fleet}"
    if row.scope == "tenant":
        return "tenant"
    return f"restricted:{row.owner}|{','.join(sorted(row.readers))}"


def row_entities(principal: Principal, rows: list[Row], owners: dict[str, dict[str, Any]],
                 extra_rows: list[Row] | None = None) -> list[dict[str, Any]]:
    """Entity store for a batch of row decisions: principal (+ancestors), rows, their fleets, their owners
    and the owners' fleets, and the same for `extra_rows` except their own entities.

    `owners` maps agent id → Cedar entity (from the ledger's agent table); an owner the ledger does
    not know is left out (an attribute access on it errors, so a permit needing it is skipped).
    """
    entities = principal.entities()
    seen = {(e["uid"]["type"], e["uid"]["id"]) for e in entities}

    def add(entity: dict[str, Any]) -> None:
        key = (entity["uid"]["type"], entity["uid"]["id"])
        if key not in seen:
            seen.add(key)
            entities.append(entity)

    def add_owner(row: Row) -> None:
        owner = owners.get(row.owner)
        if owner is not None:
            add(owner)
            # the owner's fleet too: every entity a row's attributes reach is in the store (or, for an
            # owner the ledger does not know, absent whatever the batch), so a row's decision does not
            # depend on which other rows share the batch (`Authorizer.decide_rows` relies on it)
            tenant, _, fleet = str(owner["attrs"]["fleet"]["__entity"]["id"]).partition("/")
            add(fleet_entity(tenant, fleet))

    for row in rows:
        add(row.entity())
        add(fleet_entity(row.tenant, row.fleet))
        add_owner(row)
    for row in extra_rows or []:
        add(fleet_entity(row.tenant, row.fleet))
        add_owner(row)
    return entities
