"""Variant (c): labels derived from the checkpoints' HIDDEN annotations — an upper bound, not a method.

GateMem forbids methods to read ``judge_spec`` and ``leak_targets``; this module reads them on purpose, to
isolate enforcement from labelling: if memwarden were told, at each checkpoint, exactly which memories the
annotations protect, need or declare deleted, what would retrieval through it return?

The label timeline starts with every turn readable by every principal of the episode and changes only at
checkpoints, just before each is asked (in file order; changes persist, later checkpoints override earlier):

- ``utility``: the asker is added to the readers of every row containing an ``include`` pattern;
- ``privacy``: the asker is removed from the readers of every row containing a ``not_include`` or
  ``leak_targets`` pattern;
- ``safety``: every row containing a ``leak_targets`` pattern is deleted and written again without the
  matching text (as variant b does with its own deletion targets).

The changes are made through the sidecar like any other (re-scoping by ``mw_readers``, deletes), so what is
measured is memwarden enforcing them. Rows are whole turns: a turn that both carries needed evidence and a
protected or deleted value cannot be split, which is the limit this bound still has.
"""

from __future__ import annotations

from dataclasses import dataclass

from memwarden_eval.gatemem.data import Annotation, Probe
from memwarden_eval.gatemem.measures import pattern_in, remove_pattern

REDACTED = "[deleted]"


@dataclass(frozen=True, slots=True)
class OracleChange:
    """Readers to add/remove for `principal`, rows to delete, before one checkpoint is asked."""

    principal: str
    grant: tuple[str, ...]
    revoke: tuple[str, ...]
    delete: tuple[str, ...]


def changes_for(probe: Probe, annotation: Annotation, texts: dict[str, str], readers: dict[str, set[str]]) -> OracleChange:
    """The label changes `annotation` implies for the rows written so far (`texts`: row id → text of the live
    rows; `readers`: row id → current readers). Does not modify its arguments."""
    asker = probe.asker.principal_id
    if annotation.query_type == "utility":
        rows = [r for r, t in texts.items() if any(pattern_in(p, t) for p in annotation.include)]
        return OracleChange(asker, tuple(r for r in rows if asker not in readers[r]), (), ())
    if annotation.query_type == "privacy":
        pats = annotation.not_include + annotation.leak_targets
        rows = [r for r, t in texts.items() if any(pattern_in(p, t) for p in pats)]
        return OracleChange(asker, (), tuple(r for r in rows if asker in readers[r]), ())
    rows = [r for r, t in texts.items() if any(pattern_in(p, t) for p in annotation.leak_targets)]
    return OracleChange(asker, (), (), tuple(rows))


def without(text: str, patterns: tuple[str, ...]) -> str:
    """`text` with every match of `patterns` replaced by ``[deleted]``."""
    for p in patterns:
        text = remove_pattern(p, text, REDACTED)
    return text
