"""A Hypothesis state machine over memwarden's provenance layer, through the real sidecar in front of a
real backend (docs/design.md §2 and §4; README "Provenance, supersession and deletion closure").

Rules, by a fixed cast of principals (tenant with fleets red/blue: a1, a2 (red, trust 1), b1 (blue,
trust 1), boss (blue, trust 3), r0 (red, trust 0); the tenant admin key; an agent of another tenant):

- write: a row with a random scope (agent/fleet/tenant/restricted), sometimes re-homed to the other fleet;
- derived write: a row naming 1-2 parents (any status, or an id that never existed);
- copy: a row whose text is an existing row's text (verbatim, upper-cased, re-spaced, or with a zero-width
  space in front and a full stop after), live or deleted;
- triple write: subject x predicate from a small set, in any scope; two predicates are single-valued
  (policies/single_valued.txt) and one is not; a single-valued fact is single-valued within its
  visibility partition (agent: its owner; fleet: its fleet; tenant; restricted: owner and readers);
- burst: 3-6 contradicting triple writes on one single-valued (subject, predicate), from threads at once;
- delete: rows by anyone (Chroma: 1-2 ids per request; Mem0: one), with cascade closure over derived
  rows and the deleter's deletable copies of the content;
- read: get by ids.

`Model` is a small, independent model of the default policies (policies/default.cedar) and of the
ledger's row states; every response status is checked against it. After every step the invariants check,
for every principal: (1) list, count and search show exactly the readable active rows (and list with
include_superseded the readable live ones), (2) no deleted row's id or text comes back on get, search,
count or lineage, and get/lineage of a deleted id find nothing — nor the id or text of any row the
principal may not read, (3) one active row per single-valued fact (none once that row is deleted), the
rest reachable with include_superseded, in the API and the ledger, per visibility partition, (4) lineage is complete — every readable ancestor with its id, writer, status and depth,
unreadable ones as id-less placeholders, (5) the ledger's row states equal the model's.

The machine reaches the backend only through `Backend` (write, delete, list, count, search, get,
lineage, facts and the ledger); `ChromaBackend` and `Mem0Backend` run the same machine. Every Hypothesis
example uses a fresh tenant (and starts with a private note and a row derived from it). Budgets, measured
on two cores: Chroma 25 examples of up to 30 steps, about 1.5 minutes (2-3 with other test runs on the
machine); Mem0 10 x 30, about 1.5 minutes (2.5-3.5 under load). ``MW_STATEFUL_EXAMPLES`` /
``MW_STATEFUL_STEPS`` override both (and then skip the check that the run exercised each kind of
outcome); ``MW_STATEFUL_SEED`` repeats a run (the seed is printed first).
"""

from __future__ import annotations

import os
import random
import threading
import unicodedata
import uuid
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import httpx
import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, get_state_machine_test, initialize, invariant, precondition,
                                 rule)

from sidecar.ledger import SQLiteLedger
from tests.integration.conftest import POLICIES, Stack
from tests.integration.mem0.conftest import Mem0Stack

pytestmark = pytest.mark.integration

# ---- the cast ------------------------------------------------------------------------------------------

CAST: dict[str, tuple[str, int]] = {  # agent name -> (fleet, trust)
    "a1": ("red", 1), "a2": ("red", 1), "b1": ("blue", 1), "boss": ("blue", 3), "r0": ("red", 0),
}
ADMIN, OUTSIDER = "admin", "outsider"
AGENTS = tuple(CAST)
PRINCIPALS = (*AGENTS, ADMIN, OUTSIDER)
# writers: the agents that may write three times as likely as r0 (trust 0), the admin and the outsider
WRITERS = st.sampled_from((*(("a1", "a2", "b1", "boss") * 3), "r0", ADMIN, OUTSIDER))
SCOPES = ("agent", "fleet", "tenant", "restricted")
OTHER_FLEET = {"red": "blue", "blue": "red"}
SUBJECTS = ("svc-api", "svc-db")


def _single_valued() -> frozenset[str]:
    """policies/single_valued.txt, read here independently of the sidecar's loader."""
    lines = (line.split("#", 1)[0].strip() for line in (POLICIES / "single_valued.txt").read_text().splitlines())
    return frozenset(line for line in lines if line)


SINGLE_VALUED = _single_valued()
SV_PREDICATES = ("status", "location")
MULTI_PREDICATE = "mentions"
assert set(SV_PREDICATES) <= SINGLE_VALUED and MULTI_PREDICATE not in SINGLE_VALUED, "degenerate predicate set"
PREDICATES = (*SV_PREDICATES, MULTI_PREDICATE)


def normalise(text: str) -> str:
    """README: content is compared after NFKC, case folding, removing format characters (zero-width),
    collapsing whitespace and stripping punctuation and symbols at the edges."""
    folded = "".join(c for c in unicodedata.normalize("NFKC", text).casefold() if unicodedata.category(c) != "Cf")
    words = " ".join(folded.split())
    edge = lambda c: c.isspace() or unicodedata.category(c)[0] in "PS"  # noqa: E731
    while words and edge(words[0]):
        words = words[1:]
    while words and edge(words[-1]):
        words = words[:-1]
    return words


# ---- the model -------------------------------------------------------------------------------------------

@dataclass
class MRow:
    id: str
    text: str
    token: str  # unique per original text; copies share it (checked case-insensitively in raw responses)
    vec: list[float]
    owner: str  # a CAST name (also the writer: rows are owned by their writer)
    fleet: str
    scope: str
    readers: frozenset[str]
    parents: tuple[str, ...]
    triple: tuple[str, str, str] | None
    status: str = "active"  # active | superseded | deleted

    @property
    def fact(self) -> tuple[str, str] | None:
        return (self.triple[0], self.triple[1]) if self.triple else None

    @property
    def single_valued(self) -> bool:
        return self.triple is not None and self.triple[1] in SINGLE_VALUED

    @property
    def live(self) -> bool:
        return self.status in ("active", "superseded")

    @property
    def partition(self) -> tuple[Any, ...]:
        """README "Supersession": the visibility partition within which a fact is single-valued."""
        if self.scope == "agent":
            return ("agent", self.owner)
        if self.scope == "fleet":
            return ("fleet", self.fleet)
        if self.scope == "tenant":
            return ("tenant",)
        return ("restricted", self.owner, self.readers)


