"""``memwarden adopt``: bring the rows of an existing Chroma collection or Mem0 store under governance.

`rules` (the TOML rules file → per-row governance), `targets` (the backends, through their own HTTP APIs),
`engine` (scan, assign, register in the ledger in batches, stamp into the backend), `cli` (the command).
"""
