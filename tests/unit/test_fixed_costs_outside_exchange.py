"""The per-request fast paths outside the backend exchange (issue: CPU per request) agree with the code
they replace, kept here as the reference:

- `Authorizer._rechecked` resets the fields the old hand-written list reset (a field added to `Exchange`
  is reset unless it is the request's own);
- `Authorizer` looks ``read_rows`` up once per ledger object (on SQLite the look-up raises AttributeError
  through both wrappers) and reads, prefetches and settles as `offloop.read_rows` without the hint does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import Unauthorized
from sidecar.exchange import Exchange
from sidecar.governance import Principal
from sidecar.ledger import SQLiteLedger, offloop
from sidecar.ledger.cache import CachingLedger
from sidecar.metrics import InstrumentedLedger, Metrics
from sidecar.stages import authorize
from sidecar.stages.authorize import Authorizer

# -- _rechecked --------------------------------------------------------------------------------------

# The key id the credential names, the client and the credential header kind are the request's own since issue 34
# (a revoked key's 401 names its key id, as a first check's does); the actions, the denied action and the denied
# row ids are reset with the other decision fields.
REFERENCE_RESET = ("principal", "operation", "action", "resource", "decision", "reason", "policy_set",
                   "policies", "deny_policies", "rows_allowed", "rows_denied", "rows_malformed",
                   "rows_hidden_superseded", "rows_hidden_deleted", "rows_unknown", "row_deny_reasons",
                   "evaluation_errors", "would_deny", "would_deny_reasons", "would_deny_row_ids", "would_deny_seen",
                   "row_ids", "actions", "deny_action", "denied_row_ids")


def reference_rechecked(ex: Exchange) -> None:
    """`Authorizer._rechecked`'s reset before the derived field list (the failed re-check's branch)."""
    ex.key_recheck = None
    fresh = Exchange(method=ex.method, raw_path=ex.raw_path)
    for name in REFERENCE_RESET:
        setattr(ex, name, getattr(fresh, name))


def _filled() -> Exchange:
    """An exchange whose every field differs from a fresh one's."""
    ex = Exchange(method="GET", raw_path="/p")
    samples: dict[type, Any] = {int: 7, str: "x", set: {"p"}, dict: {"k": 1}, list: ["r"]}
    for f in dataclasses.fields(Exchange):
        if f.name in ("method", "raw_path"):
            continue
        cur = getattr(ex, f.name)
        value = samples.get(type(cur), object())
        if f.name == "key_recheck":
            value = ("kid", "secret")
        elif f.name == "principal":
            value = Principal("agent", "kid", "t", "red", "a", 1)
        setattr(ex, f.name, value)
    return ex


def _state(ex: Exchange) -> dict[str, Any]:
    return {f.name: getattr(ex, f.name) for f in dataclasses.fields(Exchange)}


def test_a_failed_recheck_resets_what_the_hand_written_list_reset() -> None:
    new, old = _filled(), _filled()
    old.request_id = new.request_id
    old.started_ns = new.started_ns
    for name in ("policies", "deny_policies", "row_deny_reasons", "evaluation_errors", "would_deny_reasons",
                 "would_deny_row_ids", "would_deny_seen", "row_ids", "actions", "denied_row_ids", "client", "key_id", "segments", "query", "headers",
                 "ledger_rows", "prefetched",
                 "prefetched_owners", "stripped_headers"):
        setattr(old, name, getattr(new, name))  # the same objects, so kept ones compare equal
    old.body = new.body
    old.policy_set = new.policy_set
    authz = Authorizer(None, None)  # type: ignore[arg-type]
    with pytest.raises(Unauthorized):
        authz._rechecked(new, key_ok=False)
    reference_rechecked(old)
    assert _state(new) == _state(old)
    assert new.principal is None and new.decision is None and new.rows_allowed == 0


def test_a_passed_recheck_changes_nothing_but_the_pending_recheck() -> None:
    ex = _filled()
    before = _state(ex)
    Authorizer(None, None)._rechecked(ex, key_ok=True)  # type: ignore[arg-type]
    assert _state(ex) == {**before, "key_recheck": None}


def test_every_exchange_field_is_either_reset_or_the_requests_own() -> None:
    names = {f.name for f in dataclasses.fields(Exchange)}
    assert set(authorize._DECISION_FIELDS) == set(REFERENCE_RESET)
    assert set(authorize._DECISION_FIELDS) | authorize._REQUEST_FIELDS == names
    assert not set(authorize._DECISION_FIELDS) & authorize._REQUEST_FIELDS


# -- read_rows looked up once per ledger object -------------------------------------------------------


