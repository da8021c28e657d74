"""memwarden sidecar: a Cedar policy enforcement point (PEP) in front of an agent-memory backend.

Public surface::

    from sidecar import Settings, create_app
"""

from sidecar.app import create_app
from sidecar.config import Settings

__all__ = ["Settings", "create_app"]
