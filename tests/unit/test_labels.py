"""``mw_labels`` (Memory.labels) as requestable metadata: parsed and validated like scope and readers,
stamped into Chroma metadata, removed from it when emptied, and a change of them is a redistribute."""

from __future__ import annotations

import pytest

from sidecar.backends.chroma import FILTERABLE, check_client_where, stamp
from sidecar.core.writes import moves, with_governance
from sidecar.errors import BadRequest
from sidecar.governance import Principal, Row
from sidecar.provenance import REQUESTABLE, WRITE_ONCE, split_metadata

AGENT = Principal(kind="agent", key_id="k", tenant="t", fleet="red", agent="a", trust=1)


def _split(meta: dict[str, object]) -> dict[str, object]:
    return split_metadata(AGENT, meta, not_object="x")[1]


def test_labels_are_requestable_after_the_write() -> None:
    assert "mw_labels" in REQUESTABLE and "mw_labels" not in WRITE_ONCE


@pytest.mark.parametrize("value,labels", [
    ("pii", ("pii",)), ("pii, finance,pii", ("finance", "pii")), ("", ()), (" , ", ()),
    ("team:red,v1.2,a_b-c", ("a_b-c", "team:red", "v1.2")),
])
def test_labels_parse_sorted_and_deduplicated(value: str, labels: tuple[str, ...]) -> None:
    assert _split({"mw_labels": value})["mw_labels"] == labels


@pytest.mark.parametrize("value", ["p ii", "pii;x", "-x", "é", "x" * 65, ",".join(f"l{i}" for i in range(33)), 7, ["pii"]])
def test_bad_labels_are_400(value: object) -> None:
    with pytest.raises(BadRequest) as exc:
        _split({"mw_labels": value})
    assert "mw_labels" in exc.value.message


def _row(**kw: object) -> Row:
    row = Row("chroma", "c", "r", "t", "red", "t/red/a", "fleet", "t/red/a", 1)
    for k, v in kw.items():
        setattr(row, k, v)
    return row


def test_stamp_writes_labels_and_deletes_what_is_gone() -> None:
    assert stamp({"x": 1}, _row(labels=("finance", "pii")))["mw_labels"] == "finance,pii"
    assert "mw_labels" not in stamp(None, _row())
    before = _row(labels=("pii",), scope="restricted", readers=("t/red/b", "t/blue/c"))
    after = _row(labels=(), scope="restricted", readers=("t/blue/c",))
    out = stamp(None, after, before)
    # Chroma merges update metadata into what it stores: a null deletes the key.
    assert out["mw_labels"] is None and out["mw_r:t/red/b"] is None and out["mw_r:t/blue/c"] is True
    assert out["mw_readers"] == "t/blue/c"
    out = stamp(None, _row(scope="fleet"), before)
    assert out["mw_readers"] is None and out["mw_r:t/blue/c"] is None
    assert stamp(None, before, before) == stamp(None, before)  # nothing removed, no null


def test_labels_are_filterable() -> None:
    assert "mw_labels" in FILTERABLE
    check_client_where({"mw_labels": {"$eq": "pii"}})  # the stored value is what a reader is shown


def test_a_label_change_is_a_redistribute() -> None:
    row = _row(labels=("pii",))
    after = with_governance(row, {"mw_labels": ()})
    assert after.labels == () and after.scope == "fleet" and moves(row, after)
    assert not moves(row, with_governance(row, {"mw_labels": ("pii",)}))
    assert not moves(row, with_governance(row, {}))