def may_read(who: str, r: MRow) -> bool:
    """Cedar `read` on `r` judged as if it were active (policies/default.cedar: read-agent-scope,
    read-fleet-scope, read-tenant-scope, read-restricted-readers, tenant-admin-rows, forbid-cross-tenant).
    forbid-deleted is applied by the callers through `r.status`."""
    if who == OUTSIDER:
        return False
    if who == ADMIN:
        return True
    fleet, trust = CAST[who]
    if r.scope == "agent":
        return r.owner == who
    if r.scope == "fleet":
        return r.fleet == fleet or trust >= 2
    if r.scope == "tenant":
        return True
    return who in r.readers


def may_write(who: str, fleet: str) -> bool:
    """write-trust-ladder: an agent owns what it writes; home fleet at trust >= 1, any fleet at 3.
    Tenant admins own no rows (README: 403); the outsider's tenant differs."""
    if who not in CAST:
        return False
    home, trust = CAST[who]
    return (fleet == home and trust >= 1) or trust >= 3


def may_supersede(who: str, r: MRow) -> bool:
    """`supersede` (supersede-readable-fact): a newer fact from a writer at trust >= 1 that may read the
    current one, or owns it."""
    if who not in CAST or CAST[who][1] < 1:
        return False
    return r.owner == who or (r.scope != "agent" and may_read(who, r))


def may_change(who: str, r: MRow) -> bool:
    """`update` / `delete` (owner-update-delete, tenant-admin-rows) on a live row."""
    if who == OUTSIDER:
        return False
    return who == ADMIN or (r.owner == who and CAST[who][1] >= 1)


@dataclass
class Model:
    rows: dict[str, MRow] = field(default_factory=dict)  # by id, in write order

    def visible(self, who: str, include_superseded: bool = False) -> set[str]:
        ok = ("active", "superseded") if include_superseded else ("active",)
        return {r.id for r in self.rows.values() if r.status in ok and may_read(who, r)}

    def active_fact(self, fact: tuple[str, str], partition: tuple[Any, ...] | None = None) -> MRow | None:
        """The active row of `fact` in `partition`; without a partition, the newest active one in any."""
        live = [r for r in self.rows.values() if r.single_valued and r.fact == fact and r.status == "active"
                and (partition is None or r.partition == partition)]
        assert partition is None or len(live) <= 1, "model bug: two active facts in one partition"
        return live[-1] if live else None

    def write_outcomes(self, who: str, row: MRow) -> set[int]:
        """The statuses the sidecar may answer to `who` writing `row`.

        Each failing condition contributes its status; README does not order them (e.g. forgotten
        content 409 vs. a write the trust ladder denies 403), so any failing one is accepted."""
        if who == OUTSIDER:
            return {403, 404}  # README: a collection not registered to the caller's tenant is 404; foreign tenant 403
        if who == ADMIN:
            return {403}  # README: tenant admin keys cannot own rows
        fails: set[int] = set()
        for pid in row.parents:  # README: each parent must exist and be readable by the writer (else 403)
            parent = self.rows.get(pid)
            if parent is None or not parent.live or not may_read(who, parent):
                fails.add(403)
        if row.single_valued:  # README: a newer fact replaces the current one of its partition (supersede)
            current = self.active_fact(row.fact, row.partition)  # type: ignore[arg-type]
            if current is not None and not may_supersede(who, current):
                fails.add(403)
        # README: deleted content does not come back to its lineage — the deleted row's owner or fleet —
        # where the writer could read it (409); other fleets, and writers who never could read it, may write it
        if any(r.status == "deleted" and normalise(r.text) == normalise(row.text) and may_read(who, r)
               and (r.owner == who or r.fleet == CAST[who][0]) for r in self.rows.values()):
            fails.add(409)
        if not may_write(who, row.fleet):
            fails.add(403)
        return fails or {200}

    def add(self, row: MRow) -> None:
        if row.single_valued:
            current = self.active_fact(row.fact, row.partition)  # type: ignore[arg-type]
            if current is not None:
                current.status = "superseded"
        self.rows[row.id] = row

    def delete(self, who: str, ids: list[str]) -> tuple[list[str], set[str]]:
        """(ids the request itself deletes, every id tombstoned). README: a delete needs `delete` on the
        row; rows derived from a deleted row go too (cascade, transitively); so do other live rows with
        the same normalised content that the deleter may delete (and their derived rows)."""
        direct = [i for i in ids if i in self.rows and self.rows[i].live and may_change(who, self.rows[i])]
        texts = {normalise(self.rows[i].text) for i in direct}
        copies = [r.id for r in self.rows.values()
                  if r.live and r.id not in direct and normalise(r.text) in texts and may_change(who, r)]
        children: dict[str, list[str]] = {}
        for r in self.rows.values():
            for p in r.parents:
                children.setdefault(p, []).append(r.id)
        gone: set[str] = set()
        queue = deque(direct + copies)
        while queue:
            i = queue.popleft()
            if i in gone:
                continue
            gone.add(i)
            queue.extend(children.get(i, []))
        for i in gone:
            self.rows[i].status = "deleted"
        return direct, gone

    def ancestors(self, row_id: str) -> list[tuple[str, int]]:
        """Breadth-first (id, depth) from `row_id` (depth 0) over derived_from, each id once."""
        out: list[tuple[str, int]] = []
        seen: set[str] = set()
        frontier = deque([(row_id, 0)])
        while frontier:
            i, d = frontier.popleft()
            if i in seen:
                continue
            seen.add(i)
            out.append((i, d))
            frontier.extend((p, d + 1) for p in self.rows[i].parents)
        return out


# ---- the backend adapter --------------------------------------------------------------------------------

@dataclass
class Seen:
    """One response, normalised: status, row ids (per query for search), text and writer per row id, raw body."""

    status: int
    ids: list[str] = field(default_factory=list)
    per_query: list[list[str]] = field(default_factory=list)
    texts: dict[str, str | None] = field(default_factory=dict)
    writers: dict[str, str | None] = field(default_factory=dict)
    metas: dict[str, dict[str, Any]] = field(default_factory=dict)
    value: Any = None
    raw: str = ""


