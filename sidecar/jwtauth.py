"""Bearer JWTs as credentials (placeholder: filled in by the JWT step)."""

from __future__ import annotations


class JwtConfigError(ValueError):
    """JWT settings that cannot be used (a JWKS file that does not parse, a claims map without a required key)."""
