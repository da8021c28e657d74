"""The read path's per-row fast paths against the code they replaced, kept here as the reference:
`class_values` (the governance class key memoised on a row's fields) against the old `class_key`, and
`Authorizer.readable_rows` / `decide_rows` (one pass over the ids, class keys computed once per row,
`_record_rows`) against the old ones — same rows allowed, same exchange fields (counts, reasons and their
order, policies, errors, shadow would-denies), same log lines — on generated ledger rows of every status,
unknown and repeated ids, history views, shadow mode, class-decided and per-row policy sets."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from invariants.classes import analyse
from sidecar.exchange import Exchange
from sidecar.governance import Principal, Row
from sidecar.ledger import SQLiteLedger
from sidecar.ledger.sql import ROW_COLUMNS as _ROW_COLUMNS, N_ROW_COLUMNS as _N_ROW_COLUMNS, row_to_db as _row_to_db
from sidecar.policy import CedarRequest, Decision, PolicyEngine, canonical_json
from sidecar.stages import authorize
from tests.unit.authorize_reference import Authorizer_fe121ba, refused_ids
from sidecar.stages.authorize import (CLASS_MEMO_SIZE, DELETED_ROW, SUPERSEDED_ROW, UNKNOWN_ROW, Authorizer, class_values,
                                      note_action, servable, tally)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = (ROOT / "policies" / "memwarden.cedarschema").read_text()
DEFAULT = (ROOT / "policies" / "default.cedar").read_text()
OWNER_CHAIN = DEFAULT + """
@id("owner-chain")
permit(principal is Agent, action == Action::"read", resource)
  when { resource.owner.fleet.tenant == principal.tenant && resource.owner.trust >= 2 && resource.scope == "fleet" };
"""
LABELS_AND_TRIPLES = DEFAULT + """
@id("labelled")
forbid(principal is Agent, action == Action::"read", resource) when { resource.labels.contains("secret") && principal.trust < 3 };
@id("triple")
permit(principal is Agent, action == Action::"read", resource)
  when { resource has subject && resource.subject == "s" && resource.tenant == principal.tenant };
