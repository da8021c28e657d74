"""``memwarden-eval probe``: governance experiments against a memory service, direct vs through the sidecar.

Modules: `metrics` (Wilson intervals, quantiles, the summary recomputed from events), `plan`
(deterministic fleet from a seed), `targets` (HTTP clients for Chroma and Mem0, each directly and through the sidecar),
`experiments` (leakage, provenance, propagation, contradiction, forgetting), `report` (run directory:
events.jsonl, summary.csv, summary.md, PNG plots), `runner` (embedded stack and orchestration).
"""
