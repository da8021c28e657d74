"""`logsinks.MaskFields`: every value of a masked field becomes ``mask:`` + 16 hex digits of HMAC-SHA256 of its
text, a text with a lone surrogate included (it used to raise UnicodeEncodeError, and the decision event of that
request was lost); texts without one hash exactly the UTF-8 bytes they did before; distinct texts keep distinct
masks (the masked log still correlates equal values and separates different ones within one process)."""

from __future__ import annotations

import hashlib
import hmac
import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar import decisionlog, logsinks

texts = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=6)


def reference_mask(value: object) -> str:
    """The mask before the fix, for texts it could encode."""
    return "mask:" + hmac.new(logsinks._MASK_KEY, str(value).encode("utf-8"), hashlib.sha256).hexdigest()[:16]


@settings(max_examples=300, deadline=None)
@given(value=texts)
@example(value="\ud800")
@example(value="\udfff\ud800")
def test_every_text_is_masked_and_surrogate_free_texts_as_before(value: str) -> None:
    got = logsinks.MaskFields._mask(value)
    assert got.startswith("mask:") and len(got) == 21 and all(c in "0123456789abcdef" for c in got[5:])
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate: masked (above), where the old code raised
    assert got == reference_mask(value)


@settings(max_examples=300, deadline=None)
@given(a=texts, b=texts)
@example(a="\ud83d\ude00", b="\U0001f600")  # a surrogate pair as two code points vs the character they would pair to
@example(a="\ud800", b="\udc00")
def test_distinct_texts_get_distinct_masks(a: str, b: str) -> None:
    assert (logsinks.MaskFields._mask(a) == logsinks.MaskFields._mask(b)) == (a == b)


def test_a_decision_event_with_a_masked_lone_surrogate_is_written() -> None:
    lines: list[str] = []

    class Sink:
        def info(self, line: str) -> None:
            lines.append(line)

    write = decisionlog.writer(decisionlog.processors(("row_ids",)), Sink())
    write({"request_id": "r1", "row_ids": ["ok", "\ud800"]})
    event = json.loads(lines[0])
    assert event["row_ids"] == [reference_mask("ok"), logsinks.MaskFields._mask("\ud800")]
    assert event["event"] == "decision"
