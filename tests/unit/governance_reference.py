"""Earlier code of `sidecar.governance`, kept as test references."""

from __future__ import annotations

from typing import Any

from sidecar.governance import agent_id


def principal_uid(self: Any) -> tuple[str, str]:
    """`Principal.uid` as of de70fd8 (a property computed at every read)."""
    if self.kind == "operator":
        return ("Operator", self.key_id)
    if self.kind == "admin":
        return ("TenantAdmin", f"{self.tenant}/admin/{self.key_id}")
    return ("Agent", agent_id(self.tenant, self.fleet or "", self.agent or ""))
