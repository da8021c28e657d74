"""`sidecar.core.deletes`: the backend-delete step of the delete transaction and the reconciler's retry, on both
ledgers, against an in-memory fake backend (a `sidecar.core.operations.Deleter`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, Sequence

import pytest

from sidecar.core import deletes
from sidecar.core.operations import Capabilities
from sidecar.errors import UpstreamError
from sidecar.governance import Row
from tests.pgutil import pg_url  # noqa: F401  (fixture)
from tests.unit.test_ledger import ledger, opener  # noqa: F401  (fixtures: both ledgers)


class FakeBackend:
    """Rows by collection, in memory. `batch`: one call deletes many ids; `fail_on`: the id whose delete fails (once
    per id, a 5xx); `holds_only`: the one collection it holds (None: every collection)."""

    def __init__(self, rows: dict[str, set[str]], *, batch: bool, fail_on: str | None = None,
                 holds_only: str | None = None) -> None:
        self.rows = rows
        self.capabilities = Capabilities(batch_delete=batch)
        self.fail_on = fail_on
        self.holds_only = holds_only
        self.calls: list[tuple[str, list[str]]] = []

    def holds(self, collection: str) -> bool:
        return self.holds_only is None or collection == self.holds_only

    async def delete(self, collection: str, ids: Sequence[str]) -> None:
        assert self.capabilities.batch_delete or len(ids) == 1
        self.calls.append((collection, list(ids)))
        if self.fail_on in ids:
            self.fail_on = None
            raise UpstreamError("backend down")
        self.rows.get(collection, set()).difference_update(ids)  # a missing id counts as deleted

    async def present(self, collection: str, ids: Sequence[str]) -> list[str]:
        self.calls.append((collection, ["present", *ids]))
        return [i for i in ids if i in self.rows.get(collection, set())]


def _tombstoned(ledger: Any, keys: list[tuple[str, str]]) -> None:
    rows = [Row("fake", c, i, "t", "red", "t/red/a", "fleet", "t/red/a", 1) for c, i in keys]
    assert ledger.reserve_rows(rows) == []
    for c in dict.fromkeys(c for c, _ in keys):
        ids = [i for cc, i in keys if cc == c]
        ledger.activate_rows("fake", c, ids)
        ledger.tombstone("fake", c, ids, "t/red/a", "req")


def test_a_failed_delete_confirms_what_was_done_and_the_retry_finishes(ledger: Any) -> None:  # noqa: F811
    keys = [("c1", "a"), ("c1", "b"), ("c1", "c")]
    _tombstoned(ledger, keys)
    fake = FakeBackend({"c1": {"a", "b", "c"}}, batch=False, fail_on="b")
    gov = SimpleNamespace(name="fake", ledger=ledger)
    with pytest.raises(UpstreamError):
        asyncio.run(deletes.backend_delete(gov, fake, keys))  # type: ignore[arg-type]
    assert sorted(ledger.pending_tombstones("fake")) == [("c1", "b"), ("c1", "c")] and fake.rows["c1"] == {"b", "c"}
    assert asyncio.run(deletes.retry_pending(gov, fake)) == 2  # type: ignore[arg-type]
    assert ledger.pending_tombstones("fake") == [] and fake.rows["c1"] == set()


def test_one_call_per_collection_and_only_the_collections_the_client_holds(ledger: Any) -> None:  # noqa: F811
    keys = [("c1", "a"), ("c2", "x"), ("c1", "b")]
    _tombstoned(ledger, keys)
    fake = FakeBackend({"c1": {"a", "b"}, "c2": {"x"}}, batch=True, holds_only="c1")
    gov = SimpleNamespace(name="fake", ledger=ledger)
    assert asyncio.run(deletes.backend_delete(gov, fake, keys)) == 2  # type: ignore[arg-type]
    assert fake.calls == [("c1", ["a", "b"])]
    assert ledger.pending_tombstones("fake") == [("c2", "x")] and fake.rows == {"c1": set(), "c2": {"x"}}


def test_recheck_deletes_what_reappeared_within_its_budget_and_goes_on_where_it_stopped(ledger: Any) -> None:  # noqa: F811
    keys = [("c1", "a"), ("c1", "b"), ("c1", "c")]
    _tombstoned(ledger, keys)
    ledger.mark_backend_deleted("fake", "c1", ["a", "b", "c"])
    fake = FakeBackend({"c1": {"b"}}, batch=True)  # b was written again around the sidecar
    gov = SimpleNamespace(name="fake", ledger=ledger)
    cursor = deletes.Cursor()
    assert asyncio.run(deletes.recheck(gov, fake, cursor, budget=2)) == 1  # type: ignore[arg-type]
    assert fake.calls == [("c1", ["present", "a", "b"]), ("c1", ["b"])] and fake.rows["c1"] == set()
    assert cursor.after == ("c1", "b") and ledger.pending_tombstones("fake") == []
    fake.calls.clear()
    assert asyncio.run(deletes.recheck(gov, fake, cursor, budget=2)) == 0  # type: ignore[arg-type]
    assert fake.calls == [("c1", ["present", "c"])] and cursor.after == ("", "")  # all checked: from the first again
