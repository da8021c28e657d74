"""A deterministic probe plan: tenants × fleets × agents with trust levels, salted by a run nonce."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Trust of agent index i in each fleet (cycled): index 0 is the fleet's owner/writer.
TRUST_PATTERN = (1, 0, 1, 2, 0, 3)


@dataclass(frozen=True, slots=True)
class Agent:
    tenant: str
    fleet: str
    name: str
    trust: int

    @property
    def uid(self) -> str:
        return f"{self.tenant}/{self.fleet}/{self.name}"


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    nonce: str
    tenants: tuple[str, ...]
    fleets: tuple[str, ...]
    agents: tuple[Agent, ...]

    @classmethod
    def build(cls, seed: int, tenants: int = 1, fleets: int = 4, agents: int = 6) -> "Plan":
        """Same seed → same fleet, names and content; the nonce salts content so runs never collide."""
        if tenants < 1 or fleets < 3 or agents < 4:
            raise ValueError("need at least 1 tenant, 3 fleets and 4 agents per fleet")
        rnd = random.Random(seed)
        nonce = f"{rnd.getrandbits(40):010x}"
        ts = tuple(f"p{nonce[:6]}t{i}" for i in range(tenants))
        fs = tuple(f"f{i}" for i in range(fleets))
        ags = tuple(Agent(t, f, f"a{i}", TRUST_PATTERN[i % len(TRUST_PATTERN)]) for t in ts for f in fs for i in range(agents))
        return cls(seed, nonce, ts, fs, ags)

    def fleet_agents(self, tenant: str, fleet: str) -> list[Agent]:
        return [a for a in self.agents if a.tenant == tenant and a.fleet == fleet]

    def owner(self, tenant: str, fleet: str) -> Agent:
        return self.fleet_agents(tenant, fleet)[0]

    def writers(self, tenant: str, fleet: str) -> list[Agent]:
        return [a for a in self.fleet_agents(tenant, fleet) if a.trust >= 1]

    def rng(self, salt: str) -> random.Random:
        return random.Random(f"{self.seed}:{salt}")


def expected_read(reader: Agent, tenant: str, fleet: str, owner: str, scope: str, deleted: bool = False) -> bool:
    """The reference predicate `auth` of docs/design.md §3 (what governance should allow)."""
    if reader.tenant != tenant or deleted:
        return False
    if scope == "agent":
        return reader.uid == owner
    if scope == "fleet":
        return reader.fleet == fleet or reader.trust >= 2
    return scope == "tenant"
