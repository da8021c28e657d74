"""A plain byte scan of directories for given texts (`memwarden erase --verify`).

The scan's claims rest on one thing: whether the bytes of a text, in the encodings `needles` lists, occur in a
file. It reads files as bytes and understands none of them, with one exception that is only a *hint*: in a
file that begins with SQLite's magic string, a hit's page is looked up in the database's freelist, read from
the header and freelist trunk pages as SQLite's documented file format describes them
(https://www.sqlite.org/fileformat2.html §1.3, §1.5), to say whether it sits in a free page (gone after a
VACUUM or when the page is reused) or in a page in use (a live record, or a deleted record's bytes left in the
free space of a page still in use). A header that is not as documented gives no hint; the hit still counts.

What a byte scan cannot see is listed in `CANNOT_SEE` (and per backend in `sidecar.erase.chroma` / `.mem0`).
Texts are held in memory only for the scan: nothing here writes them anywhere, and results name a text by
its position in the caller's list, never by its content.
"""

from __future__ import annotations

import json
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

CHUNK_BYTES = 4 * 1024 * 1024
PIECE_BYTES = 32  # a text at least twice this long is also looked for in pieces (split across storage pages)
MAX_OFFSETS = 5  # offsets reported per file and text (the count is exact)
MAX_LOCATED = 10_000  # occurrences per file and form whose page is looked up; more are "not located"
SQLITE_MAGIC = b"SQLite format 3\x00"

CANNOT_SEE = (
    "text in any other form than the ones searched (UTF-8 as given, in NFC and NFD; UTF-16 LE and BE; inside a "
    "JSON string, escaped or not): compressed (gzip, zstd, LZ4 blocks; PostgreSQL TOAST), encrypted or "
    "base64-encoded data, or a copy whose case, spacing or Unicode form differs from the text given",
    "text kept only transformed: tokenised full-text indexes (trigram or word terms), lemmatised or "
    "case-folded copies",
    "vectors (embeddings): numbers, not text — a deleted row's vector can remain in a vector index",
    "a text split across storage pages is found only in pieces (reported as pieces, not as the whole text); a "
    "text shorter than 64 bytes is looked for whole only",
    "anything outside the directories scanned: backups, snapshots, replicas, another host, the backend's "
    "memory and swap, and disk blocks the file system already released (deleted or truncated files, SSD "
    "remapping)",
)


@dataclass(frozen=True, slots=True)
class Needle:
    """One byte form of a text: `form` names the encoding (e.g. ``utf-8``, ``utf-16-le NFD``)."""

    form: str
    data: bytes


def needles(text: str) -> list[Needle]:
    """The byte forms of `text` the scan looks for, without duplicates: for the text as given and its NFC
    and NFD forms, UTF-8, UTF-16 LE and BE, and the body of a JSON string (``ensure_ascii`` escapes as
    Python writes them, and escapes of quotes, backslashes and controls only, as serde_json writes them)."""
    forms: dict[str, str] = {text: ""}
    for nf in ("NFC", "NFD"):
        forms.setdefault(unicodedata.normalize(nf, text), f" {nf}")
    out: dict[bytes, str] = {}
    for form, tag in forms.items():
        out.setdefault(form.encode("utf-8", "surrogatepass"), "utf-8" + tag)
        out.setdefault(form.encode("utf-16-le", "surrogatepass"), "utf-16-le" + tag)
        out.setdefault(form.encode("utf-16-be", "surrogatepass"), "utf-16-be" + tag)
        out.setdefault(json.dumps(form)[1:-1].encode("ascii"), "json-escaped" + tag)
        out.setdefault(json.dumps(form, ensure_ascii=False)[1:-1].encode("utf-8", "surrogatepass"), "json" + tag)
    return [Needle(f, d) for d, f in out.items() if d]