"""
AGENTS = [("t", f, a, trust) for f in ("red", "blue") for a, trust in (("a0", 0), ("a1", 1), ("a2", 2), ("a3", 3))] \
    + [("u", "red", "x1", 1)]
OWNERS = [f"{t}/{f}/{a}" for t, f, a, _ in AGENTS] + ["t/red/ghost"]  # ghost: unknown to the ledger
PRINCIPALS = [Principal("agent", f"k{i}", t, f, a, trust) for i, (t, f, a, trust) in enumerate(AGENTS)] \
    + [Principal("admin", "kadmin", "t"), Principal("agent", "kroles", "t", "red", "r", 1, ("auditor",))]


# -- the reference: the code these fast paths replaced ---------------------------------------------------
def reference_class_key(row: Row, attrs: frozenset[str], owner_keys: dict[str, str]) -> tuple[Any, ...]:
    entity = row.entity()["attrs"]
    values: list[Any] = [row.tenant, row.fleet]
    for name in sorted(attrs):
        value = entity.get(name, authorize._ABSENT)
        values.append(value if isinstance(value, (str, int, bool)) else canonical_json(value))
    if "owner" in attrs:
        values.append(owner_keys.get(row.owner))
    return tuple(values)


class ReferenceAuthorizer(Authorizer):
    """`decide_rows` and `readable_rows` as they were before the one-pass version."""

    def decide_rows(self, ex: Exchange, action: str, rows: list[Row], contexts: list[dict[str, Any]] | None = None) -> list[Decision]:
        assert ex.principal is not None
        if not rows:
            return []
        if ex.policy_set is None:
            ex.policy_set = self.policy.current
        note_action(ex, action)  # issue 34's bookkeeping (the actions decided)
        engine = ex.policy_set.engine
        attrs = getattr(engine, "row_classes", None)
        if contexts is not None or attrs is None:
            return self.decide(ex, *self.row_batch(ex.principal, action, rows, contexts, self.owners(ex, rows)))
        p = ex.principal
        owners = self.owners(ex, rows)
        owner_keys = {uid: canonical_json(e) for uid, e in owners.items()} if "owner" in attrs else {}
        head = (p.kind, p.uid, p.trust, p.roles, action)
        keys = [(head, reference_class_key(row, attrs, owner_keys)) for row in rows]
        memo: dict[Any, Decision] = engine.class_memo
        known = {k: memo[k] for k in dict.fromkeys(keys) if k in memo}
        wanted: dict[Any, Row] = {}
        for k, row in zip(keys, rows):
            if k not in known and k not in wanted:
                wanted[k] = row
        if wanted:
            reps = list(wanted.values())
            requests, entities = self.row_batch(p, action, reps, None, owners, extra_rows=rows)
            for k, d in zip(wanted, self.policy.decide(requests, entities, ex.policy_set)):
                known[k] = d
                if not d.errors and not d.would_deny:
                    if len(memo) >= CLASS_MEMO_SIZE:
                        memo.clear()
                    memo[k] = d
        decisions = [known[k] for k in keys]
        return self._record(ex, [CedarRequest(p.uid, action, r.uid) for r in rows], decisions)

    def readable_rows(self, ex: Exchange, backend: str, collection_id: str, row_ids: list[str],
                      include_superseded: bool = False, as_of: int | None = None, count: bool = True) -> dict[str, Row]:
        if not row_ids:
            return {}
        pre = ex.prefetched.get((backend, collection_id))
        if pre is not None and all(i in pre for i in row_ids):
            known = {i: pre[i] for i in row_ids if pre[i] is not None}
        else:
            known = self.ledger.get_rows(backend, collection_id, row_ids)
        if count:
            ex.ledger_rows.update(((backend, collection_id, i), r) for i, r in known.items())
        unique = list(dict.fromkeys(row_ids))
        candidates = [known[i] for i in unique if i in known and servable(known[i], include_superseded, as_of)]
        decisions = self.decide_rows(ex, "read", candidates)
        allowed = {row.row_id: row for row, d in zip(candidates, decisions) if d.allowed}
        withheld = [i for i in unique if i not in known or not servable(known[i], include_superseded, as_of)]
        for i in withheld:
            ex.reason = UNKNOWN_ROW if i not in known else (
                SUPERSEDED_ROW if known[i].status == "superseded" else DELETED_ROW)
            if count:
                tally(ex.row_deny_reasons, ex.reason)
        if count:
            ex.rows_allowed += len(allowed)
            refused_ids(ex, candidates, decisions, withheld)  # issue 34's bookkeeping (the refused ids)
            for row, d in zip(candidates, decisions):
                if not d.allowed:
                    ex.rows_denied += 1
                    tally(ex.row_deny_reasons, d.reason)
            ex.rows_unknown += sum(1 for i in withheld if i not in known)
            ex.rows_hidden_superseded += sum(1 for i in withheld if i in known and known[i].status == "superseded")
            ex.rows_hidden_deleted += sum(1 for i in withheld if i in known and known[i].status != "superseded")
        return allowed


@dataclass
class Handle:
    """The part of `PolicyHandle` the Authorizer uses, around one engine; `shadow` turns denials into
    Allows marked would-deny as `PolicyHandle.decide` does."""

    engine: PolicyEngine
    shadow: bool = False
    calls: list[int] = field(default_factory=list)
    sent: list[tuple[Any, ...]] = field(default_factory=list)  # every Cedar call: its requests and entity store

    @property
    def current(self) -> Any:
        return self

    @property
    def sha256(self) -> str:
        return "test"

    def decide(self, requests: list[CedarRequest], entities: list[dict[str, Any]], ps: Any = None) -> list[Decision]:
        self.calls.append(len(requests))
        self.sent.append((tuple(requests), canonical_json(entities)))
        out = self.engine.decide(requests, entities)
        if self.shadow:
            out = [d if d.allowed else dataclasses.replace(d, allowed=True, policies=(*d.policies, "shadow-mode:would-deny"),
                                                           would_deny=True) for d in out]
        return out


def engine_for(text: str, by_class: bool) -> PolicyEngine:
    engine = PolicyEngine(text, SCHEMA, [Path("p.cedar")], Path("s.cedarschema"))
    if by_class:
        analysis = analyse(text, SCHEMA)
        assert analysis.sound
        engine.row_classes = analysis.attributes
    return engine


SOURCES = {"default": DEFAULT, "owner-chain": OWNER_CHAIN, "labels-triples": LABELS_AND_TRIPLES}
# One engine per (source, by class, shadow, side): class memos persist across examples, as in a server.
ENGINES = {(s, c, sh, side): engine_for(text, c) for s, text in SOURCES.items() for c in (True, False)
           for sh in (False, True) for side in ("new", "old")}

LEDGER = SQLiteLedger(":memory:")
for _t, _f, _a, _trust in AGENTS:
    LEDGER.create_key("agent", _t, _f, _a, _trust)
_collections = itertools.count()

# -- generated rows ---------------------------------------------------------------------------------------
names = st.sampled_from(["t", "u"])
owners = st.sampled_from(OWNERS)
ledger_rows = st.builds(
    lambda rid, owner, fleet, scope, status, readers, labels, triple, cedar, created, sup_at: Row(
        "chroma", "c", rid, owner.split("/")[0], fleet or owner.split("/")[1], owner, scope, owner, created,
        status=status, readers=tuple(readers), labels=tuple(labels),
        subject=triple[0] if triple else None, predicate=triple[1] if triple else None, object=triple[2] if triple else None,
        extra={"cedar": cedar} if cedar else {}, superseded_at=sup_at if status == "superseded" else None),
    st.sampled_from([f"r{i}" for i in range(12)]), owners, st.none() | st.sampled_from(["red", "blue", "green"]),
    st.sampled_from(["agent", "fleet", "tenant", "restricted"]),
    st.sampled_from(["active", "active", "superseded", "deleted", "pending"]),
    st.lists(st.sampled_from(OWNERS[:9]), max_size=3, unique=True).map(sorted),
    st.lists(st.sampled_from(["x", "secret"]), max_size=2, unique=True),
    st.none() | st.tuples(st.sampled_from(["s", "z"]), st.sampled_from(["p", "q"]), st.sampled_from(["1", "2"])),
    st.none() | st.fixed_dictionaries({"subject": st.sampled_from(["s", "z"])}),
    st.integers(0, 20), st.integers(0, 20))


def same(decisions: list[Decision]) -> list[tuple[Any, ...]]:
    """Decisions as compared: Cedar reports the determining policies of one answer in no set order."""
    return [(d.allowed, sorted(d.policies), sorted(d.errors), d.reason, sorted(d.error_policies), d.would_deny)
            for d in decisions]


def decision_fields(ex: Exchange) -> dict[str, Any]:
    """Everything of an exchange the decision log and the response read, dict orders included."""
    out = {f.name: getattr(ex, f.name) for f in dataclasses.fields(Exchange)
           if f.name not in ("request_id", "started_ns", "policy_set")}
    for name in ("row_deny_reasons", "would_deny_reasons", "ledger_rows"):
        out[name] = list(out[name].items())
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(ledger_rows, max_size=10, unique_by=lambda r: r.row_id),
       asked=st.lists(st.sampled_from([f"r{i}" for i in range(14)]), min_size=1, max_size=16),
       principal=st.sampled_from(PRINCIPALS), source=st.sampled_from(sorted(SOURCES)), by_class=st.booleans(),
       shadow=st.booleans(), include_superseded=st.booleans(), as_of=st.none() | st.integers(0, 20),
       count=st.booleans(), twice=st.booleans())
def test_readable_rows_agree_with_the_reference(rows: list[Row], asked: list[str], principal: Principal, source: str,
                                                by_class: bool, shadow: bool, include_superseded: bool,
                                                as_of: int | None, count: bool, twice: bool) -> None:
    collection = f"c{next(_collections)}"
    with LEDGER._tx() as db:
        for r in rows:
            db.execute(f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * _N_ROW_COLUMNS)})",
                       _row_to_db(dataclasses.replace(r, collection=collection), 1))
    results = {}
    for side, cls in (("new", Authorizer), ("old", ReferenceAuthorizer)):
        handle = Handle(ENGINES[(source, by_class, shadow, side)], shadow)
        authz = cls(handle, LEDGER)  # type: ignore[arg-type]
        out = []
        with capture_logs() as logs:
            for _ in range(2 if twice else 1):  # the second time from the class memo
                ex = Exchange("POST", "/", principal=principal, request_id="r")
                got = authz.readable_rows(ex, "chroma", collection, asked, include_superseded, as_of, count)
                out.append((list(got), [dataclasses.astuple(r) for r in got.values()], decision_fields(ex)))
        results[side] = (out, logs)
    assert results["new"] == results["old"]


# -- class_values --------------------------------------------------------------------------------------
odd_names = st.lists(st.sampled_from(["t/red/a1", "x", 1, True, 1.0, 0, False]), max_size=3).map(tuple)
odd_rows = st.builds(
    lambda tenant, fleet, owner, scope, status, readers, labels, subject, extra: Row(
        "chroma", "c", "r", tenant, fleet, owner, scope, owner, 1, status=status, readers=readers, labels=labels,
        subject=subject, extra=extra),
    st.sampled_from(["t", "u"]), st.sampled_from(["red", "blue"]), st.sampled_from(["t/red/a1", "t/blue/a2"]),
    st.sampled_from(["agent", "tenant", 1, True]), st.sampled_from(["active", "superseded"]),
    odd_names | st.lists(st.sampled_from(["t/red/a1", "x"]), max_size=2), odd_names,
    st.none() | st.sampled_from(["s", 1, True]),
    st.sampled_from([{}, {"cedar": {}}, {"cedar": None}, {"cedar": {"subject": "s"}}, {"cedar": {"user_id": "u1"}},
                     {"other": 1}]))
attribute_sets = st.sets(st.sampled_from(["tenant", "fleet", "owner", "scope", "status", "readers", "labels", "subject",
                                          "predicate", "object", "user_id"])).map(frozenset)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(odd_rows, attribute_sets), min_size=1, max_size=12))
def test_class_values_agree_with_the_reference(cases: list[tuple[Row, frozenset[str]]]) -> None:
    """In sequence (what one row leaves in the memo must not answer for another), including fields of other
    types than a ledger row's (ints, booleans, floats equal to them, lists) and Cedar attributes in `extra`."""
    authorize._CLASS_VALUES.clear()
    owner_keys = {"t/red/a1": "{a1}"}
    for row, attrs in cases:
        got = class_values(row, attrs)
        key = got + (owner_keys.get(row.owner),) if "owner" in attrs else got
        want = reference_class_key(row, attrs, owner_keys)
        assert key == want and [type(v) for v in key] == [type(v) for v in want], (row, attrs)


