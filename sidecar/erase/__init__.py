"""Erasure that reaches the backend's disk (`memwarden erase`, and the scheduled purge of `memwarden serve`).

A governed delete tombstones the row in the ledger and deletes it through the backend's API; the backend may
keep the text on its disk afterwards (Chroma: its log and freed SQLite pages; Mem0: its history database).
This package does the two things memwarden can do about that, and keeps what it knows of each backend in one
small module (`sidecar.erase.chroma`, `sidecar.erase.mem0`):

- **purge** — run the backend's own supported means of removing deleted data (`BACKENDS[name].purge`):
  Chroma's ``chroma vacuum``; Mem0 has none (the module says why);
- **verify** — a byte scan (`sidecar.erase.scan`) of directories the operator names for texts the operator
  gives. memwarden keeps no deleted text, only keyed HMACs of normalised text (the ledger's content digests,
  docs/design.md §4.4), so it cannot search for a text it was not given; each given text is matched against
  the ledger's digests (`match_ledger`) to say whether it is the content of deleted rows — and of live rows,
  whose copies the scan will find too.

The texts given are held in memory for the scan only: never logged, stored or echoed (reports name a text by
its number).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sidecar.erase import chroma, mem0
from sidecar.erase.base import EraseError, Purge
from sidecar.erase.scan import CANNOT_SEE, Found, ScanResult
from sidecar.erase.scan import scan as scan_paths
from sidecar.provenance import content_digest, legacy_content_digests

__all__ = ["BACKENDS", "EraseError", "Purge", "TextReport", "VerifyReport", "match_ledger", "verify"]

BACKENDS: dict[str, ModuleType] = {chroma.NAME: chroma, mem0.NAME: mem0}
MAX_ROW_IDS = 20  # deleted rows named per text in a report


@dataclass
class TextReport:
    """What is known of the text numbered `number` (1-based, in the order given)."""

    number: int
    deleted_rows: list[str] = field(default_factory=list)  # "<collection>/<row id>", at most MAX_ROW_IDS
    deleted_count: int = 0  # tombstoned rows whose content digest is this text's
    live_count: int = 0  # active or superseded rows with the same content (their copies are found too)
    found: list[Found] = field(default_factory=list)

    @property
    def remains(self) -> bool:
        """The text, or a piece of it, is in some file scanned."""
        return any(f.places or f.pieces_found for f in self.found)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.number, "deleted_rows": self.deleted_rows, "deleted_count": self.deleted_count,
                "live_count": self.live_count, "remains": self.remains, "found": [f.to_json() for f in self.found]}


@dataclass
class VerifyReport:
    backend: str
    roots: list[str]
    texts: list[TextReport]
    files: int
    bytes: int
    unreadable: list[str]
    cannot_see: tuple[str, ...]

    @property
    def clean(self) -> bool:
        """No text found and every file read (only then does the scan claim absence)."""
        return not self.unreadable and not any(t.remains for t in self.texts)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "scanned": self.roots, "files": self.files, "bytes": self.bytes,
                "unreadable": self.unreadable, "clean": self.clean, "texts": [t.to_json() for t in self.texts],
                "cannot_see": list(self.cannot_see)}


def match_ledger(ledger: Any, backend: str, texts: list[str], tenants: list[str] | None = None) -> list[TextReport]:
    """For each text, the ledger's rows of `backend` whose content digest (`content_digest`, and the earlier
    `legacy_content_digests`) is the text's: tombstoned ones (named, up to `MAX_ROW_IDS`) and live ones
    (counted). `tenants` defaults to every tenant the ledger has keys for. The match is up to the content
    normalisation (case, width, spacing, format and other default-ignorable characters); the scan that follows looks for exact bytes."""
    key = ledger.content_key()
    if tenants is None:
        tenants = sorted({k.tenant for k in ledger.list_keys() if k.tenant})
    out = []
    for n, text in enumerate(texts, 1):
        digests = [content_digest(key, text), *legacy_content_digests(key, text)]
        report = TextReport(n)
        for tenant in tenants:
            gone = ledger.content_copies(backend, tenant, digests, deleted=True)
            report.deleted_count += len(gone)
            report.deleted_rows += [f"{r.collection}/{r.row_id}" for r in gone][:MAX_ROW_IDS - len(report.deleted_rows)]
            report.live_count += len(ledger.content_copies(backend, tenant, digests, deleted=False))
        out.append(report)
    return out


def verify(ledger: Any, backend: str, roots: list[Path], texts: list[str], tenants: list[str] | None = None) -> VerifyReport:
    """Match `texts` against the ledger (`match_ledger`) and scan `roots` for them (`sidecar.erase.scan.scan`).
    Raises `EraseError` when a root is not a directory."""
    reports = match_ledger(ledger, backend, texts, tenants)
    try:
        result: ScanResult = scan_paths(roots, texts)
    except FileNotFoundError as exc:
        raise EraseError(str(exc)) from None
    for report, found in zip(reports, result.found):
        report.found = found
    module = BACKENDS[backend]
    return VerifyReport(backend, [str(r) for r in roots], reports, result.files, result.bytes, result.unreadable,
                        CANNOT_SEE + module.CANNOT_SEE)
