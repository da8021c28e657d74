"""Caches of API keys, collections and agents in front of a ledger, invalidated so that a change made
by any process — a key revoked, a collection deleted, an agent's trust changed — is seen on the next
request.

`CachingLedger(inner, version, ttl_s, cache_keys)` wraps a `Ledger`. It serves ``authenticate`` (with
`cache_keys`), ``get_collection`` and ``agent_entities`` from memory, and everything else from `inner`.
Row governance (status, scope, readers, supersession, tombstones) is never cached. An entry is used only
while all of these hold; otherwise every cache is dropped and the ledger is asked:

- `version()` returns the token it returned when the entry was stored. The SQLite ledger's token is
  ``PRAGMA data_version`` (changed by every commit of another connection, any process) with its own count
  of write transactions (`SQLiteLedger.cache_version`); the PostgreSQL ledger's is the count of
  notifications received on its ``LISTEN`` channel (every write that changes keys, collections or agents
  sends one in its transaction), and ``None`` while that channel is down — then nothing is cached at all.
  The token is read for every request, never from a remembered value: a change committed just before a
  request must fail that request;
- the entry is younger than `ttl_s` seconds (a backstop for changes made around memwarden);
- no write went through this wrapper since (every method not in `READ_ONLY` drops the caches).

Only positive answers are cached (an unknown key or collection is asked again each time), and a key is never
served from memory past its expiry (`Principal.expires_at`: a key created with one, or in a rotation's grace). Cached keys
are indexed by a keyed hash of the presented key (a random key per process), never by the key itself.

On PostgreSQL keys are not served by ``authenticate`` (a notification from another replica may still be in
flight when the next request arrives). What is kept instead, under the same validity rules, is the
principal of a key this process verified (`authenticate`, `authenticate_async`): `verified_principal` hands it to a read
that re-checks the key in the same statement as its rows (`sidecar.stages.authorize.Authorizer.authenticate`),
so the revocation is still seen by the very next request, without a round trip of its own.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from sidecar.governance import Principal
from sidecar.ledger.base import CollectionRecord, now_us

READ_ONLY = frozenset({
    "authenticate", "list_keys", "agent_entities", "get_collection", "list_collections", "get_rows",
    "content_copies", "active_fact", "forgotten", "content_key", "lineage", "backend_deleted_tombstones",
    "pending_tombstones", "ping", "visibility_counts", "visible_row_ids", "visible_owners", "visible_row_ids_of", "pool_stats", "schema_version", "data_version",
    "last_backend_delete", "cache_version", "close", "listing_keys", "collection_intent", "refresh_statistics",
    # the versions of a row (`row_versions`, Mem0 history): never cached
    "row_versions",
    # the asynchronous hot-path reads (`sidecar.ledger.offloop`): never cached, they read rows and keys now
    "read_rows_async", "read_rows", "visible_rows_async", "visible_rows", "key_valid", "open_async", "aclose", "cached_collection",
})

_blake2b = hashlib.blake2b
MAX_VERIFIED = 10000  # principals kept for `CachingLedger.verified_principal` (all dropped when full)


def _unexpired(principal: Any) -> bool:
    """Whether a kept principal's key has not expired (`Principal.expires_at`; none: never expires)."""
    expires_at = getattr(principal, "expires_at", None)
    return expires_at is None or now_us() < expires_at


class RequestScope:
    """One request's reading of a `CachingLedger`'s token (see `request_scope`): `ledger` and `token` are None
    until the request's first lookup (class attributes: making one runs no ``__init__``)."""

    ledger: Any = None
    token: Any = None


_SCOPE: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("memwarden_ledger_request", default=None)


def enter_request() -> contextvars.Token[RequestScope | None]:
    """Enter a new request scope (see `request_scope`) in the current context; returns the token that
    `leave_request` takes to leave it (restoring the scope, or none, the context had before). What
    ``with request_scope():`` does, without the generator: `sidecar.pipeline.Pipeline.run` calls the two
    around its stages, ``leave_request`` in a ``finally``."""
    return _SCOPE.set(RequestScope())


# Leave the scope `enter_request` entered: ``ContextVar.reset`` of its token (ValueError for a token of another
# context, RuntimeError for one used already).
leave_request: Callable[[contextvars.Token[RequestScope | None]], None] = _SCOPE.reset