class Spy:
    """A ledger wrapper counting look-ups of ``read_rows`` (forwarding everything)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.lookups = 0

    def __getattr__(self, name: str) -> Any:
        if name == "read_rows":
            self.lookups += 1
        return getattr(self._inner, name)


def _ledger(tmp_path: Path) -> tuple[SQLiteLedger, Any, str]:
    raw = SQLiteLedger(tmp_path / "l.db")
    rec, key = raw.create_key("agent", "t", "red", "a", 1)
    return raw, rec, key


def test_read_rows_is_looked_up_once_per_ledger_object(tmp_path: Path) -> None:
    raw, rec, _ = _ledger(tmp_path)
    spy = Spy(raw)
    authz = Authorizer(None, CachingLedger(InstrumentedLedger(spy, Metrics()), raw.cache_version))  # type: ignore[arg-type]

    async def go() -> None:
        for _ in range(5):
            ex = Exchange(method="GET", raw_path="/")
            ex.key_recheck = (rec.key_id, "k")
            await authz.settle(ex)
            assert ex.key_recheck is None
            ex2 = Exchange(method="GET", raw_path="/")
            await authz.prefetch(ex2, "chroma", "c", ["r1"], always=True)
            assert ex2.prefetched == {("chroma", "c"): {"r1": None}}
    asyncio.run(go())
    assert spy.lookups == 1
    other = Spy(raw)
    authz.ledger = other  # a new ledger object: looked up again
    asyncio.run(authz.settle(Exchange(method="GET", raw_path="/")))
    ex = Exchange(method="GET", raw_path="/")
    asyncio.run(authz.prefetch(ex, "chroma", "c", ["r1"]))  # SQLite: no read_rows, no prefetch
    assert ex.prefetched == {} and other.lookups == 1


class WithReadRows:
    """A ledger with ``read_rows`` (PostgreSQL's one statement), answering from a fixed table."""

    def __init__(self, valid: set[str]) -> None:
        self.valid = valid
        self.calls = 0

    def read_rows(self, backend: str, collection_id: str, row_ids: list[str], key_id: str | None) -> Any:
        self.calls += 1
        return {}, {}, key_id is None or key_id in self.valid


@pytest.mark.parametrize("valid", [True, False])
def test_the_hint_answers_as_the_look_up(tmp_path: Path, valid: bool) -> None:
    """`offloop.read_rows` with the authorizer's hint and without it: the same answer on both kinds of ledger,
    and a revoked key fails the read with 401 through `settle`."""
    raw, rec, _ = _ledger(tmp_path)
    if not valid:
        raw.revoke_key(rec.key_id)
    pg = WithReadRows({rec.key_id} if valid else set())
    for ledger in (CachingLedger(InstrumentedLedger(raw, Metrics()), raw.cache_version),
                   CachingLedger(InstrumentedLedger(pg, Metrics()), lambda: 1)):
        authz = Authorizer(None, ledger)  # type: ignore[arg-type]
        has = authz._has_read_rows()
        assert has == hasattr(ledger, "read_rows")
        for ids in ([], ["r1"]):
            got = asyncio.run(offloop.read_rows(ledger, "chroma", "c", ids, rec.key_id, has_read_rows=has))
            want = asyncio.run(offloop.read_rows(ledger, "chroma", "c", ids, rec.key_id))
            assert got == want and got[2] is valid
        ex = Exchange(method="GET", raw_path="/")
        ex.key_recheck = (rec.key_id, "k")
        ex.principal = Principal("agent", rec.key_id, "t", "red", "a", 1)
        if valid:
            asyncio.run(authz.settle(ex))
            assert ex.principal is not None
        else:
            with pytest.raises(Unauthorized):
                asyncio.run(authz.settle(ex))
            assert ex.principal is None
    assert pg.calls == 5


# -- the key caches' index: keyed BLAKE2b instead of HMAC-SHA256 -------------------------------------

import hashlib  # noqa: E402
import hmac  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class ReferenceCaching(CachingLedger):
    """`CachingLedger` indexed by HMAC-SHA256, as before."""

    def _digest(self, plaintext: str) -> bytes:
        return hmac.digest(self._secret, plaintext.encode("utf-8", "surrogatepass"), "sha256")


class Keys:
    """A ledger knowing some keys; revoking one is a commit (the token moves)."""

    def __init__(self, known: set[str]) -> None:
        self.known = set(known)
        self.version = 0
        self.asked: list[str] = []

    def authenticate(self, key: str) -> Any:
        self.asked.append(key)
        return Principal("agent", f"id-{key}", "t", "red", "a", 1) if key in self.known else None


keys = st.sampled_from(["", "mwk_a.s", "mwk_b.s", "\ud800x", "é🔑", "mwk_a.s "])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["auth", "revoke"]), keys), max_size=30))
def test_the_key_cache_answers_and_asks_as_with_hmac(ops: list[tuple[str, str]]) -> None:
    """The same answers, the same keys asked of the ledger (hits and misses), the same revocations seen at
    the next lookup, as the HMAC-indexed cache; and an index of a known key is never that of another."""
    runs = []
    for cls in (CachingLedger, ReferenceCaching):
        inner = Keys({"mwk_a.s", "mwk_b.s", "\ud800x", "é🔑"})
        cached = cls(inner, lambda inner=inner: inner.version, ttl_s=3600)
        out = []
        for op, key in ops:
            if op == "revoke":
                inner.known.discard(key)
                inner.version += 1
            else:
                p = cached.authenticate(key)
                out.append(p.key_id if p else None)
        runs.append((out, inner.asked, cached.hits, cached.misses, len(cached._keys)))
        digests = {cached._digest(k) for k in ("", "mwk_a.s", "mwk_b.s", "\ud800x", "é🔑", "mwk_a.s ")}
        assert len(digests) == 6
    assert runs[0] == runs[1]


def test_the_index_never_holds_the_key() -> None:
    inner = Keys({"mwk_secret.value"})
    cached = CachingLedger(inner, lambda: 1, ttl_s=3600)
    assert cached.authenticate("mwk_secret.value") is not None
    (index,) = cached._keys
    assert b"mwk_secret" not in index and index != hashlib.blake2b(b"mwk_secret.value", digest_size=32).digest()
