"""A Chroma row's content (`sidecar.provenance.row_text`): its document, else the metadata key its client keeps
the text in (mem0's OSS `Memory` writes no document and keeps the text in ``data``); and the setting naming them."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError, load_settings
from sidecar.provenance import content_keys, row_text


def test_document_first_then_the_first_non_empty_key() -> None:
    keys = content_keys("data,text")
    assert keys == ("data", "text")
    assert row_text("the doc", {"data": "meta text"}, keys) == "the doc"
    assert row_text("", {"data": "meta text"}, keys) == ""  # an empty document is still the document
    assert row_text(None, {"data": "meta text", "text": "other"}, keys) == "meta text"
    assert row_text(None, {"data": "", "text": "other"}, keys) == "other"
    assert row_text(None, {"data": 3, "hash": "x"}, keys) is None  # not a string: no content
    assert row_text(None, None, keys) is None
    assert row_text(None, {"data": "meta text"}, content_keys("")) is None  # documents only


def test_setting_default_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(__import__("os").environ):
        if k.upper().startswith("MEMWARDEN_"):
            monkeypatch.delenv(k)
    assert load_settings().chroma_content_keys == "data"
    monkeypatch.setenv("MEMWARDEN_CHROMA_CONTENT_KEYS", "data,memory")
    assert content_keys(load_settings().chroma_content_keys) == ("data", "memory")
    for bad in ("mw_labels", "data,mw_scope", "da ta"):
        monkeypatch.setenv("MEMWARDEN_CHROMA_CONTENT_KEYS", bad)
        with pytest.raises(ConfigError, match="chroma_content_keys"):
            load_settings()
