"""Earlier code of `sidecar.stages.authorize`, kept as test references, with the decision log's bookkeeping of
issue 34 added (`note_action`, ``deny_action``, `refused_ids`: the Cedar actions decided, the action denied and the
refused row ids), which the faster code keeps too."""

from __future__ import annotations

from typing import Any

from sidecar.exchange import Exchange
from sidecar.governance import Principal, Row
from sidecar.policy import CedarRequest, Decision, canonical_json
from sidecar.stages.authorize import (CLASS_MEMO_SIZE, DELETED_ROW, SUPERSEDED_ROW, UNKNOWN_ROW, Authorizer, class_values,
                                      note_action, servable)


def refused_ids(ex: Exchange, candidates: list[Row], decisions: list[Decision], withheld_ids: list[str]) -> None:
    """Issue 34: ``denied_row_ids`` gets the ids Cedar denied, then the withheld ones, up to 100 in all."""
    for row, d in zip(candidates, decisions):
        if not d.allowed and len(ex.denied_row_ids) < 100:
            ex.denied_row_ids.append(row.row_id)
    ex.denied_row_ids.extend(withheld_ids[:max(0, 100 - len(ex.denied_row_ids))])


class Authorizer_fe121ba(Authorizer):
    """`decide_rows` and `_record_rows` as of fe121ba (a class key built and hashed per row), `readable_rows` as of
    de70fd8 (`servable` called for every row)."""

    def decide_rows(self, ex: Exchange, action: str, rows: list[Row], contexts: list[dict[str, Any]] | None = None) -> list[Decision]:
        assert ex.principal is not None
        if not rows:
            return []
        if ex.policy_set is None:
            ex.policy_set = self.policy.current
        note_action(ex, action)
        engine = ex.policy_set.engine
        attrs = getattr(engine, "row_classes", None)
        if contexts is not None or attrs is None:
            return self.decide(ex, *self.row_batch(ex.principal, action, rows, contexts, self.owners(ex, rows)))
        p = ex.principal
        owners = self.owners(ex, rows)
        by_owner = "owner" in attrs
        owner_keys = {uid: canonical_json(e) for uid, e in owners.items()} if by_owner else {}
        head = (p.kind, p.uid, p.trust, p.roles, action)
        memo: dict[Any, Decision] = engine.class_memo
        keys: list[Any] = []
        known: dict[Any, Decision] = {}
        wanted: dict[Any, Row] = {}
        for row in rows:
            values = class_values(row, attrs)
            k = (head, values + (owner_keys.get(row.owner),) if by_owner else values)
            keys.append(k)
            if k in known or k in wanted:
                continue
            d = memo.get(k)
            if d is None:
                wanted[k] = row
            else:
                known[k] = d
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
        return self._record_rows(ex, p, action, rows, decisions)

    def _record_rows(self, ex: Exchange, p: Principal, action: str, rows: list[Row], decisions: list[Decision],
                     *_: Any) -> list[Decision]:
        if any(d.errors or d.would_deny for d in decisions):
            return self._record(ex, [CedarRequest(p.uid, action, r.uid) for r in rows], decisions)
        latest_denial: Decision | None = None
        distinct: dict[int, Decision] = {}
        for d in decisions:
            distinct[id(d)] = d  # rows of one class share their Decision object
            if not d.allowed:
                latest_denial = d
        for d in distinct.values():
            ex.policies.update(d.policies)
            if not d.allowed:
                ex.deny_policies.update(d.policies or d.error_policies)
        if latest_denial is not None:
            ex.reason = latest_denial.reason
            ex.deny_action = action
        return decisions

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
        # One pass over the ids: the servable rows go to Cedar; every other id is withheld with its reason.
        candidates: list[Row] = []
        withheld: list[str] = []
        withheld_ids: list[str] = []
        for i in dict.fromkeys(row_ids):
            row = known.get(i)
            if row is None:
                withheld.append(UNKNOWN_ROW)
                withheld_ids.append(i)
            elif servable(row, include_superseded, as_of):
                candidates.append(row)
            else:
                withheld.append(SUPERSEDED_ROW if row.status == "superseded" else DELETED_ROW)
                withheld_ids.append(i)
        decisions = self.decide_rows(ex, "read", candidates)
        allowed = {row.row_id: row for row, d in zip(candidates, decisions) if d.allowed}
        if withheld:
            ex.reason = withheld[-1]
        if count:
            reasons = ex.row_deny_reasons
            for reason in withheld:
                reasons[reason] = reasons.get(reason, 0) + 1
            ex.rows_allowed += len(allowed)
            refused_ids(ex, candidates, decisions, withheld_ids)
            if len(allowed) < len(candidates):
                for d in decisions:
                    if not d.allowed:
                        ex.rows_denied += 1
                        reasons[d.reason] = reasons.get(d.reason, 0) + 1
            if withheld:
                unknown, superseded = withheld.count(UNKNOWN_ROW), withheld.count(SUPERSEDED_ROW)
                ex.rows_unknown += unknown
                ex.rows_hidden_superseded += superseded
                ex.rows_hidden_deleted += len(withheld) - unknown - superseded
        return allowed
