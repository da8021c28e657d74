"""Ledger protocol and records. Implementations: `sidecar.ledger.sqlite.SQLiteLedger`.

All times are UTC microseconds since the epoch. Methods are synchronous and short (one transaction
each); every write method commits durably before it returns (a tombstone is on disk before the
backend delete is attempted).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol
from urllib.parse import urlsplit, urlunsplit

from sidecar.governance import Principal, Row

KEY_PREFIX = "mwk_"


def redact_url(url: str) -> str:
    """`url` without its password (``user:***@host``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def now_us() -> int:
    """Current UTC time in microseconds."""
    return time.time_ns() // 1000


def new_key_secret() -> tuple[str, str]:
    """A fresh (key_id, secret) pair; the API key shown to the user is ``mwk_<key_id>.<secret>``."""
    return secrets.token_hex(8), secrets.token_urlsafe(32)


def hash_secret(salt: bytes, secret: str) -> str:
    """Salted HMAC-SHA256 of a key secret (keys are 256-bit random, so no slow KDF is needed)."""
    return hmac.new(salt, secret.encode("utf-8"), hashlib.sha256).hexdigest()


def parse_key(plaintext: str) -> tuple[str, str] | None:
    """Split ``mwk_<key_id>.<secret>``; None when malformed."""
    if not plaintext.startswith(KEY_PREFIX) or "." not in plaintext:
        return None
    key_id, _, secret = plaintext[len(KEY_PREFIX):].partition(".")
    if not key_id or not secret or len(plaintext) > 200:
        return None
    return key_id, secret


# How long an update's marker (`Ledger.begin_update`) excludes other updates of its rows, seconds: an update holds
# it from before its ledger read to after its ledger write; a marker older than this (left by an update whose
# process died) may be taken over. The sidecar's ``UPDATE_LEASE_S`` setting.
UPDATE_LEASE_S = 30.0


class UpdateLost(Exception):
    """`Ledger.update_governance` with `holder`: an update marker of one of the rows is no longer the holder's (the
    update outlived its lease and another update took the row over). Nothing was written; `row_ids` are the rows."""

    def __init__(self, row_ids: list[str]) -> None:
        super().__init__(f"the update markers of {len(row_ids)} rows were taken over")
        self.row_ids = row_ids


@dataclass(frozen=True, slots=True)
class RowVersion:
    """The governance one version of a row was written under (ledger schema version 9; `Ledger.row_versions`), for a
    backend that keeps a row's past versions (Mem0's history). `kind`: ``created`` — the governance the row was
    created with (its backend's creation event); ``baseline`` — the governance it had when the ledger was migrated to
    version 9 (it matches no event: what was written before is not known); ``update`` — an update through the
    sidecar, `event_id` being the backend's id of the history event it wrote, or None when not known. `version`
    counts from 0 per row; times are UTC µs."""

    version: int
    kind: str
    event_id: str | None
    tenant: str
    fleet: str
    owner: str
    scope: str
    readers: tuple[str, ...]
    labels: tuple[str, ...]
    written_at: int
    request_id: str


class StaleFact(Exception):
    """`Ledger.activate_rows` with `expect`: the active fact a row would supersede is not the one the
    caller expected (another write replaced it since). Nothing was activated; `row_id` is the row and
    `current` the (collection, id) of the fact now active, or None."""

    def __init__(self, row_id: str, current: tuple[str, str] | None) -> None:
        super().__init__(f"the fact row {row_id} would supersede changed (now {current})")
        self.row_id = row_id
        self.current = current


# A role (``Agent.roles``) or a label (``Memory.labels``): a short name, so that it reads the same in a policy,
# a key list, row metadata and a decision log.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
MAX_NAMES = 32


def check_names(kind: str, names: Iterable[str]) -> tuple[str, ...]:
    """Roles or labels as stored: each matching `NAME_PATTERN` (1-64 characters of ``A-Z a-z 0-9 _ . : -``,
    starting with a letter or digit), at most `MAX_NAMES`, duplicates dropped, sorted. Raises ValueError
    naming `kind` (``role``, ``label``) and the offending name."""
    out = set()
    for name in names:
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ValueError(f"{kind} {name!r} is not a {kind} name (1-64 characters of A-Z a-z 0-9 _ . : -, "
                             "starting with a letter or digit)")
        out.add(name)
    if len(out) > MAX_NAMES:
        raise ValueError(f"at most {MAX_NAMES} {kind}s")
    return tuple(sorted(out))


# `last_used_at` is written when the stored value is older than this (or none): at most one write a minute per key.
LAST_USED_RESOLUTION_US = 60_000_000


def rotation_expiry(old: "KeyRecord", now: int, expires_at: int | None) -> int | None:
    """The expiry of the key that replaces `old` at `now` (UTC µs): `expires_at` when given, else `old`'s lifetime
    (expiry less creation) from now when it had one, else none."""
    if expires_at is not None or old.expires_at is None:
        return expires_at
    return now + max(old.expires_at - old.created_at, 0)


def key_row_valid(revoked_at: int | None, expires_at: int | None, at_us: int) -> bool:
    """Whether a key row with these columns authenticates at `at_us` (UTC µs): not revoked, not expired."""
    return revoked_at is None and (expires_at is None or at_us < expires_at)


def check_key_request(kind: str, tenant: str | None, fleet: str | None, agent: str | None, trust: int,
                      roles: Iterable[str] = ()) -> tuple[str, ...]:
    """Validate a `Ledger.create_key` request; raises ValueError naming the problem. Agent keys need
    tenant, fleet and agent; admin keys a tenant; operator keys no tenant (they act on the deployment).
    Roles (``Agent.roles``) are for agent keys only; returns them as stored (`check_names`)."""
    if kind not in ("agent", "admin", "operator"):
        raise ValueError("kind must be 'agent', 'admin' or 'operator'")
    roles = check_names("role", roles)
    if roles and kind != "agent":
        raise ValueError("roles are attributes of agents (Agent.roles); admin and operator keys take none")
    if kind == "operator":
        if tenant or fleet or agent:
            raise ValueError("operator keys belong to no tenant, fleet or agent")
        return roles
    if not tenant:
        raise ValueError("agent and admin keys need a tenant")
    for name, value in (("tenant", tenant), ("fleet", fleet), ("agent", agent)):
        if value is not None and (not value or "/" in value or ":" in value or not value.isprintable()):
            raise ValueError(f"{name} must be a non-empty printable name without '/' or ':'")
    if kind == "agent" and (not fleet or not agent):
        raise ValueError("agent keys need fleet and agent")
    if not 0 <= trust <= 3:
        raise ValueError("trust must be 0..3")
    return roles


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """An API key's record. `tenant` is None for an operator key (kind ``operator``); `roles` (sorted) are an
    agent key's ``Agent.roles`` (ledger schema version 5)."""

    key_id: str
    kind: str
    tenant: str | None
    fleet: str | None
    agent: str | None
    trust: int
    created_at: int
    revoked_at: int | None
    roles: tuple[str, ...] = ()
    # Ledger schema version 10 (key hygiene): UTC µs after which the key is refused (None: never), UTC µs of the
    # last request it authenticated (written at most once a minute, `LAST_USED_RESOLUTION_US`), and the key id that
    # replaced it in a rotation (`Ledger.rotate_key`; it stays valid until `expires_at`, the grace period).
    expires_at: int | None = None
    last_used_at: int | None = None
    rotated_to: str | None = None

    def valid(self, at_us: int) -> bool:
        """Whether the key authenticates at time `at_us` (UTC µs): not revoked, not expired."""
        return self.revoked_at is None and (self.expires_at is None or at_us < self.expires_at)

    def principal(self) -> Principal:
        if self.kind == "operator":
            return Principal(kind="operator", key_id=self.key_id, tenant="", expires_at=self.expires_at)
        if self.kind == "admin":
            return Principal(kind="admin", key_id=self.key_id, tenant=self.tenant, expires_at=self.expires_at)
        return Principal(kind="agent", key_id=self.key_id, tenant=self.tenant, fleet=self.fleet, agent=self.agent,
                         trust=self.trust, roles=self.roles, expires_at=self.expires_at)


@dataclass(frozen=True, slots=True)
class CollectionRecord:
    backend: str
    collection_id: str
    tenant: str
    database: str
    name: str
    created_by: str
    created_at: int


@dataclass(frozen=True, slots=True)
class CollectionIntent:
    """A collection create the sidecar decided and is about to send to the backend (ledger schema version 7),
    recorded before the backend call: `nonce` is also written into the new collection's metadata, so that after a
    crash between the backend's create and `Ledger.resolve_collection_intent` the collection found under `name`
    is registered only if it carries this nonce (it is the one this create made), never otherwise."""

    backend: str
    nonce: str
    tenant: str
    database: str
    name: str
    created_by: str
    created_at: int


class Ledger(Protocol):
    # keys and agents
    def create_key(self, kind: str, tenant: str | None, fleet: str | None, agent: str | None, trust: int,
                   roles: Iterable[str] = (), expires_at: int | None = None) -> tuple[KeyRecord, str]: ...
    def authenticate(self, plaintext: str) -> Principal | None: ...
    def list_keys(self, tenant: str | None = None) -> list[KeyRecord]: ...
    def key_valid(self, key_id: str) -> bool: ...
    def revoke_key(self, key_id: str) -> bool: ...
    def rotate_key(self, key_id: str, grace_s: float, expires_at: int | None = None) -> tuple[KeyRecord, str, int]: ...
    def agent_entities(self, agent_uids: set[str]) -> dict[str, dict[str, Any]]: ...
    # collections
    def register_collection(self, record: CollectionRecord) -> None: ...
    def get_collection(self, backend: str, collection_id: str) -> CollectionRecord | None: ...
    def list_collections(self, backend: str, tenant: str, database: str) -> list[CollectionRecord]: ...
    def delete_collection(self, backend: str, collection_id: str, by: str, request_id: str) -> None: ...
    def record_collection_intent(self, intent: CollectionIntent) -> None: ...
    def collection_intent(self, backend: str, nonce: str) -> CollectionIntent | None: ...
    def resolve_collection_intent(self, intent: CollectionIntent, record: CollectionRecord | None) -> None: ...
    # rows
    def get_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> dict[str, Row]: ...
    def reserve_rows(self, rows: list[Row]) -> list[str]: ...
    def activate_rows(self, backend: str, collection_id: str, row_ids: list[str],
                      expect: Mapping[str, tuple[str, str] | None] | None = None) -> list[tuple[str, tuple[str, str]]]: ...
    def release_rows(self, backend: str, collection_id: str, row_ids: list[str]) -> None: ...
    def adopt_rows(self, rows: list[Row], listing: list[tuple[str, str, str]] | None = None) -> list[str]: ...
    def listing_keys(self, backend: str, collection_id: str, tenant: str) -> list[tuple[str, str]]: ...
    def update_governance(self, rows: list[Row], *, holder: str | None = None,
                          history: Mapping[str, str | None] | None = None) -> None:
        """Persist scope, fleet, readers, labels and content HMAC of existing `rows`, in one transaction. With
        `holder` (a request id): every row's update marker (`begin_update`) must be the holder's, else `UpdateLost`
        and nothing is written; then every marker the holder has in those collections is released. With `history`
        (row id → the backend's history event id of this update, or None): each named row's version is recorded
        (`row_versions`; its governance before the update first, as version 0 ``created``, when it has none)."""
        ...
    # per-row update markers and row versions (schema version 9)
    def begin_update(self, backend: str, collection_id: str, row_ids: list[str], request_id: str,
                     lease_s: float = UPDATE_LEASE_S) -> list[str]:
        """Take the update marker of every one of `row_ids` for `request_id` (with the time it is taken), in one
        transaction: all or none. Returns [] when taken, else the ids (sorted) another request's marker younger than
        `lease_s` seconds holds, and takes none. An older marker (its update died) is taken over."""
        ...
    def end_update(self, backend: str, collection_id: str, row_ids: list[str], request_id: str) -> None:
        """Release the markers of `row_ids` that `request_id` holds (others' are left alone)."""
        ...
    def row_versions(self, backend: str, collection_id: str, row_id: str) -> list[RowVersion]:
        """The recorded versions of a row (`RowVersion`), oldest first; [] when none is recorded. Read now."""
        ...
    def tombstone(self, backend: str, collection_id: str, row_ids: list[str], by: str, request_id: str,
                  closure: str = "cascade", also: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]: ...
    def reset(self, backend: str, collection_id: str | None, by: str, request_id: str) -> int: ...
    def reset_done(self, backend: str, collection_id: str | None) -> None: ...
    # provenance, supersession, closure (schema version 2)
    def content_copies(self, backend: str, tenant: str, digests: list[str], deleted: bool = False) -> list[Row]: ...
    def active_fact(self, backend: str, tenant: str, subject: str, predicate: str, *,
                    collection: str | None = None, partition: str | None = None) -> Row | None: ...
    def forgotten(self, tenant: str, hmacs: list[str]) -> set[str]: ...
    def content_key(self) -> bytes: ...
    def lineage(self, backend: str, collection_id: str, row_id: str,
                max_nodes: int = 1000) -> list[tuple[int, Row | None, tuple[str, str], list[tuple[str, str]]]]: ...
    def backend_deleted_tombstones(self, backend: str, after: tuple[str, str] = ("", ""),
                                   limit: int = 500) -> list[tuple[str, str]]: ...
    def mark_backend_deleted(self, backend: str, collection_id: str, row_ids: list[str]) -> None: ...
    def pending_tombstones(self, backend: str) -> list[tuple[str, str]]: ...
    def last_backend_delete(self, backend: str) -> int | None: ...
    # statistics for the query planner (`sidecar.planner`)
    def visibility_counts(self, backend: str, collection_id: str) -> list[tuple[str, str, str, tuple[str, ...], str, int]]: ...
    def visible_row_ids(self, backend: str, collection_id: str, tenant: str, reader: tuple[str, str | None, bool] | None,
                        limit: int) -> list[str] | None:
        """Ids of the collection's rows of `tenant` that are neither deleted nor pending and that the caller's
        visibility filter admits — the reference scope predicate of docs/design.md §3 (`auth`) over the ledger's
        own columns, the filter `sidecar.backends.chroma.visibility_where` writes over stamped metadata: with
        `reader` = (agent uid, fleet, any fleet) the reader's own agent-scoped rows, fleet-scoped rows of its
        fleet (of every fleet when any fleet: trust ≥ 2), tenant-scoped rows and restricted rows whose readers
        name it; with None every such row of the tenant. Read now, never cached (row scope and readers are
        never served from a cache). None when more than `limit` rows qualify; order unspecified."""
        ...
    def visible_owners(self, backend: str, collection_id: str, tenant: str,
                       reader: tuple[str, str | None, bool] | None) -> list[str]:
        """The owners (agent uids, sorted) of the rows `visible_row_ids` would list — the collection's rows of `tenant`,
        neither deleted nor pending, that the caller's visibility filter admits: the agents under whose ids a backend
        that lists rows per agent (Mem0's ``GET /memories?agent_id=``) holds a row the caller may be served. Read now,
        never cached."""
        ...
    def visible_row_ids_of(self, backend: str, collection_id: str, tenant: str,
                           reader: tuple[str, str | None, bool] | None, owner: str, limit: int) -> list[str] | None:
        """`visible_row_ids` of the rows `owner` (an agent uid) owns. Read now, never cached; None when more than
        `limit` rows qualify; order unspecified."""
        ...
    def ping(self) -> bool: ...
    def close(self) -> None: ...