def test_one_entry_per_class_and_none_for_odd_rows() -> None:
    authorize._CLASS_VALUES.clear()
    attrs = frozenset({"scope", "owner"})
    rows = [Row("chroma", "c", f"r{i}", "t", "red", "t/red/a1", "tenant", "t/red/a1", 1) for i in range(20)]
    assert len({class_values(r, attrs) for r in rows}) == 1 and len(authorize._CLASS_VALUES) == 1
    class_values(dataclasses.replace(rows[0], readers=(1,)), attrs)
    class_values(dataclasses.replace(rows[0], extra={"cedar": {"user_id": "u"}}), attrs)
    with pytest.raises(TypeError):
        hash(dataclasses.replace(rows[0], readers=["x"]).readers)  # type: ignore[arg-type]
    class_values(dataclasses.replace(rows[0], readers=["x"]), attrs)  # type: ignore[arg-type]
    assert len(authorize._CLASS_VALUES) == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(ledger_rows, max_size=10), principal=st.sampled_from(PRINCIPALS),
       source=st.sampled_from(sorted(SOURCES)), shadow=st.booleans(),
       action=st.sampled_from(["read", "delete", "update", "supersede", "reassert"]))
def test_decide_rows_agrees_with_the_reference(rows: list[Row], principal: Principal, source: str, shadow: bool,
                                               action: str) -> None:
    """Decisions and what they record (the latest denial's reason, policies, errors, would-denies, log lines)."""
    results = {}
    for side, cls in (("new", Authorizer), ("old", ReferenceAuthorizer)):
        authz = cls(Handle(ENGINES[(source, True, shadow, side)], shadow), LEDGER)  # type: ignore[arg-type]
        ex = Exchange("POST", "/", principal=principal, request_id="r")
        with capture_logs() as logs:
            got = authz.decide_rows(ex, action, rows)
        results[side] = (same(got), decision_fields(ex), logs)
    assert results["new"] == results["old"]


