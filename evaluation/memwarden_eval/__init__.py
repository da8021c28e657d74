"""memwarden-eval: memwarden's demo, governance probes (`probe`), the GateMem benchmark (`gatemem`), our Mem0
REST test server (`mem0_server`), local embeddings (`embeddings`) and the harness that starts real servers
(`harness`). Not part of the product wheel; the ``memwarden-eval`` command is `memwarden_eval.cli`."""