class Backend(Protocol):
    """What the machine needs from one profile. Rows are named by the ids `write` returns."""

    name: str
    tenant: str
    # Chroma deletes a list of ids in one request ({"deleted": n}); Mem0 one id per request (200/403/404).
    batch_delete: bool
    # What the outsider's list/search/count/get answer: Chroma 404 (not its collection); Mem0 200 with no
    # rows (the outsider's own tenant's view of the deployment; per-id gets each 404).
    foreign_view_statuses: frozenset[int]
    # Mem0 has no collection in its paths: the outsider's add lands in its own tenant (out of this model).
    outsider_writes_elsewhere: bool

    def open(self) -> None:
        """A fresh tenant with keys for CAST, its admin and an agent of another tenant."""

    def close(self) -> None: ...

    def propose_id(self, n: int) -> str:
        """The id to request for the n-th write (profiles that assign ids ignore it)."""

    def ghost_id(self) -> str:
        """An id that never exists."""

    def client(self, who: str) -> httpx.Client:
        """A new HTTP client with `who`'s key (for threads)."""

    def write(self, who: str, row: MRow, http: httpx.Client | None = None) -> tuple[int, str | None]:
        """Write `row` as `who`; (status, id of the new row on 200)."""

    def delete(self, who: str, ids: list[str]) -> tuple[int, int | None]:
        """Delete `ids` as `who`; (status, number of rows the request reports deleted)."""

    def listing(self, who: str, include_superseded: bool = False) -> Seen: ...
    def count(self, who: str) -> Seen | None:
        """None where the profile has no count route (Mem0)."""
    def get(self, who: str, ids: list[str]) -> Seen: ...
    def search(self, who: str, rows: list[MRow], k: int) -> Seen: ...
    def lineage(self, who: str, row_id: str) -> Seen: ...
    def facts(self, who: str, subject: str, predicate: str, include_superseded: bool, listed: Seen) -> Seen:
        """The rows of one triple key `who` is served, by the profile's own filter where it has one;
        `listed` is `who`'s list of the same view, already fetched (to filter where the profile cannot)."""

    def ledger_status(self, ids: list[str]) -> dict[str, str]: ...
    def ledger_supersedes(self, ids: list[str]) -> dict[str, str | None]: ...
    def ledger_active_fact(self, subject: str, predicate: str, partition: str) -> str | None: ...
    def uid(self, who: str) -> str: ...


def ledger_partition(backend: Backend, row: MRow) -> str:
    """The ledger's name of `row`'s partition (sidecar/governance.py fact_partition), from the README's rule."""
    if row.scope == "agent":
        return f"agent:{backend.uid(row.owner)}"
    if row.scope == "fleet":
        return f"fleet:{backend.tenant}/{row.fleet}"  # type: ignore[attr-defined]
    if row.scope == "tenant":
        return "tenant"
    return f"restricted:{backend.uid(row.owner)}|{','.join(sorted(backend.uid(r) for r in row.readers))}"