# -- decide_rows against fe121ba (rows grouped by their class values' identity) ------------------------------
def sharing(decisions: list[Decision]) -> list[int]:
    """Which rows share one Decision object (`_record_rows` deduplicates by identity): per row, the index of
    the first row with the same object."""
    first: dict[int, int] = {}
    return [first.setdefault(id(d), i) for i, d in enumerate(decisions)]


ENGINES_FE121BA = {(s, sh, side): engine_for(text, True) for s, text in SOURCES.items() for sh in (False, True)
                   for side in ("new", "old")}
any_rows = ledger_rows | odd_rows


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(any_rows, max_size=12), repeat=st.lists(st.integers(0, 11), max_size=4),
       principal=st.sampled_from(PRINCIPALS), source=st.sampled_from(sorted(SOURCES)), shadow=st.booleans(),
       action=st.sampled_from(["read", "delete", "update"]), twice=st.booleans())
def test_decide_rows_agrees_with_fe121ba(rows: list[Row], repeat: list[int], principal: Principal, source: str,
                                         shadow: bool, action: str, twice: bool) -> None:
    """Against the per-row class keys of fe121ba: the same decisions (and the same rows sharing one Decision
    object), the same Cedar calls (requests, entity store, batch sizes: the metrics' inputs), the same exchange
    fields and log lines, on plain ledger rows, rows with Cedar attributes in `extra`, rows whose fields are of
    other types that compare equal (1, True, 1.0: equal tuples, different class keys), the same Row object
    more than once, owners the ledger does not know; the second time from the class memo."""
    rows = rows + [rows[i] for i in repeat if i < len(rows)]
    results = {}
    for side, cls in (("new", Authorizer), ("old", Authorizer_fe121ba)):
        handle = Handle(ENGINES_FE121BA[(source, shadow, side)], shadow)
        authz = cls(handle, LEDGER)  # type: ignore[arg-type]
        out = []
        with capture_logs() as logs:
            for _ in range(2 if twice else 1):
                ex = Exchange("POST", "/", principal=principal, request_id="r")
                got = authz.decide_rows(ex, action, rows)
                out.append((same(got), sharing(got), decision_fields(ex)))
        results[side] = (out, handle.calls, handle.sent, logs)
    assert results["new"] == results["old"]