def pieces(text: str) -> list[bytes]:
    """`text`'s UTF-8 bytes in consecutive `PIECE_BYTES` pieces (the last one ending at the end), when it is
    at least twice that long; else none. SQLite, for one, keeps a long record's bytes on overflow pages, each
    starting with a page number: the whole text is then not one byte string in the file, its pieces are."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) < 2 * PIECE_BYTES:
        return []
    out = [data[i:i + PIECE_BYTES] for i in range(0, len(data) - PIECE_BYTES + 1, PIECE_BYTES)]
    if len(data) % PIECE_BYTES:
        out.append(data[-PIECE_BYTES:])
    return list(dict.fromkeys(out))


@dataclass
class Found:
    """Where one text was found in one file: exact occurrences per form, where they sit, and pieces."""

    file: str  # relative to the scanned directory (prefixed with it when several were scanned)
    places: int = 0
    forms: dict[str, int] = field(default_factory=dict)
    offsets: list[int] = field(default_factory=list)
    where: dict[str, int] = field(default_factory=dict)  # "free page", "page in use", "SQLite WAL file", ...
    pieces_found: int = 0
    pieces_total: int = 0

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"file": self.file, "places": self.places, "forms": self.forms,
                                  "offsets": self.offsets, "where": self.where}
        if self.pieces_total:
            doc["pieces"] = {"found": self.pieces_found, "of": self.pieces_total}
        return doc


@dataclass
class ScanResult:
    """`found[i]`: the files holding text i (whole, or — long texts — some of its pieces)."""

    found: list[list[Found]]
    files: int = 0
    bytes: int = 0
    unreadable: list[str] = field(default_factory=list)  # "path: reason": the scan is incomplete


def _files(root: Path, unreadable: list[str]) -> Iterator[Path]:
    """Regular files under `root`, symbolic links not followed (a link out of the directory is not scanned);
    a directory that cannot be listed is added to `unreadable` (the scan is then incomplete)."""
    def failed(exc: OSError) -> None:
        unreadable.append(f"{exc.filename}: {exc.strerror or type(exc).__name__}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=failed, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                yield p


def _search(path: Path, targets: list[bytes]) -> tuple[list[int], list[list[int]], int]:
    """(count, first offsets) of every target in `path`, read in chunks with an overlap so that a match
    across a chunk boundary is found once; and the bytes read."""
    counts = [0] * len(targets)
    offsets: list[list[int]] = [[] for _ in targets]
    overlap = max(len(t) for t in targets) - 1
    tail = b""
    base = 0  # file offset of buf[0]
    size = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(CHUNK_BYTES)
            if not chunk:
                break
            size += len(chunk)
            buf = tail + chunk
            for i, t in enumerate(targets):
                start = 0
                while True:
                    p = buf.find(t, start)
                    if p < 0:
                        break
                    if p + len(t) > len(tail):  # not wholly inside the previous chunk's tail (counted then)
                        counts[i] += 1
                        if len(offsets[i]) < MAX_LOCATED:
                            offsets[i].append(base + p)
                    start = p + 1
            keep = min(overlap, len(buf))
            tail = buf[len(buf) - keep:] if keep else b""
            base += len(buf) - len(tail)
    return counts, offsets, size


def sqlite_free_pages(path: Path) -> tuple[int, set[int]] | None:
    """(page size, numbers of the pages on the freelist) of an SQLite database file, read as the documented
    file format says (header: page size at offset 16, first freelist trunk page at 32, freelist page count at
    36; a trunk page: next trunk, number of leaves, the leaves' page numbers). None when the file does not
    start with SQLite's magic string or its header or freelist is not as documented (a file being written
    may be caught mid-change: the result is a hint)."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
            if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
                return None
            page_size = int.from_bytes(header[16:18], "big")
            page_size = 65536 if page_size == 1 else page_size
            if page_size < 512 or page_size & (page_size - 1):
                return None
            trunk = int.from_bytes(header[32:36], "big")
            total = int.from_bytes(header[36:40], "big")
            free: set[int] = set()
            while trunk:
                if trunk in free or len(free) > total:
                    return None
                free.add(trunk)
                fh.seek((trunk - 1) * page_size)
                page = fh.read(page_size)
                if len(page) < 8:
                    return None
                nxt, leaves = int.from_bytes(page[:4], "big"), int.from_bytes(page[4:8], "big")
                if leaves > page_size // 4 - 2:
                    return None
                free.update(int.from_bytes(page[8 + 4 * i:12 + 4 * i], "big") for i in range(leaves))
                trunk = nxt
            return (page_size, free) if len(free) == total else None
    except OSError:
        return None


