"""The shapes every backend's erasure module (`sidecar.erase.chroma`, `sidecar.erase.mem0`) returns."""

from __future__ import annotations

from dataclasses import dataclass, field


class EraseError(Exception):
    """An erase step that could not be carried out (bad directory, missing command, the backend's tool
    failed); the message is one line for the operator."""


@dataclass(frozen=True)
class Purge:
    """One purge of a backend's deleted data: `ran` False when the backend offers nothing to run (`what`
    says why); `command` what ran (no credentials), `seconds` its wall time, `output` its last lines."""

    backend: str
    ran: bool
    command: str | None = None
    seconds: float = 0.0
    output: list[str] = field(default_factory=list)
    what: str = ""

    def to_json(self) -> dict[str, object]:
        return {"backend": self.backend, "ran": self.ran, "command": self.command, "seconds": self.seconds,
                "output": self.output, "what": self.what}