def vector(n: int, dim: int = 8) -> list[float]:
    rnd = random.Random(n)
    v = [rnd.gauss(0, 1) for _ in range(dim)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


class ChromaBackend:
    """The Chroma v2 profile: one collection of a fresh tenant; ids chosen by the client."""

    name = "chroma"
    batch_delete = True
    foreign_view_statuses = frozenset({404})
    outsider_writes_elsewhere = False

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.tenant = ""
        self.collection = ""
        self.keys: dict[str, str] = {}
        self.https: dict[str, httpx.Client] = {}
        self.ledger: Any = None

    def open(self) -> None:
        t = self.stack.tenant("sm")
        self.tenant, self.collection = t.name, t.collection_id
        self.keys = {name: self.stack.key(t.name, fleet, name, trust) for name, (fleet, trust) in CAST.items()}
        self.keys[ADMIN] = t.admin_key
        self.keys[OUTSIDER] = self.stack.key(f"x{t.name}", "red", "a1", 3)
        self.https = {who: self.stack.http(key) for who, key in self.keys.items()}
        self.ledger = self.stack.ledger()

    def close(self) -> None:
        for h in self.https.values():
            h.close()
        if self.ledger is not None:
            self.ledger.close()

    def propose_id(self, n: int) -> str:
        return f"row-{n:04d}x"

    def ghost_id(self) -> str:
        return "row-9999x"

    def client(self, who: str) -> httpx.Client:
        return self.stack.http(self.keys[who])

    def uid(self, who: str) -> str:
        return f"{self.tenant}/{CAST[who][0]}/{who}"

    def _path(self, op: str) -> str:
        return f"/api/v2/tenants/{self.tenant}/databases/default_database/collections/{self.collection}/{op}"

    def write(self, who: str, row: MRow, http: httpx.Client | None = None) -> tuple[int, str | None]:
        meta: dict[str, str] = {"mw_scope": row.scope}
        if who in CAST and row.fleet != CAST[who][0]:
            meta["mw_fleet"] = row.fleet
        if row.scope == "restricted":
            meta["mw_readers"] = ",".join(f"{CAST[a][0]}/{a}" for a in sorted(row.readers))
        if row.parents:
            meta["mw_derived_from"] = ",".join(row.parents)
        if row.triple:
            meta.update(zip(("mw_subject", "mw_predicate", "mw_object"), row.triple))
        body = {"ids": [row.id], "embeddings": [row.vec], "documents": [row.text], "metadatas": [meta]}
        r = (http or self.https[who]).post(self._path("add"), json=body)
        return r.status_code, row.id if r.status_code == 200 else None

    def delete(self, who: str, ids: list[str]) -> tuple[int, int | None]:
        r = self.https[who].post(self._path("delete"), json={"ids": ids})
        return r.status_code, r.json().get("deleted") if r.status_code == 200 else None

    def _rows(self, r: httpx.Response) -> Seen:
        seen = Seen(r.status_code, raw=r.text)
        if r.status_code == 200:
            body = r.json()
            seen.ids = list(body["ids"])
            for i, doc, meta in zip(body["ids"], body.get("documents") or [], body.get("metadatas") or []):
                seen.texts[i] = doc
                seen.writers[i] = (meta or {}).get("mw_writer")
                seen.metas[i] = meta or {}
        return seen

    def listing(self, who: str, include_superseded: bool = False) -> Seen:
        q = "?include_superseded=true" if include_superseded else ""
        return self._rows(self.https[who].post(self._path("get") + q, json={}))

    def count(self, who: str) -> Seen:
        r = self.https[who].get(self._path("count"))
        return Seen(r.status_code, value=r.json() if r.status_code == 200 else None, raw=r.text)

    def get(self, who: str, ids: list[str]) -> Seen:
        return self._rows(self.https[who].post(self._path("get"), json={"ids": ids}))

    def search(self, who: str, rows: list[MRow], k: int) -> Seen:
        r = self.https[who].post(self._path("query"), json={"query_embeddings": [x.vec for x in rows], "n_results": k})
        seen = Seen(r.status_code, raw=r.text)
        if r.status_code == 200:
            body = r.json()
            seen.per_query = [list(ids) for ids in body["ids"]]
            for ids, docs in zip(body["ids"], body.get("documents") or []):
                seen.texts.update(zip(ids, docs or []))
        return seen

    def lineage(self, who: str, row_id: str) -> Seen:
        r = self.https[who].get(f"/_memwarden/memories/{row_id}/lineage", params={"collection": self.collection})
        return Seen(r.status_code, value=r.json(), raw=r.text)

    def facts(self, who: str, subject: str, predicate: str, include_superseded: bool, listed: Seen) -> Seen:
        q = "?include_superseded=true" if include_superseded else ""
        where = {"$and": [{"mw_subject": {"$eq": subject}}, {"mw_predicate": {"$eq": predicate}}]}
        return self._rows(self.https[who].post(self._path("get") + q, json={"where": where}))

    def ledger_status(self, ids: list[str]) -> dict[str, str]:
        return {i: r.status for i, r in self.ledger.get_rows("chroma", self.collection, ids).items()}

    def ledger_supersedes(self, ids: list[str]) -> dict[str, str | None]:
        rows = self.ledger.get_rows("chroma", self.collection, ids)
        return {i: (r.supersedes[1] if r.supersedes else None) for i, r in rows.items()}

    def ledger_active_fact(self, subject: str, predicate: str, partition: str) -> str | None:
        row = self.ledger.active_fact("chroma", self.tenant, subject, predicate, collection=self.collection, partition=partition)
        return None if row is None else row.row_id


class Mem0Backend:
    """The Mem0 OSS REST profile: one deployment shared by all tenants; ids assigned by Mem0; every
    memory of an example is written for one Mem0 ``user_id`` of the fresh tenant (infer=false)."""

    name = "mem0"
    batch_delete = False
    foreign_view_statuses = frozenset({200})
    outsider_writes_elsewhere = True
    deployment = "default"  # MEMWARDEN_MEM0_DEPLOYMENT of the fixture sidecar: the ledger collection

    def __init__(self, stack: Mem0Stack) -> None:
        self.stack = stack
        self.tenant = ""
        self.user = ""
        self.keys: dict[str, str] = {}
        self.https: dict[str, httpx.Client] = {}
        self.ledger: Any = None

    def open(self) -> None:
        w = self.stack.world([(fleet, name, trust) for name, (fleet, trust) in CAST.items()], prefix="sm")
        self.tenant, self.user = w.name, f"u-{uuid.uuid4().hex[:8]}"
        self.keys = {**w.keys, ADMIN: w.admin, OUTSIDER: self.stack.key(f"x{w.name}", "red", "a1", 3)}
        self.https = {who: self.stack.http(key) for who, key in self.keys.items()}
        self.ledger = SQLiteLedger(self.stack.ledger_path)

    def close(self) -> None:
        for h in self.https.values():
            h.close()
        if self.ledger is not None:
            self.ledger.close()

    def propose_id(self, n: int) -> str:
        return f"pending-{n}"  # replaced by Mem0's id on 200

    def ghost_id(self) -> str:
        return "00000000-0000-4000-8000-00000000dead"

    def client(self, who: str) -> httpx.Client:
        return self.stack.http(self.keys[who])

    def uid(self, who: str) -> str:
        return f"{self.tenant}/{CAST[who][0]}/{who}"

    def write(self, who: str, row: MRow, http: httpx.Client | None = None) -> tuple[int, str | None]:
        meta: dict[str, str] = {"mw_scope": row.scope}
        if who in CAST and row.fleet != CAST[who][0]:
            meta["mw_fleet"] = row.fleet
        if row.scope == "restricted":
            meta["mw_readers"] = ",".join(f"{CAST[a][0]}/{a}" for a in sorted(row.readers))
        if row.parents:
            meta["mw_derived_from"] = ",".join(row.parents)
        if row.triple:
            meta.update(zip(("mw_subject", "mw_predicate", "mw_object"), row.triple))
        body = {"messages": [{"role": "user", "content": row.text}], "user_id": self.user, "infer": False, "metadata": meta}
        r = (http or self.https[who]).post("/memories", json=body)
        if r.status_code != 200:
            return r.status_code, None
        results = r.json()["results"]
        assert len(results) == 1 and results[0]["event"] == "ADD", r.text
        return 200, str(results[0]["id"])

    def delete(self, who: str, ids: list[str]) -> tuple[int, int | None]:
        assert len(ids) == 1
        r = self.https[who].delete(f"/memories/{ids[0]}")
        return r.status_code, 1 if r.status_code == 200 else 0

    def _rows(self, r: httpx.Response) -> Seen:
        seen = Seen(r.status_code, raw=r.text)
        if r.status_code == 200:
            for m in r.json()["results"]:
                seen.ids.append(m["id"])
                seen.texts[m["id"]] = m.get("memory")
                seen.writers[m["id"]] = (m.get("metadata") or {}).get("mw_writer")
                seen.metas[m["id"]] = m.get("metadata") or {}
        return seen

    def listing(self, who: str, include_superseded: bool = False) -> Seen:
        params = {"user_id": self.user, "top_k": "1000", **({"include_superseded": "true"} if include_superseded else {})}
        return self._rows(self.https[who].get("/memories", params=params))

    def count(self, who: str) -> Seen | None:
        return None  # Mem0 has no count route

    def get(self, who: str, ids: list[str]) -> Seen:
        """One GET per id; status 200 when each answered 200 or 404 (not there for the caller)."""
        seen = Seen(200)
        raws = []
        for i in ids:
            r = self.https[who].get(f"/memories/{i}")
            raws.append(r.text)
            if r.status_code == 200:
                m = r.json()
                seen.ids.append(m["id"])
                seen.texts[m["id"]] = m.get("memory")
            elif r.status_code != 404:
                seen.status = r.status_code
        seen.raw = "\n".join(raws)
        return seen

    def search(self, who: str, rows: list[MRow], k: int) -> Seen:
        # Mem0 embeds the query itself: one search per probe text. With threshold 0 and top_k >= every row
        # each search returns every readable row, so one probe (the newest deleted text) is enough.
        seen = Seen(200)
        raws = []
        for row in rows[-1:]:
            r = self.https[who].post("/search", json={"query": row.text, "filters": {"user_id": self.user},
                                                      "threshold": 0.0, "top_k": k})
            raws.append(r.text)
            seen.status = r.status_code if r.status_code != 200 else seen.status
            if r.status_code == 200:
                ids = [m["id"] for m in r.json()["results"]]
                seen.per_query.append(ids)
                seen.texts.update((m["id"], m.get("memory")) for m in r.json()["results"])
        seen.raw = "\n".join(raws)
        return seen

    def lineage(self, who: str, row_id: str) -> Seen:
        r = self.https[who].get(f"/_memwarden/memories/{row_id}/lineage")
        return Seen(r.status_code, value=r.json(), raw=r.text)

    def facts(self, who: str, subject: str, predicate: str, include_superseded: bool, listed: Seen) -> Seen:
        # Mem0 filters cannot name mw_* keys (400): filter the listing by its returned metadata instead.
        keep = [i for i in listed.ids if listed.metas[i].get("mw_subject") == subject
                and listed.metas[i].get("mw_predicate") == predicate]
        return Seen(listed.status, ids=keep, raw=listed.raw)

    def ledger_status(self, ids: list[str]) -> dict[str, str]:
        return {i: r.status for i, r in self.ledger.get_rows("mem0", self.deployment, ids).items()}

    def ledger_supersedes(self, ids: list[str]) -> dict[str, str | None]:
        rows = self.ledger.get_rows("mem0", self.deployment, ids)
        return {i: (r.supersedes[1] if r.supersedes else None) for i, r in rows.items()}

    def ledger_active_fact(self, subject: str, predicate: str, partition: str) -> str | None:
        row = self.ledger.active_fact("mem0", self.tenant, subject, predicate, collection=self.deployment, partition=partition)
        return None if row is None else row.row_id


# ---- the machine --------------------------------------------------------------------------------------------

@dataclass
class View:
    """Everything one principal sees after a step."""

    listing: Seen
    history: Seen  # list with include_superseded=true
    count: Seen | None  # None: the profile has no count route
    search: Seen | None  # None before the first row
    deleted_get: Seen | None
    lineages: dict[str, Seen]

    def all(self) -> Iterator[Seen]:
        yield from (self.listing, self.history)
        if self.count is not None:
            yield self.count
        if self.search is not None:
            yield self.search
        if self.deleted_get is not None:
            yield self.deleted_get
        yield from self.lineages.values()


class MemoryMachine(RuleBasedStateMachine):
    """Subclasses set `make_backend` (a zero-argument callable returning a `Backend`)."""

    make_backend: Any = None
    # what the run exercised, over all examples (checked by `run_machine`: the machine is not degenerate)
    events: Counter[str] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.backend: Backend = type(self).make_backend()
        self.backend.open()
        self.n = 0
        self.salt = uuid.uuid4().hex[:6]
        self._views: dict[str, View] | None = None
        self.pool = ThreadPoolExecutor(max_workers=len(PRINCIPALS))

    def teardown(self) -> None:
        self.pool.shutdown(wait=True)
        self.backend.close()

    # -- helpers ------------------------------------------------------------------------------
    def _new_row(self, who: str, scope: str, *, readers: frozenset[str] = frozenset(), rehome: bool = False,
                 parents: tuple[str, ...] = (), triple: tuple[str, str, str] | None = None,
                 text: str | None = None, token: str | None = None) -> MRow:
        self.n += 1
        home = CAST[who][0] if who in CAST else "red"
        token = token or f"tok{self.n:04d}q{self.salt}"
        return MRow(
            id=self.backend.propose_id(self.n), text=text or f"memory {token} from {who}", token=token,
            vec=vector(self.n), owner=who, fleet=OTHER_FLEET[home] if rehome else home, scope=scope,
            readers=readers if scope == "restricted" else frozenset(), parents=parents, triple=triple,
        )

    def _write(self, kind: str, who: str, row: MRow) -> None:
        if who == OUTSIDER and self.backend.outsider_writes_elsewhere:
            self.events["outsider-write:skipped"] += 1
            return
        self._views = None
        expected = self.model.write_outcomes(who, row)
        status, new_id = self.backend.write(who, row)
        assert status in expected, f"{who} writing {row}: got {status}, model allows {sorted(expected)}"
        self.events[f"{kind}:{status}"] += 1
        if row.single_valued and status == 200 and self.model.active_fact(row.fact, row.partition) is not None:  # type: ignore[arg-type]
            self.events["triple:supersedes"] += 1
        if status == 200:
            assert new_id is not None
            row.id = new_id
            self.model.add(row)

    # Draws never depend on the model's state: a burst's outcome (which concurrent write lands first)
    # differs between runs of one example, and Hypothesis needs the same draws to replay and shrink it.
    # So every choice among rows or principals is a fixed-shape draw (a flag and an index) applied to
    # whatever the model holds at that step, in write order (ids may be the backend's random ones).
    @staticmethod
    def _pick(data: st.DataObject, preferred: list[str], fallback: list[str]) -> str:
        """An element of `preferred` (two times in three, when it is not empty), else of `fallback`;
        counted from the end, so the newest rows (and small, simple draws) come first."""
        prefer, index = data.draw(st.sampled_from((True, True, False))), data.draw(st.integers(0, 255))
        pool = preferred if prefer and preferred else fallback
        return pool[-1 - index % len(pool)]

    def _ids(self, data: st.DataObject, *, ghost: bool = True, max_size: int = 2) -> list[str]:
        """1 to `max_size` ids of written rows, live ones more likely; deleted ones and (with `ghost`)
        an id that never existed are possible."""
        live = [i for i, r in self.model.rows.items() if r.live]
        every = list(self.model.rows) + ([self.backend.ghost_id()] if ghost else [])
        n = data.draw(st.integers(1, max_size))
        return list(dict.fromkeys(self._pick(data, live, every) for _ in range(n)))

    # -- rules ----------------------------------------------------------------------------------
    @initialize()
    def seed_world(self) -> None:
        """Every example starts with a1's private note and a tenant-wide row derived from it, so that
        short examples also meet redacted lineage and deletion closure."""
        note = self._new_row("a1", "agent")
        self._write("write", "a1", note)
        self._write("derived", "a1", self._new_row("a1", "tenant", parents=(note.id,)))

    # Choices lean towards the principals that make a step interesting (a parent's or a fact's owner, a
    # row's owner for a delete) so that successes are as common as refusals; any principal stays possible.
    def _principal(self, data: st.DataObject, *hints: str, writers: bool = True) -> str:
        anyone = data.draw(WRITERS if writers else st.sampled_from(PRINCIPALS))
        return self._pick(data, list(hints), [anyone])

    @rule(data=st.data(), scope=st.sampled_from(SCOPES), readers=st.frozensets(st.sampled_from(AGENTS), max_size=2),
          rehome=st.sampled_from((False, False, False, True)))
    def write(self, data: st.DataObject, scope: str, readers: frozenset[str], rehome: bool) -> None:
        who = self._principal(data)
        self._write("write", who, self._new_row(who, scope, readers=readers, rehome=rehome))

    @precondition(lambda self: self.model.rows)
    @rule(scope=st.sampled_from(SCOPES), data=st.data())
    def derived_write(self, scope: str, data: st.DataObject) -> None:
        parents = tuple(self._ids(data))
        who = self._principal(data, *(self.model.rows[p].owner for p in parents if p in self.model.rows))
        self._write("derived", who, self._new_row(who, scope, parents=parents))

    @precondition(lambda self: self.model.rows)
    @rule(scope=st.sampled_from(SCOPES), variant=st.sampled_from(("same", "upper", "spaced", "marked")), data=st.data())
    def copy_write(self, scope: str, variant: str, data: st.DataObject) -> None:
        deleted = [i for i, r in self.model.rows.items() if r.status == "deleted"]
        source = self.model.rows[self._pick(data, deleted, list(self.model.rows))]
        who = self._principal(data, source.owner)
        text = {"same": source.text, "upper": source.text.upper(),
                "spaced": "  " + source.text.replace(" ", "   ") + "\t",
                "marked": "\u200b" + source.text + "."}[variant]
        self._write("copy" if source.live else "copy-of-deleted", who, self._new_row(who, scope, text=text, token=source.token))

    @rule(scope=st.sampled_from(("fleet", "tenant", "agent")), subject=st.sampled_from(SUBJECTS),
          predicate=st.sampled_from(PREDICATES), obj=st.sampled_from(("up", "down", "paused")),
          data=st.data(), derived=st.sampled_from((False, False, True)))
    def triple_write(self, scope: str, subject: str, predicate: str, obj: str, data: st.DataObject,
                     derived: bool) -> None:
        current = self.model.active_fact((subject, predicate))
        who = self._principal(data, *([current.owner] if current is not None else []))
        parents = tuple(self._ids(data, ghost=False, max_size=1)) if self.model.rows else ()
        parents = parents if derived else ()
        self._write("triple", who, self._new_row(who, scope, parents=parents, triple=(subject, predicate, obj)))

    @rule(subject=st.sampled_from(SUBJECTS), predicate=st.sampled_from(SV_PREDICATES), data=st.data())
    def burst(self, subject: str, predicate: str, data: st.DataObject) -> None:
        """Contradicting tenant-wide facts written at once (one partition). Each write that succeeds must
        have replaced a fact its writer may supersede (README), in some order of the successful writes;
        each 403 must be explained by a fact that was current at some point in that order or by the trust
        ladder."""
        self._views = None
        fact = (subject, predicate)
        before = self.model.active_fact(fact, ("tenant",))
        # each writer: the current fact's owner (when drawn so and there is one) or any agent
        drawn = data.draw(st.lists(st.tuples(st.booleans(), st.sampled_from(AGENTS)), min_size=3, max_size=6))
        writers = [before.owner if owner and before is not None else agent for owner, agent in drawn]
        rows = [self._new_row(w, "tenant", triple=(subject, predicate, f"v{i}")) for i, w in enumerate(writers)]
        barrier = threading.Barrier(len(rows))

        def go(i: int) -> tuple[int, str | None]:
            with self.backend.client(writers[i]) as http:
                barrier.wait(timeout=30)
                return self.backend.write(writers[i], rows[i], http)

        with ThreadPoolExecutor(max_workers=len(rows)) as pool:
            results = list(pool.map(go, range(len(rows))))
        won: list[MRow] = []
        for row, (status, new_id) in zip(rows, results):
            assert status in (200, 403), f"burst write by {row.owner}: status {status}"
            if status == 200:
                assert new_id is not None
                row.id = new_id
                won.append(row)
        # the order in which the successful writes superseded each other, from the ledger
        supersedes = self.backend.ledger_supersedes([r.id for r in won])
        by_id = {r.id: r for r in won}
        order: list[MRow] = []
        current = before.id if before is not None else None
        remaining = dict(by_id)
        while remaining:
            nxt = [r for r in remaining.values() if supersedes.get(r.id) == current]
            assert len(nxt) == 1, (f"burst on {fact}: successful writes do not form one supersession chain from "
                                   f"{current}: {supersedes}")
            order.append(nxt[0])
            current = nxt[0].id
            del remaining[current]
        chain = ([before] if before is not None else []) + order
        for old, new in zip(chain, chain[1:]):
            assert may_supersede(new.owner, old), (
                f"burst on {fact}: {new.owner}'s {new.id} superseded {old.owner}'s {old.id}, which {new.owner} may "
                f"not supersede (writers {writers}, statuses {[s for s, _ in results]})")
        for row, (status, _) in zip(rows, results):
            if status == 403:
                assert not may_write(row.owner, row.fleet) or any(not may_supersede(row.owner, f) for f in chain), (
                    f"burst on {fact}: {row.owner} refused although it may supersede every fact current in the burst")
        for row in order:
            self.model.add(row)
        self.events[f"burst:{len(order)}-won"] += 1
        self.events["burst:refused" if len(order) < len(rows) else "burst:all-won"] += 1

    @precondition(lambda self: self.model.rows)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        self._views = None
        # a live row with live derived rows first: its deletion must close over them
        parents = list(dict.fromkeys(p for r in self.model.rows.values() if r.live for p in r.parents
                                     if p in self.model.rows and self.model.rows[p].live))
        some = self._ids(data)
        one_parent, index = data.draw(st.sampled_from((True, True, False))), data.draw(st.integers(0, 255))
        ids = [parents[-1 - index % len(parents)]] if one_parent and parents else some
        who = self._principal(data, *(self.model.rows[i].owner for i in ids if i in self.model.rows), ADMIN,
                              writers=False)
        if not self.backend.batch_delete:
            ids = ids[:1]
        before = {i: r.status for i, r in self.model.rows.items()}
        row = self.model.rows.get(ids[0])
        status, deleted = self.backend.delete(who, ids)
        where = f"{who} deleting {ids} (statuses {[before.get(i) for i in ids]})"
        if who == OUTSIDER:
            assert status in (403, 404) and not deleted, f"outsider delete: {status}"
            return
        if self.backend.batch_delete:
            # README "One rule on every backend": a delete by ids is all-or-nothing, as a write; a named live
            # row the caller may read but not delete makes it 403 and nothing is deleted.
            blocked = [i for i in ids if i in self.model.rows and self.model.rows[i].live
                       and may_read(who, self.model.rows[i]) and not may_change(who, self.model.rows[i])]
            if blocked:
                self.events["delete:refused"] += 1
                assert status == 403 and deleted is None, f"{where}: {status} ({blocked} not deletable)"
                return
        direct, gone = self.model.delete(who, ids)
        self.events["delete:none" if not direct else "delete:closure" if len(gone) > len(direct) else "delete:rows"] += 1
        if self.backend.batch_delete:
            assert status == 200, f"{where}: {status}"
        elif direct:
            assert status == 200, f"{where}: {status}"
        else:  # Mem0: 403 where the caller may read the row, else the 404 of a missing id
            readable = row is not None and row.live and may_read(who, row)
            assert status == (403 if readable else 404), f"{where}: {status}"
        assert deleted == len(direct), f"{where}: sidecar says {deleted} deleted, model {direct}"

    @precondition(lambda self: self.model.rows)
    @rule(who=st.sampled_from(PRINCIPALS), data=st.data())
    def read(self, who: str, data: st.DataObject) -> None:
        ids = self._ids(data, max_size=3)
        seen = self.backend.get(who, ids)
        if who == OUTSIDER:
            assert seen.status in self.backend.foreign_view_statuses and not seen.ids, f"outsider get {ids}: {seen.raw[:300]}"
            return
        assert seen.status == 200, f"{who} get {ids}: {seen.raw[:300]}"
        expected = {i for i in ids if i in self.model.rows and self.model.rows[i].status == "active"
                    and may_read(who, self.model.rows[i])}
        assert set(seen.ids) == expected, f"{who} get {ids}: got {seen.ids}, model {sorted(expected)}"

    # -- observation (one parallel sweep per step, shared by the invariants) -------------------
    def _observe(self, who: str) -> View:
        rows = list(self.model.rows.values())
        deleted = [r for r in rows if r.status == "deleted"]
        probes = deleted or rows[:1]
        k = max(len(rows), 1)
        search = self.backend.search(who, probes, k) if probes else None
        lineages = {r.id: self.backend.lineage(who, r.id) for r in rows if r.parents or r.status == "deleted"}
        return View(
            listing=self.backend.listing(who), history=self.backend.listing(who, include_superseded=True),
            count=self.backend.count(who), search=search,
            deleted_get=self.backend.get(who, [r.id for r in deleted]) if deleted else None,
            lineages=lineages,
        )

    def views(self) -> dict[str, View]:
        if self._views is None:
            self._views = dict(zip(PRINCIPALS, self.pool.map(self._observe, PRINCIPALS)))
        return self._views

    # -- invariants -------------------------------------------------------------------------------
    @invariant()
    def inv1_every_principal_sees_exactly_its_readable_rows(self) -> None:
        for who, view in self.views().items():
            if who == OUTSIDER:  # sees nothing of this tenant, on every path
                for seen in (view.listing, view.history, view.count, view.search):
                    if seen is not None:
                        assert seen.status in self.backend.foreign_view_statuses, f"outsider: {seen.status} {seen.raw[:300]}"
                        assert not seen.ids and not any(seen.per_query) and not seen.value, f"outsider: {seen.raw[:300]}"
                continue
            active, servable = self.model.visible(who), self.model.visible(who, include_superseded=True)
            assert view.listing.status == 200, view.listing.raw[:300]
            assert sorted(view.listing.ids) == sorted(active), (
                f"{who} list: leaked {sorted(set(view.listing.ids) - active)}, missed {sorted(active - set(view.listing.ids))}")
            assert sorted(view.history.ids) == sorted(servable), (
                f"{who} list ?include_superseded: leaked {sorted(set(view.history.ids) - servable)}, "
                f"missed {sorted(servable - set(view.history.ids))}")
            if view.count is not None:
                assert view.count.status == 200 and view.count.value == len(active), (
                    f"{who} count {view.count.raw[:200]}, model {len(active)}")
            for i in view.search.per_query if view.search is not None else []:
                assert set(i) == active, f"{who} search: leaked {sorted(set(i) - active)}, missed {sorted(active - set(i))}"
            for seen in (view.listing, view.history):
                for row_id, text in seen.texts.items():
                    row = self.model.rows[row_id]
                    assert text == row.text and seen.writers[row_id] == self.backend.uid(row.owner), (row_id, text)

    @invariant()
    def inv2_deleted_rows_never_come_back(self) -> None:
        deleted = [r for r in self.model.rows.values() if r.status == "deleted"]
        if not deleted:
            return
        for who, view in self.views().items():
            # a token may still appear through a live copy the principal may read (README: only the copies
            # the deleter may delete are deleted with it)
            allowed_tokens = {r.token for r in self.model.rows.values() if r.live and may_read(who, r)}
            tokens = {r.token for r in deleted} - allowed_tokens
            assert view.deleted_get is not None
            assert view.deleted_get.ids == [], f"{who} get by deleted ids: {view.deleted_get.ids}"
            for r in deleted:
                seen = view.lineages[r.id]
                assert seen.status == 404, f"{who} lineage of deleted {r.id}: {seen.status} {seen.raw[:300]}"
                assert who == OUTSIDER or seen.value == {"error": "not_found", "message": "memory not found"}, (
                    f"{who} lineage of deleted {r.id}: {seen.status} {seen.raw[:300]}")
            for seen in view.all():
                raw = seen.raw.casefold()
                for r in deleted:
                    assert r.id.casefold() not in raw, f"{who}: deleted id {r.id} in {seen.raw[:500]}"
                for token in tokens:
                    assert token not in raw, f"{who}: deleted text {token} in {seen.raw[:500]}"

    @invariant()
    def inv2b_no_principal_sees_an_id_or_text_it_may_not_read(self) -> None:
        """Beyond deletion: lineage shows unreadable ancestors without ids, supersession links and
        ``mw_derived_from`` name readable rows only (README) — so no response to a principal carries the
        id or text of a row it may not read, unless the text is also a row's it may read (a copy)."""
        for who, view in self.views().items():
            readable = {i for i, r in self.model.rows.items() if r.live and may_read(who, r)}
            hidden = [r for i, r in self.model.rows.items() if i not in readable]
            tokens = {r.token for r in hidden} - {self.model.rows[i].token for i in readable}
            for seen in view.all():
                raw = seen.raw.casefold()
                for r in hidden:
                    assert r.id.casefold() not in raw, f"{who}: id of {r.status} {r.scope} row {r.id} in {seen.raw[:500]}"
                for token in tokens:
                    assert token not in raw, f"{who}: text {token} of a row it may not read in {seen.raw[:500]}"

    @invariant()
    def inv3_one_active_row_per_single_valued_fact(self) -> None:
        facts = {r.fact for r in self.model.rows.values() if r.fact is not None}
        for subject, predicate in sorted(f for f in facts if f is not None):
            mine = [r for r in self.model.rows.values() if r.fact == (subject, predicate)]
            live = {r.id for r in mine if r.live}
            active = {r.id for r in mine if r.status == "active"}
            if predicate in SINGLE_VALUED:
                # per partition: exactly one active row unless its current fact itself was deleted (then none:
                # a deletion does not bring back the fact it had replaced)
                for part in {r.partition: r for r in mine}.values():
                    same = {r.id for r in mine if r.partition == part.partition and r.status == "active"}
                    assert len(same) <= 1
                    model_active = next(iter(same), None)
                    name = ledger_partition(self.backend, part)
                    got = self.backend.ledger_active_fact(subject, predicate, name)
                    assert got == model_active, f"ledger active fact for {(subject, predicate)} in {name} is {got}, model {model_active}"
            admin = self.views()[ADMIN]
            now = self.backend.facts(ADMIN, subject, predicate, False, admin.listing)
            history = self.backend.facts(ADMIN, subject, predicate, True, admin.history)
            assert sorted(now.ids) == sorted(active), f"{(subject, predicate)}: active {now.ids}, model {sorted(active)}"
            assert sorted(history.ids) == sorted(live), (
                f"{(subject, predicate)} with include_superseded: {history.ids}, model {sorted(live)}")

    @invariant()
    def inv4_lineage_is_complete_and_redacts_unreadable_ancestors(self) -> None:
        for who, view in self.views().items():
            for row_id, seen in view.lineages.items():
                row = self.model.rows[row_id]
                if who == OUTSIDER:  # another tenant's collection: 404 (README), never anything of the row
                    assert seen.status == 404 and row_id not in seen.raw, f"outsider lineage of {row_id}: {seen.raw[:300]}"
                    continue
                if row.status != "active" or not may_read(who, row):
                    assert (seen.status, seen.value) == (404, {"error": "not_found", "message": "memory not found"}), (
                        f"{who} lineage of {row_id} ({row.status}, unreadable or not active): {seen.status} {seen.raw[:300]}")
                    continue
                assert seen.status == 200, f"{who} lineage of {row_id}: {seen.status} {seen.raw[:300]}"
                self._check_lineage(who, row_id, seen)
                self.events["lineage:redacted" if "redacted" in seen.raw else "lineage:complete"] += 1

    def _check_lineage(self, who: str, row_id: str, seen: Seen) -> None:
        body = seen.value
        walk = self.model.ancestors(row_id)
        depth = dict(walk)
        shown = {i for i, _ in walk if self.model.rows[i].live and may_read(who, self.model.rows[i])}
        nodes = body["nodes"]
        where = f"{who} lineage of {row_id}: {seen.raw[:800]}"
        assert body["memory"] == row_id and body["truncated"] is False, where
        assert len(nodes) == len(walk), where
        assert [n["node"] for n in nodes] == list(range(len(nodes))), where
        by_id = {n["id"]: n for n in nodes if "id" in n}
        assert set(by_id) == shown, f"{where}\nshown {sorted(by_id)}, model {sorted(shown)}"
        for n in nodes:
            if "id" not in n:
                assert set(n) == {"node", "depth", "redacted", "parents"} and n["redacted"] is True, where
        for i in shown:
            n, r = by_id[i], self.model.rows[i]
            assert n["writer"] == self.backend.uid(r.owner) and n["status"] == r.status and n["depth"] == depth[i], where
            parents = [nodes[p] for p in n["parents"]]
            assert len(parents) == len(r.parents), where
            assert {p["id"] for p in parents if "id" in p} == set(r.parents) & shown, where
        for i, _ in walk:
            if i not in shown:
                assert i.casefold() not in seen.raw.casefold(), f"{where}\nunreadable ancestor {i} named"

    @invariant()
    def inv5_ledger_row_states_equal_the_model(self) -> None:
        ids = list(self.model.rows)
        if ids:
            got = self.backend.ledger_status(ids)
            want = {i: r.status for i, r in self.model.rows.items()}
            assert got == want, f"ledger {got}\nmodel {want}"


# ---- running it -------------------------------------------------------------------------------------------

def machine_settings(examples: int, steps: int) -> settings:
    return settings(
        max_examples=int(os.environ.get("MW_STATEFUL_EXAMPLES") or examples),
        stateful_step_count=int(os.environ.get("MW_STATEFUL_STEPS") or steps),
        deadline=None, derandomize=False, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


# What every full-budget run must have exercised (a degeneracy guard). Only broad outcomes: Hypothesis
# skews whole runs towards some choices, so a single event (say write:403) can be absent from a healthy run.
# The full event counts are printed (pytest -s, or with a failure).
MUST_SEE: dict[str, tuple[str, ...]] = {
    "a successful write": ("write:200", "derived:200", "copy:200", "triple:200"),
    "a refused write": ("write:403", "derived:403", "copy:403", "copy-of-deleted:403", "copy-of-deleted:409",
                        "triple:403"),
    "a superseded fact": ("triple:supersedes", "burst:2-won", "burst:3-won", "burst:4-won", "burst:5-won",
                          "burst:6-won"),
    "a delete": ("delete:rows", "delete:closure"),
    "a complete lineage": ("lineage:complete",),
}


def run_machine(machine: type[MemoryMachine], examples: int, steps: int) -> None:
    """Run `machine` under a seed printed up front (pytest shows it with a failure) and taken from
    ``MW_STATEFUL_SEED`` when set, so any run can be repeated."""
    chosen = os.environ.get("MW_STATEFUL_SEED")
    run_seed = int(chosen) if chosen else random.getrandbits(64)
    print(f"{machine.__name__}: seed {run_seed} (rerun with MW_STATEFUL_SEED={run_seed})")
    machine.events = Counter()
    test = get_state_machine_test(machine, settings=machine_settings(examples, steps))
    try:
        seed(run_seed)(test)()
    except BaseException as exc:
        exc.add_note(f"{machine.__name__}: seed {run_seed} (rerun with MW_STATEFUL_SEED={run_seed})")
        raise
    print(f"{machine.__name__}: {sorted(machine.events.items())}")
    if not os.environ.get("MW_STATEFUL_EXAMPLES") and not os.environ.get("MW_STATEFUL_STEPS"):
        missing = [what for what, events in MUST_SEE.items() if not any(machine.events[e] for e in events)]
        assert not missing, f"the run never exercised {missing}: {sorted(machine.events.items())}"


def test_chroma_memory_machine(stack: Stack) -> None:
    class ChromaMachine(MemoryMachine):
        make_backend = staticmethod(lambda: ChromaBackend(stack))

    run_machine(ChromaMachine, examples=25, steps=30)


def test_mem0_memory_machine(mem0_stack: Mem0Stack) -> None:
    class Mem0Machine(MemoryMachine):
        make_backend = staticmethod(lambda: Mem0Backend(mem0_stack))

    run_machine(Mem0Machine, examples=10, steps=30)
