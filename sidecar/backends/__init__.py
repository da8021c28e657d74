"""Backend profiles: one module per backend, each mapping (method, path template) to an operation."""

from sidecar.backends.base import Profile, Route
from sidecar.backends.chroma import ChromaProfile

__all__ = ["ChromaProfile", "Profile", "Route"]
