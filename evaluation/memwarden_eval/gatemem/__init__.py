"""GateMem (rzhub/GateMem) replayed through memwarden at the retrieval layer: ``memwarden-eval bench gatemem``.

Modules: `data` (typed loader; hidden annotations kept apart from what ingest sees), `measures`
(deterministic retrieval-layer measures with Wilson intervals), `rules` (what ingest knows of each domain:
content categories, subjects, circles), `labels` (ingest-time labelling of each turn, deletions, access changes).
"""
