"""The content normalisation and Unicode's Default_Ignorable_Code_Point property (issue 34, finding 9).

Content is compared by a keyed HMAC of its normalised text (`sidecar.provenance.content_digest`). A code point a
renderer shows as nothing must not make a deleted text a new one: before, only category Cf was removed, so the
combining grapheme joiner (U+034F, Mn), variation selectors (U+FE0F, Mn) and Mongolian free variation selectors
(U+180B, Mn) got a deleted text past the forgotten-content rule. The ignorable set here comes from the `regex`
package's Unicode tables (not from the code under test), and digests a ledger stored under the earlier
normalisations still match (`legacy_content_digests`)."""

from __future__ import annotations

import hashlib
import hmac
import unicodedata
from pathlib import Path

import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.governance import Principal, Row
from sidecar.ledger import SQLiteLedger
from sidecar.provenance import content_digest, legacy_content_digests, normalise_content

KEY = b"k" * 32
IGNORABLE = regex.findall(r"\p{Default_Ignorable_Code_Point}", "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000))
TEXT = "the vault PIN is 4711"


def test_the_property_is_not_degenerate() -> None:
    # the code points of the finding, other Mn and Lo ones, unassigned ones reserved as ignorable
    for c in ("\u034f", "\ufe0f", "\u180b", "\u200b", "\u00ad", "\u3164", "\uffa0", "\U000e0041", "\U000e0100", "\u2065"):
        assert c in IGNORABLE, hex(ord(c))
    assert {unicodedata.category(c) for c in IGNORABLE} >= {"Mn", "Cf", "Lo", "Cn"}
    assert "a" not in IGNORABLE and " " not in IGNORABLE


def test_the_marks_of_the_finding_do_not_make_a_new_text() -> None:
    want = content_digest(KEY, TEXT)
    for mark in ("\u034f", "\ufe0f", "\u180b"):
        for spelt in (TEXT.replace(" ", f" {mark}"), TEXT.replace("PIN", f"P{mark}IN"), mark + TEXT + mark):
            assert content_digest(KEY, spelt) == want, repr(spelt)
    assert content_digest(KEY, "the vault PIN is 4712") != want


@settings(max_examples=400, deadline=None)
@given(text=st.text(max_size=40), marks=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(IGNORABLE)), min_size=1, max_size=4))
def test_inserting_default_ignorable_code_points_anywhere_never_changes_the_digest(text: str, marks: list[tuple[int, str]]) -> None:
    spelt = text
    for at, mark in marks:
        at = min(at, len(spelt))
        spelt = spelt[:at] + mark + spelt[at:]
    assert normalise_content(spelt) == normalise_content(text)
    assert content_digest(KEY, spelt) == content_digest(KEY, text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_the_normalised_text_holds_no_default_ignorable_code_point(text: str) -> None:
    assert not regex.search(r"\p{Default_Ignorable_Code_Point}", normalise_content(text))


def _old_cf(text: str) -> str:
    """The normalisation of the release before this one, verbatim: NFKC, case-folded, Cf removed, whitespace
    collapsed, punctuation/symbols/whitespace stripped at the edges."""
    folded = "".join(c for c in unicodedata.normalize("NFKC", text).casefold() if unicodedata.category(c) != "Cf")
    words = regex.sub(r"\s+", " ", folded)
    edge = lambda c: c.isspace() or unicodedata.category(c)[0] in "PS"  # noqa: E731
    while words and edge(words[0]):
        words = words[1:]
    while words and edge(words[-1]):
        words = words[:-1]
    return words


def _old_digest(text: str, key: bytes = KEY) -> str:
    return hmac.new(key, _old_cf(text).encode("utf-8"), hashlib.sha256).hexdigest()


def test_digests_of_the_earlier_normalisation_are_still_looked_up() -> None:
    # A text without default-ignorable marks digests as it did before: stored digests stay valid as they are.
    assert content_digest(KEY, TEXT) == _old_digest(TEXT)
    # A text that had one: the earlier digest is among the legacy ones, with and without the mark.
    marked = "the vault\u034f PIN is 4711"
    assert _old_digest(marked) != content_digest(KEY, marked)
    assert _old_digest(marked) in legacy_content_digests(KEY, marked)
    assert content_digest(KEY, marked) not in legacy_content_digests(KEY, marked)
    assert len(set(legacy_content_digests(KEY, marked))) == len(legacy_content_digests(KEY, marked)) <= 3


def _world(tmp_path: Path) -> tuple[SQLiteLedger, Principal]:
    ledger = SQLiteLedger(tmp_path / "l.db")
    record, _ = ledger.create_key("agent", "t", "red", "a", 1)
    return ledger, record.principal()


def test_a_digest_stored_by_the_legacy_normalisation_still_blocks(tmp_path: Path) -> None:
    """A row written before the upgrade holds the earlier digest of its text (here with a variation selector in it,
    which the earlier normalisation kept); after it is deleted, the same text written again is still refused, by
    the sidecar (`Provenance.forgotten`) and by `adopt` (`Ledger.forgotten` over the legacy digests)."""
    from sidecar.adopt.engine import DELETED_CONTENT, _page
    from sidecar.adopt.rules import Assignment
    from sidecar.provenance import Provenance

    ledger, p = _world(tmp_path)
    key = ledger.content_key()
    old_text = "my locker\ufe0f code is 2323"
    stored = _old_digest(old_text, key)
    assert stored != content_digest(key, old_text)
    r = Row("mem0", "default", "d1", "t", "red", "t/red/a", "fleet", "t/red/a", 1, content_hmac=stored)
    ledger.reserve_rows([r])
    ledger.activate_rows("mem0", "default", ["d1"])
    ledger.tombstone("mem0", "default", ["d1"], "t/red/a", "r0")

    class Allow:
        def decide_rows(self, ex: object, action: str, rows: list[Row]) -> list[object]:
            return [type("D", (), {"allowed": action == "read"})() for _ in rows]

    class Ex:
        principal = p

    prov = Provenance.__new__(Provenance)
    prov.backend, prov.ledger, prov.authz, prov.content_key = "mem0", ledger, Allow(), key
    again = prov.set_content(Row("mem0", "default", "n1", "t", "red", "t/red/a", "fleet", "t/red/a", 2), old_text)
    assert prov.forgotten(Ex(), [again]) == [again]  # type: ignore[arg-type]

    # adopt: the same text found in the backend under a new id is not adopted
    class Target:
        backend, collection = "mem0", "default"

        def is_stamped(self, found: object, row: Row) -> bool:
            return True

        def listing(self, found: object) -> list[tuple[str, str]]:
            return []

        def cedar_attrs(self, found: object) -> dict[str, str]:
            return {}

    class Rules:
        tenant = "t"

        def assign(self, base: object, native: object, plain: object) -> Assignment:
            return Assignment(owner="t/red/a", fleet="red", scope="fleet", readers=(), rule="test")

    from sidecar.adopt.engine import Report
    from sidecar.adopt.targets import Found
    report = Report("mem0", "default", "default", True)
    page = [Found(row_id="n2", text=old_text, native={}, metadata={}, created_at=None)]
    _page(Target(), Rules(), None, ledger, page, report, key, "mem0:adopt:x", True)  # type: ignore[arg-type]
    assert report.uncovered == [("n2", DELETED_CONTENT)]