def _distinct(spans: list[tuple[int, int]]) -> list[int]:
    """Start offsets of the places `spans` (start, end) cover, overlapping spans merged: one stored copy can
    match two forms (ASCII in UTF-16 LE after a NUL byte is also UTF-16 BE, one byte earlier)."""
    starts: list[int] = []
    end = -1
    for a, b in sorted(spans):
        if a >= end:
            starts.append(a)
        end = max(end, b)
    return starts


def _where(path: Path, offset: int, sqlite: tuple[int, set[int]] | None) -> str:
    """What kind of place `offset` of `path` is, as far as file names and SQLite's documented layout say."""
    if path.name.endswith("-wal"):
        return "SQLite write-ahead log file"
    if path.name.endswith("-journal"):
        return "SQLite rollback journal"
    if sqlite is None:
        return "file"
    page_size, free = sqlite
    return "free page" if offset // page_size + 1 in free else "page in use"


def scan(roots: list[Path], texts: list[str]) -> ScanResult:
    """Look for every text (as `needles` and, when long, `pieces`) in every regular file under `roots`.

    Returns a `ScanResult`; unreadable files are listed (a scan with any is incomplete). Raises nothing for
    a file that vanishes or cannot be opened; `FileNotFoundError` if a root does not exist."""
    for root in roots:
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: not a directory")
    forms = [needles(t) for t in texts]
    parts = [pieces(t) for t in texts]
    targets: list[bytes] = []
    index: list[tuple[int, str | None]] = []  # target -> (text, form; None for a piece)
    for i, ns in enumerate(forms):
        for n in ns:
            targets.append(n.data)
            index.append((i, n.form))
        for p in parts[i]:
            targets.append(p)
            index.append((i, None))
    result = ScanResult(found=[[] for _ in texts])
    if not targets:
        return result
    for root in roots:
        for path in _files(root, result.unreadable):
            rel = str(path.relative_to(root)) if len(roots) == 1 else str(path)
            try:
                counts, offsets, size = _search(path, targets)
            except OSError as exc:
                result.unreadable.append(f"{path}: {exc.strerror or type(exc).__name__}")
                continue
            result.files += 1
            result.bytes += size
            if not any(counts):
                continue
            sqlite = sqlite_free_pages(path)
            per_text: dict[int, Found] = {}
            spans: dict[int, list[tuple[int, int]]] = {}
            for j, (i, form) in enumerate(index):
                if not counts[j]:
                    continue
                f = per_text.setdefault(i, Found(rel, pieces_total=len(parts[i])))
                if form is None:
                    f.pieces_found += 1
                    continue
                f.forms[form] = f.forms.get(form, 0) + counts[j]
                spans.setdefault(i, []).extend((off, off + len(targets[j])) for off in offsets[j])
                if counts[j] > len(offsets[j]):
                    f.places += counts[j] - len(offsets[j])
                    f.where["not located"] = f.where.get("not located", 0) + counts[j] - len(offsets[j])
            for i, f in per_text.items():
                for start in _distinct(spans.get(i, [])):
                    f.places += 1
                    if len(f.offsets) < MAX_OFFSETS:
                        f.offsets.append(start)
                    kind = _where(path, start, sqlite)
                    f.where[kind] = f.where.get(kind, 0) + 1
                result.found[i].append(f)
    return result
