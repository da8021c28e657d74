"""Provenance helpers shared by every backend profile (DESIGN.md §4).

- `content_digest`: keyed HMAC-SHA256 over normalised text (Unicode NFKC, case-folded, whitespace
  collapsed), so a deleted memory's content cannot be re-written under another id without the text.
- `load_single_valued`: the predicates declared single-valued in ``policies/single_valued.txt``
  (one predicate per line, ``#`` comments). A triple with such a predicate supersedes the active row
  for the same (tenant, subject, predicate).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
from pathlib import Path

SINGLE_VALUED_FILE = "single_valued.txt"
_WS = re.compile(r"\s+")
_PREDICATE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def normalise(text: str) -> str:
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def content_digest(key: bytes, text: str) -> str:
    """Hex HMAC-SHA256 of the normalised text under the ledger's content key."""
    return hmac.new(key, normalise(text).encode("utf-8"), hashlib.sha256).hexdigest()


def load_single_valued(policies_dir: Path) -> frozenset[str]:
    """Predicates from ``<policies_dir>/single_valued.txt``; empty when the file is absent.

    Raises ValueError naming the line for a malformed predicate (checked at start-up).
    """
    path = Path(policies_dir) / SINGLE_VALUED_FILE
    if not path.exists():
        return frozenset()
    out = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        if not _PREDICATE.match(item):
            raise ValueError(f"{path}:{n}: {item!r} is not a predicate name")
        out.add(item)
    return frozenset(out)
