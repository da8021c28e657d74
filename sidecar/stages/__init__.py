"""Pipeline stages of docs/design.md §1, in order: canonicalize, authenticate, route, authorize, rewrite,
forward, filter, record. Backend-specific rewrite/filter steps live in the profile (sidecar/backends)."""
