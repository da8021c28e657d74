"""`adopt`: bring the rows of an existing backend collection under governance, by declared rules.

For each page the target yields (Chroma: ``page`` rows of a paged get; Mem0: one entity's memories):

1. the ledger is asked for every id of the page;
   - a row it governs (active or superseded) is left exactly as it is — never widened, re-scoped or revived
     — and re-stamped into the backend only if the backend's ``mw_*`` keys differ from the ledger's, and not
     when they name another governance in the ledger row's own ``mw_source`` (`may_restamp`: content an update
     wrote before its ledger write, which reads withhold; reported as ``changing``, left as it is);
   - a tombstoned row is never adopted again (the reconciler deletes it from the backend); a pending one is a
     write in flight through the sidecar and is left alone;
2. every other row gets its governance from the rules (`Rules.assign`); a row they do not cover, or whose
   text is deleted content of the tenant (the forgotten-content rule), is not adopted and stays denied, and
   is listed in the report;
3. unless ``dry_run``: the new rows are written to the ledger in one transaction (`Ledger.adopt_rows`, which
   leaves alone any id a concurrent write registered meanwhile), then their governed metadata is stamped into
   the backend where the profile stamps it on writes.

The ledger is written before the backend: a crash between the two leaves rows governed but not yet stamped
(the sidecar serves them by id as the ledger says, unless the backend holds a stamp of other governance from
before: `sidecar.governance.stamped_as`; its filtered reads miss them until stamped), and the next
run stamps them. A re-run after a crash therefore ends in the state of an uninterrupted run; a run over a
fully adopted collection changes nothing. Each adopted row records ``source`` ``<backend>:adopt:<rules
sha256, 12 hex>``, writer ``adopt``, the rules' owner, fleet, scope, readers and labels, the content HMAC of its text,
and its creation time (the backend's, when it keeps one; else the time of adoption).
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from sidecar.adopt.rules import Assignment, Rules, Uncovered, _Layer
from sidecar.adopt.targets import Found
from sidecar.governance import Row, stamped_as
from sidecar.ledger import Ledger, now_us
from sidecar.provenance import content_digest, legacy_content_digests

WRITER = "adopt"
DELETED_CONTENT = "its text is deleted content of this tenant"


class Target(Protocol):
    backend: str
    collection: str

    def pages(self) -> Any: ...
    def is_stamped(self, found: Found, row: Row) -> bool: ...
    def stamp(self, items: list[tuple[Found, Row]]) -> None: ...
    def listing(self, found: Found) -> list[tuple[str, str]]: ...
    def cedar_attrs(self, found: Found) -> dict[str, str]: ...


@dataclass
class Report:
    """What one adoption did (or, in a dry run, would do). Counts are rows."""

    backend: str
    collection: str
    label: str
    dry_run: bool
    scanned: int = 0
    adopted: int = 0
    already: int = 0
    restamped: int = 0
    changing: list[str] = field(default_factory=list)
    tombstoned: int = 0
    pending: int = 0
    by_scope: Counter[str] = field(default_factory=Counter)
    by_owner: Counter[str] = field(default_factory=Counter)
    by_rule: Counter[str] = field(default_factory=Counter)
    by_label: Counter[str] = field(default_factory=Counter)
    uncovered: list[tuple[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "collection": self.collection, "label": self.label, "dry_run": self.dry_run,
            "scanned": self.scanned, "adopted": self.adopted, "already_governed": self.already,
            "restamped": self.restamped, "changing": self.changing, "tombstoned": self.tombstoned, "pending": self.pending,
            "by_scope": dict(sorted(self.by_scope.items())), "by_owner": dict(sorted(self.by_owner.items())),
            "by_rule": dict(sorted(self.by_rule.items())), "by_label": dict(sorted(self.by_label.items())),
            "uncovered": [{"id": i, "reason": r} for i, r in self.uncovered], "truncated": self.truncated,
        }


def may_restamp(found: Found, row: Row) -> bool:
    """Whether a governed row whose backend stamp differs from its ledger row (`Target.is_stamped`) may be stamped
    from the ledger. Not when the stamp names other governance (`stamped_as`) and carries the row's own ``mw_source``
    (so the sidecar or an adoption stamped it from this ledger row): that is content an update wrote to the backend
    with its new governance before (or instead of, if killed) its ledger write, and stamping the old governance over
    it would serve it on the old. Any other difference (keys missing or extra, a stamp from before the row was
    adopted) is a stamp this ledger never wrote, and is replaced."""
    return stamped_as(found.metadata, row) or found.metadata.get("mw_source") != row.source


def _failpoint(spec: str) -> int | None:
    """``adopt-after-ledger[:N]`` in `spec` (testing only): die like kill -9 after the N-th (default 1st) page's
    ledger write, before its backend stamp. None when absent."""
    for item in (x.strip() for x in spec.split(",")):
        if item == "adopt-after-ledger":
            return 1
        if item.startswith("adopt-after-ledger:") and item.split(":", 1)[1].isdigit():
            return int(item.split(":", 1)[1])
    return None


def adopt(target: Target, rules: Rules, base: _Layer, ledger: Ledger, *, label: str, dry_run: bool,
          on_page: Callable[[int], None] | None = None, failpoints: str = "") -> Report:
    """Adopt every row `target` yields under `rules` (`base`: the collection's or the deployment's layer).
    Returns the `Report`. Raises the target's `TargetError` or the ledger's errors as they come; what was
    committed before stays committed and a re-run resumes (see the module docstring)."""
    report = Report(target.backend, target.collection, label, dry_run)
    key = ledger.content_key()
    source = f"{target.backend}:adopt:{rules.sha256[:12]}"
    crash_at = _failpoint(failpoints)
    pages_written = 0
    # A page's backend stamp runs while the next page is read and registered; every row is still committed
    # to the ledger before its stamp is sent. A failed stamp fails the run (at the next page or at the end).
    stamping: Future[None] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="adopt-stamp") as pool:
        for page in target.pages():
            items = _page(target, rules, base, ledger, page, report, key, source, dry_run)
            if items is not None:
                pages_written += 1
                if stamping is not None:
                    stamping.result()
                if crash_at is not None and pages_written >= crash_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # after this page's ledger commit, before its stamp
                stamping = pool.submit(target.stamp, items)
            if on_page is not None:
                on_page(len(page))
        if stamping is not None:
            stamping.result()
    report.truncated = list(getattr(target, "truncated", []))
    return report


def _page(target: Target, rules: Rules, base: _Layer, ledger: Ledger, page: list[Found], report: Report, key: bytes,
          source: str, dry_run: bool) -> list[tuple[Found, Row]] | None:
    """One page: decide every row and (unless `dry_run`) register the new ones in one ledger transaction.
    Returns what to stamp into the backend (new rows and governed rows whose stamp differs), None in a dry run."""
    report.scanned += len(page)
    known = ledger.get_rows(target.backend, target.collection, [f.row_id for f in page])
    new: list[tuple[Found, Row, Assignment]] = []
    restamp: list[tuple[Found, Row]] = []
    for found in page:
        row = known.get(found.row_id)
        if row is not None:
            if row.status in ("active", "superseded"):
                report.already += 1
                if not target.is_stamped(found, row):
                    if may_restamp(found, row):
                        restamp.append((found, row))
                    else:
                        report.changing.append(found.row_id)
            elif row.status == "deleted":
                report.tombstoned += 1
            else:
                report.pending += 1
            continue
        got = rules.assign(base, found.native, found.plain())
        if isinstance(got, Uncovered):
            report.uncovered.append((found.row_id, got.reason))
            continue
        cedar = target.cedar_attrs(found)
        new.append((found, Row(
            backend=target.backend, collection=target.collection, row_id=found.row_id, tenant=rules.tenant,
            fleet=got.fleet, owner=got.owner, scope=got.scope, writer=WRITER,
            created_at=found.created_at if found.created_at is not None else now_us(),
            readers=got.readers, labels=got.labels, request_id="", source=source,
            content_hmac=content_digest(key, found.text) if found.text is not None else None,
            content_legacy=legacy_content_digests(key, found.text) if found.text is not None else (),
            extra={"cedar": cedar} if cedar else {},
        ), got))
    # The text's digest and those of earlier normalisations (content deleted before an upgrade still matches).
    digests = [d for _, r, _ in new if r.content_hmac for d in (r.content_hmac, *r.content_legacy)]
    gone = ledger.forgotten(rules.tenant, digests) if digests else set()
    if gone:
        def deleted(r: Row) -> bool:
            return r.content_hmac in gone or not gone.isdisjoint(r.content_legacy)
        report.uncovered += [(f.row_id, DELETED_CONTENT) for f, r, _ in new if deleted(r)]
        new = [(f, r, a) for f, r, a in new if not deleted(r)]
    if not dry_run:
        listing = sorted({(rules.tenant, *k) for f, _, _ in new for k in target.listing(f)})
        inserted = set(ledger.adopt_rows([r for _, r, _ in new], listing)) if new else set()
        raced = [f for f, r, _ in new if r.row_id not in inserted]
        if raced:  # registered by a concurrent write since we looked: governed, left as it is
            now = ledger.get_rows(target.backend, target.collection, [f.row_id for f in raced])
            report.already += len(raced)
            stale = [(f, now[f.row_id]) for f in raced if f.row_id in now
                     and now[f.row_id].status in ("active", "superseded") and not target.is_stamped(f, now[f.row_id])]
            restamp += [(f, r) for f, r in stale if may_restamp(f, r)]
            report.changing += [f.row_id for f, r in stale if not may_restamp(f, r)]
            new = [(f, r, a) for f, r, a in new if r.row_id in inserted]
    report.restamped += len(restamp)
    report.adopted += len(new)
    for _, r, a in new:
        report.by_scope[r.scope] += 1
        report.by_owner[r.owner] += 1
        report.by_rule[a.rule] += 1
        for label in r.labels:
            report.by_label[label] += 1
    return None if dry_run else [(f, r) for f, r, _ in new] + restamp