def test_equal_fields_of_other_types_are_other_classes() -> None:
    """Rows whose fields compare equal but are of other types (readers ``(1,)`` and ``(True,)``) get class values
    computed afresh (`class_values`), so each is a group of its own and is keyed, as before, by its own values."""
    authz = Authorizer(Handle(engine_for(DEFAULT, True)), LEDGER)  # type: ignore[arg-type]
    ref = Authorizer_fe121ba(Handle(engine_for(DEFAULT, True)), LEDGER)  # type: ignore[arg-type]
    base = Row("chroma", "c", "r", "t", "red", "t/red/a1", "restricted", "t/red/a1", 1)
    rows = [dataclasses.replace(base, row_id=f"r{i}", readers=readers)
            for i, readers in enumerate([(1,), (True,), (1.0,), (1,), ("t/red/a2",), ("t/red/a2",)])]  # type: ignore[arg-type]
    for who in PRINCIPALS[:3]:
        got = authz.decide_rows(Exchange("POST", "/", principal=who), "read", rows)
        want = ref.decide_rows(Exchange("POST", "/", principal=who), "read", rows)
        assert same(got) == same(want) and sharing(got) == sharing(want)
    assert authz.policy.calls == ref.policy.calls  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(ledger_rows, max_size=10, unique_by=lambda r: r.row_id),
       asked=st.lists(st.sampled_from([f"r{i}" for i in range(14)]), min_size=1, max_size=16),
       principal=st.sampled_from(PRINCIPALS), source=st.sampled_from(sorted(SOURCES)), shadow=st.booleans(),
       include_superseded=st.booleans(), as_of=st.none() | st.integers(0, 20), count=st.booleans(),
       prefetched=st.booleans())
def test_readable_rows_agree_with_de70fd8(rows: list[Row], asked: list[str], principal: Principal, source: str,
                                          shadow: bool, include_superseded: bool, as_of: int | None, count: bool,
                                          prefetched: bool) -> None:
    """`readable_rows` (an active row servable without the `servable` call when no ``as_of``, the request's ledger
    rows kept by a loop) against de70fd8: the same rows, exchange fields (``ledger_rows`` in the same order),
    Cedar calls and log lines, from the ledger or from rows prefetched for the read."""
    collection = f"c{next(_collections)}"
    with LEDGER._tx() as db:
        for r in rows:
            db.execute(f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * _N_ROW_COLUMNS)})",
                       _row_to_db(dataclasses.replace(r, collection=collection), 1))
    results = {}
    for side, cls in (("new", Authorizer), ("old", Authorizer_fe121ba)):
        handle = Handle(ENGINES_FE121BA[(source, shadow, side)], shadow)
        authz = cls(handle, LEDGER)  # type: ignore[arg-type]
        with capture_logs() as logs:
            ex = Exchange("POST", "/", principal=principal, request_id="r")
            if prefetched:
                known = LEDGER.get_rows("chroma", collection, asked)
                ex.prefetched[("chroma", collection)] = {i: known.get(i) for i in asked}
            got = authz.readable_rows(ex, "chroma", collection, asked, include_superseded, as_of, count)
            out = (list(got), [dataclasses.astuple(r) for r in got.values()], decision_fields(ex))
        results[side] = (out, handle.calls, handle.sent, logs)
    assert results["new"] == results["old"]