@contextmanager
def request_scope() -> Iterator[RequestScope]:
    """The extent of one request (`sidecar.pipeline.Pipeline`): in it, a `CachingLedger` made with
    ``per_request=True`` reads its token (``PRAGMA data_version`` on SQLite, the notification count on
    PostgreSQL) at the request's first lookup, and its later lookups in the same request use that reading
    while nothing has moved the caches since (no write through the wrapper, no newer token — or none, the
    channel down — seen by another request). A change committed (on PostgreSQL: a notification received, or
    waiting unread on the listening socket) before the request's first lookup is seen by all of them; one
    committed during the request is seen from the next request on. Outside a scope every lookup reads the
    token. `enter_request` and `leave_request` are the same without the generator."""
    token = enter_request()
    try:
        yield _SCOPE.get()  # type: ignore[misc]
    finally:
        leave_request(token)


class CachingLedger:
    """See the module docstring. `version`: the invalidation token (None: do not cache now)."""

    def __init__(self, inner: Any, version: Callable[[], Any], ttl_s: float = 5.0, cache_keys: bool = True,
                 per_request: bool = False) -> None:
        self.inner = inner
        self._version = version
        self.per_request = per_request  # one token reading per request (`request_scope`)
        self.ttl_s = ttl_s
        self.cache_keys = cache_keys
        self._lock = threading.Lock()
        self._token: Any = None
        self._keys: dict[bytes, tuple[float, Principal]] = {}
        self._collections: dict[tuple[str, str], tuple[float, CollectionRecord]] = {}
        self._agents: dict[str, tuple[float, dict[str, Any]]] = {}
        self._verified: dict[bytes, tuple[float, Principal]] = {}
        self._secret = os.urandom(32)
        self.hits = 0
        self.misses = 0

    # -- validity ---------------------------------------------------------------------------
    def _current(self) -> tuple[bool, float]:
        """(caching allowed now, oldest acceptable entry time); drops everything on a new token. Within a
        `request_scope` (with `per_request`), the token this request read is used while it is still the
        caches' token (the very object: nothing dropped or renewed them since)."""
        scope = _SCOPE.get() if self.per_request else None
        if scope is not None and scope.ledger is self and scope.token is not None and scope.token is self._token:
            return True, time.monotonic() - self.ttl_s
        token = self._version()
        now = time.monotonic()
        if token is None:
            self.clear()
            return False, now
        if token != self._token:
            with self._lock:
                self._keys.clear()
                self._collections.clear()
                self._agents.clear()
                self._verified.clear()
                self._token = token
        if scope is not None:
            scope.ledger, scope.token = self, self._token
        return True, now - self.ttl_s

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()
            self._collections.clear()
            self._agents.clear()
            self._verified.clear()
            self._token = None

    # -- cached reads -----------------------------------------------------------------------
    def authenticate(self, plaintext: str) -> Principal | None:
        if not self.cache_keys and self.ttl_s > 0:
            ok = self._current()[0]
            token = self._token
            principal = self.inner.authenticate(plaintext)
            self._keep_verified(plaintext, principal, ok, token)
            return principal
        if not self.cache_keys or self.ttl_s <= 0:
            return self.inner.authenticate(plaintext)
        ok, oldest = self._current()
        if not ok:
            return self.inner.authenticate(plaintext)
        digest = self._digest(plaintext)
        hit = self._keys.get(digest)
        if hit is not None and hit[0] >= oldest and _unexpired(hit[1]):
            self.hits += 1
            return hit[1]
        self.misses += 1
        token = self._token
        principal = self.inner.authenticate(plaintext)
        if principal is not None and self._token == token:
            self._keys[digest] = (time.monotonic(), principal)
        return principal

    def _digest(self, plaintext: str) -> bytes:
        """Keyed BLAKE2b-256 of `plaintext` (UTF-8, surrogates passed) under this object's random 32-byte key:
        32 bytes, the index of the key caches (BLAKE2's keyed mode is a MAC, as HMAC-SHA256 was here, at
        less than half its cost per call)."""
        return _blake2b(plaintext.encode("utf-8", "surrogatepass"), key=self._secret, digest_size=32).digest()

    async def authenticate_async(self, plaintext: str) -> Principal | None:
        """The ledger's `authenticate_async` (read now, never from memory); a valid key's principal is kept
        for `verified_principal` (as `authenticate` does when `cache_keys` is off)."""
        ok = self.ttl_s > 0 and self._current()[0]
        token = self._token
        principal = await self.inner.authenticate_async(plaintext)
        self._keep_verified(plaintext, principal, ok, token)
        return principal

    def _keep_verified(self, plaintext: str, principal: Principal | None, ok: bool, token: Any) -> None:
        """Keep `principal` for `verified_principal` if the caches were valid under `token` before the ledger
        was asked and nothing changed since."""
        if principal is not None and ok and self._token == token and self._version() == token:
            if len(self._verified) >= MAX_VERIFIED:
                self._verified.clear()
            self._verified[self._digest(plaintext)] = (time.monotonic(), principal)

    def verified_principal(self, plaintext: str) -> Principal | None:
        """The principal `authenticate_async` returned for `plaintext` in this process, while the caches are
        valid (no notification since, channel up, younger than `ttl_s`); else None. Not proof that the key
        is valid NOW: the caller must re-check it (``read_rows_async(..., key_id)``) before answering."""
        if self.ttl_s <= 0:
            return None
        ok, oldest = self._current()
        if not ok:
            return None
        hit = self._verified.get(self._digest(plaintext))
        if hit is None or hit[0] < oldest or not _unexpired(hit[1]):
            return None
        self.hits += 1
        return hit[1]

    def forget_key(self, plaintext: str) -> None:
        """Drop what `verified_principal` kept for `plaintext` (its re-check failed)."""
        self._verified.pop(self._digest(plaintext), None)

    def cached_collection(self, backend: str, collection_id: str) -> bool:
        """Whether `get_collection` would answer (backend, collection_id) from memory now."""
        if self.ttl_s <= 0:
            return False
        ok, oldest = self._current()
        hit = self._collections.get((backend, collection_id)) if ok else None
        return hit is not None and hit[0] >= oldest

    def get_collection(self, backend: str, collection_id: str) -> CollectionRecord | None:
        if self.ttl_s <= 0:
            return self.inner.get_collection(backend, collection_id)
        ok, oldest = self._current()
        if not ok:
            return self.inner.get_collection(backend, collection_id)
        hit = self._collections.get((backend, collection_id))
        if hit is not None and hit[0] >= oldest:
            self.hits += 1
            return hit[1]
        self.misses += 1
        token = self._token
        rec = self.inner.get_collection(backend, collection_id)
        if rec is not None and self._token == token:
            self._collections[(backend, collection_id)] = (time.monotonic(), rec)
        return rec

    def agent_entities(self, agent_uids: set[str]) -> dict[str, dict[str, Any]]:
        if self.ttl_s <= 0:
            return self.inner.agent_entities(agent_uids)
        ok, oldest = self._current()
        if not ok:
            return self.inner.agent_entities(agent_uids)
        out: dict[str, dict[str, Any]] = {}
        missing = set()
        for uid in agent_uids:
            hit = self._agents.get(uid)
            if hit is not None and hit[0] >= oldest:
                out[uid] = hit[1]
            else:
                missing.add(uid)
        if missing:
            self.misses += 1
            token = self._token
            found = self.inner.agent_entities(missing)
            if self._token == token:
                now = time.monotonic()
                for uid, entity in found.items():
                    self._agents[uid] = (now, entity)
            out.update(found)
        else:
            self.hits += 1
        return out

    # -- everything else --------------------------------------------------------------------
    @property
    def blocking_io(self) -> Any:
        """`inner`'s ``blocking_io`` (False when it has none): read by `sidecar.ledger.offloop.blocking`."""
        return getattr(self.inner, "blocking_io", False)

    @property
    def async_io(self) -> Any:
        """`inner`'s ``async_io`` (False when it has none): read by `sidecar.ledger.offloop.asynchronous`."""
        return getattr(self.inner, "async_io", False)

    def __getattr__(self, name: str) -> Any:
        """`inner`'s attribute; a method not in `READ_ONLY` drops every cache before and after it runs.
        When `inner` keeps its methods (``stable_methods``: `sidecar.metrics.InstrumentedLedger`) the
        method found is stored on this object, so the next call does not come through here."""
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr
        if name in READ_ONLY:
            method = attr
        else:
            def write(*args: Any, **kwargs: Any) -> Any:
                self.clear()
                try:
                    return attr(*args, **kwargs)
                finally:
                    self.clear()
            method = write
        if not name.startswith("_") and getattr(self.inner, "stable_methods", False):
            self.__dict__[name] = method
        return method
