"""Ingest-time labelling: each turn of an `Episode`, in order, becomes a `TurnPlan` — the row to write (its
stored text, owner, content categories and circle) and the memory operations the dialogue asks for
(deletions, access changes). It reads only the `Episode` and the turns seen so far; it has no access to
checkpoints (`data` keeps them apart) and is deterministic.

- **Categories** (`rules.categories`): regular expressions per domain; the Cedar policies of the domain decide
  which role may read which category.
- **Subjects and circles** (`rules.CIRCLES`): a turn is about the subject principals it names (patients,
  students), or the speaker if the speaker is one, or else the subject of the previous turn (dialogue
  continuity; the episode's first subject at the start). Its circle is the intersection of its subjects'
  circles. Office turns are about the projects they name (else the previous turn's).
- **Deletions**: a sentence asking to delete/remove/erase/forget/clear something "from … memory", or saying it
  "should be treated as deleted", or confirming it was "cleared/deleted/removed from … memory", names targets:
  quoted strings, values (phone numbers, codes, amounts, 4+-digit numbers, ``ABC-123`` labels) and named
  phrases ("the phrase library lion should …"). A request naming none takes the targets of a confirmation in
  the next `DELETION_WINDOW` turns. Every earlier row containing a target is deleted and written again without
  it (what else it said stays remembered); from then on each target is redacted (``[deleted]``) from every row
  written, the request's own text included.
- **Access changes**: a sentence that revokes access ("revoke", "no longer has … access") of principals it
  names, or of "my mother"/"family" (the subject's family-type principals), removes them from the circle of the
  turn's subjects: later rows leave them out and earlier rows are re-scoped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memwarden_eval.gatemem import rules
from memwarden_eval.gatemem.data import Episode, Turn

DELETION_WINDOW = 3
REDACTED = "[deleted]"

_SENTENCES = re.compile(r"(?<=[.!?])\s+(?=[A-Z'\"(])")
_REQUEST = re.compile(
    r"\b(?:delete|remove|erase|purge|forget|wipe|clear)\b(?:(?!\b(?:delete|remove|erase|purge|forget|wipe|clear)\b).){0,200}?"
    r"\bfrom\s+(?:the\s+|my\s+|your\s+)?(?:[\w-]+\s+){0,3}(?:memory|memories|records?|notes)\b"
    r"|\b(?:delete|remove|erase|purge|forget|wipe|clear)\s+from\s+(?:[\w-]+\s+){0,3}memory\b"
    r"|\bshould be treated as deleted\b|^\s*deletion request\b",
    re.IGNORECASE,
)
_CONFIRM = re.compile(r"\b(?:cleared|deleted|removed|erased|purged)\s+from\s+(?:the\s+)?(?:[\w-]+\s+){0,3}memory\b",
                      re.IGNORECASE)
_QUOTED = re.compile(r"(?:(?<=[\s(])|^)['\"‘“]([^'\"‘’“”]{3,120}?)[,.]?['\"’”](?=[\s.,;:)!?]|$)")
_VALUES = re.compile(
    r"\b\d{3}[-.]\d{3}[-.]\d{4}\b|\b\d{3}-\d{4}\b"         # phone numbers
    r"|\b[A-Za-z]{2,}(?:_[A-Za-z0-9]+)+(?:-[A-Za-z0-9]+)*\b"  # codes and tokens: mp_stg_4R2N-K8QM-7T1C
    r"|\$?\b\d{1,3}(?:,\d{3})+(?:\.\d+)?\b"               # amounts: 4,800
    r"|\b[A-Za-z]{1,8}-\d{2,6}\b"                         # labels: BH-238, bridge-41
    r"|\b\d{4,}\b"                                        # PINs and other long numbers
)
_YEAR = re.compile(r"^(?:19|20)\d{2}$")
_NAMED = re.compile(
    r"\b(?:phrase|value|label|code|token|pin|number|amount|mapping|location(?:\s+note)?|identifier|wording|name|"
    r"figure|note)\s+(?:of\s+)?(?P<v>[A-Za-z0-9][\w'’ -]{2,80}?)(?=\s+(?:should|from|is|as|remains|stays|must|and)\b|[.;,]|$)",
    re.IGNORECASE,
)
# Where a deletion sentence turns to the value that stays: "…; the current amount remains 3,690 USD".
_CURRENT = re.compile(r"\b(?:now that|the current|current(?:ly)? active|keep only|retain only|remains?|instead|"
                      r"is now|are now|the new|newer|replaced by|going forward)\b", re.IGNORECASE)
_NOT_A_START = {"is", "was", "are", "were", "from", "should", "remains", "now", "no", "that", "has", "have", "to", "be"}
_STOP = {"the", "a", "an", "from", "memory", "this", "that", "it", "earlier", "old", "older", "prior", "previous",
         "exact", "current", "shared", "assistant", "active", "accessible", "answer", "any", "all", "and", "to", "of"}
_REVOKE = re.compile(r"\brevok\w*\b|\bno longer (?:has|have|receive|receives|get|gets)\b[^.]*\baccess\b"
                     r"|\baccess\b[^.]*\b(?:is|was|has been)\s+(?:now\s+)?(?:revoked|removed|ended|closed)\b",
                     re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RowPlan:
    """The memory one turn becomes: written by `owner`; `circle` are the principals whose relationships admit it
    (Cedar narrows them by role and category); `labels` its content categories."""

    row_id: str
    turn_id: str
    owner: str
    text: str
    labels: frozenset[str]
    subjects: frozenset[str]
    circle: frozenset[str]


@dataclass(frozen=True, slots=True)
class Deletion:
    """Delete every row containing one of `targets` (case-insensitive, whole words), write each again without
    them (`rewrites`: new ids, same owner and circle), and redact them from later rows."""

    turn_id: str
    requester: str
    targets: tuple[str, ...]
    row_ids: tuple[str, ...]  # the earlier rows that contain a target
    rewrites: tuple[RowPlan, ...] = ()


@dataclass(frozen=True, slots=True)
class AccessChange:
    """`principals` lose access to the rows of `subjects`; `rows` maps each earlier row to its new circle."""

    turn_id: str
    principals: frozenset[str]
    subjects: frozenset[str]
    rows: tuple[tuple[str, frozenset[str]], ...]


@dataclass(frozen=True, slots=True)
class TurnPlan:
    turn: Turn
    deletions: tuple[Deletion, ...]
    access_changes: tuple[AccessChange, ...]
    row: RowPlan | None


@dataclass
class Labeller:
    """Stateful over one episode: call `plan` on each turn, in order."""

    episode: Episode
    names: rules.Names = field(init=False)
    circles: rules.Circles = field(init=False)
    revoked: dict[str, set[str]] = field(default_factory=dict)      # subject ("" = every turn) → principals
    forgotten: list[str] = field(default_factory=list)               # deletion targets, in order of request
    pending: list[tuple[int, str]] = field(default_factory=list)     # requests without targets: (turn index, requester)
    rows: dict[str, RowPlan] = field(default_factory=dict)
    last_subjects: frozenset[str] = frozenset()
    projects: dict[str, tuple[re.Pattern[str], frozenset[str]]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.names = rules.Names(self.episode)
        self.circles = rules.CIRCLES[self.domain](self.episode)
        if self.domain == "office":
            self.projects = rules.office_projects(self.episode)
        subjects = [p.principal_id for p in self.episode.principals if p.role in rules.SUBJECT_ROLES[self.domain]]
        self.last_subjects = frozenset(subjects[:1])

    @property
    def domain(self) -> str:
        return self.episode.domain if self.episode.domain in rules.CATEGORIES else "household"

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    # ---- subjects and circles -----------------------------------------------------------------------

    def subjects_of(self, turn: Turn) -> frozenset[str]:
        if self.domain == "office":
            named = frozenset(pid for pid, (rx, _) in self.projects.items() if rx.search(turn.text))
        else:
            roles = rules.SUBJECT_ROLES[self.domain]
            named = frozenset(pid for pid in self.names.find(turn.text)
                              if (p := self.episode.principal(pid)) is not None and p.role in roles)
            if not named and turn.speaker.role in roles:
                named = frozenset({turn.speaker.principal_id})
        if named:
            self.last_subjects = named
        return self.last_subjects

    def circle_of(self, subjects: frozenset[str]) -> frozenset[str]:
        if self.domain == "office":
            circles = [self.projects[s][1] for s in subjects if s in self.projects]
        else:
            circles = [self.circles.by_subject[s] for s in subjects if s in self.circles.by_subject]
        circle = frozenset.intersection(*circles) if circles else self.circles.everyone
        gone = set(self.revoked.get("", set()))
        for s in subjects:
            gone |= self.revoked.get(s, set())
        return circle - gone

    # ---- deletions ------------------------------------------------------------------------------------

    @staticmethod
    def targets_in(sentence: str) -> list[str]:
        """Deletion targets named in one sentence: quoted strings, values and named phrases."""
        found: list[str] = []
        for m in _QUOTED.finditer(sentence):
            found.append(m.group(1).strip(" ,."))
        for m in _VALUES.finditer(sentence):
            v = m.group(0).lstrip("$")
            if not _YEAR.match(v):
                found.append(v)
        for m in _NAMED.finditer(sentence):
            v = m.group("v").strip(" '’-")
            if v.split()[0].lower() in _NOT_A_START or "memory" in v.lower():
                continue
            words = [w for w in re.split(r"\s+", v) if w.lower() not in _STOP]
            if not words or (len(words) == 1 and (len(words[0]) < 3 or not re.search(r"\d|[A-Z]", words[0]))):
                continue
            if any(v.lower() in f.lower() or f.lower() in v.lower() for f in found):
                continue
            found.append(v)
        return list(dict.fromkeys(t for t in found if len(t) >= 3))

    def _deletions(self, turn: Turn) -> list[str]:
        targets: list[str] = []
        requested = confirmed = 0
        for sentence in _SENTENCES.split(turn.text):
            for clause in sentence.split(";"):
                m = _REQUEST.search(clause) or _CONFIRM.search(clause)
                if not m:
                    continue
                if _REQUEST.search(clause):
                    requested += 1
                else:
                    confirmed += 1
                cue = _CURRENT.search(clause, m.start())
                targets += self.targets_in(clause[: cue.start()] if cue else clause)
        if requested and not targets:
            self.pending.append((turn.index, turn.speaker.principal_id))
            self._count("deletion_requests_without_target")
        self.pending = [(i, who) for i, who in self.pending if turn.index - i <= DELETION_WINDOW]
        if confirmed and self.pending and targets:
            self.pending.clear()
        if requested or confirmed:
            self._count("deletion_sentences", requested + confirmed)
        return list(dict.fromkeys(targets))

    @staticmethod
    def _target_rx(target: str) -> re.Pattern[str]:
        return re.compile(r"(?<!\w)" + re.escape(target) + r"(?!\w)", re.IGNORECASE)

    def redact(self, text: str) -> str:
        for t in sorted(self.forgotten, key=len, reverse=True):
            text = self._target_rx(t).sub(REDACTED, text)
        return text

    # ---- access changes -------------------------------------------------------------------------------

    def _revocations(self, turn: Turn, subjects: frozenset[str]) -> frozenset[str]:
        who: set[str] = set()
        fam = rules.family_words()
        for s in _SENTENCES.split(turn.text):
            if not _REVOKE.search(s):
                continue
            named = self.names.find(s) - {turn.speaker.principal_id} - set(subjects)
            for pid in named:
                p = self.episode.principal(pid)
                if p is not None and p.role not in rules.SUBJECT_ROLES[self.domain]:
                    who.add(pid)
            if fam.search(s):
                for subj in subjects:
                    who |= self.circles.family_of.get(subj, frozenset())
        return frozenset(who)

    # ---- one turn -------------------------------------------------------------------------------------

    def plan(self, turn: Turn) -> TurnPlan:
        subjects = self.subjects_of(turn)
        deletions: list[Deletion] = []
        targets = [t for t in self._deletions(turn) if t.lower() not in {f.lower() for f in self.forgotten}]
        if targets:
            self.forgotten += targets
            rxs = [self._target_rx(t) for t in targets]
            hit = tuple(rid for rid, r in self.rows.items() if any(rx.search(r.text) for rx in rxs))
            rewrites = []
            for rid in hit:
                old = self.rows.pop(rid)
                text = self.redact(old.text)
                new = RowPlan(f"{old.turn_id}~{turn.turn_id}", old.turn_id, old.owner, text,
                              rules.categories(self.domain, text), old.subjects, old.circle)
                self.rows[new.row_id] = new
                rewrites.append(new)
            deletions.append(Deletion(turn.turn_id, turn.speaker.principal_id, tuple(targets), hit, tuple(rewrites)))
            self._count("deletions")
            self._count("deleted_rows", len(hit))
        changes: list[AccessChange] = []
        revoked = self._revocations(turn, subjects)
        if revoked:
            keys = subjects or frozenset({""})
            for s in keys:
                self.revoked.setdefault(s, set()).update(revoked)
            moved = []
            for rid, r in list(self.rows.items()):
                if r.subjects & keys or "" in keys:
                    new = self.circle_of(r.subjects) & r.circle
                    if new != r.circle:
                        self.rows[rid] = RowPlan(r.row_id, r.turn_id, r.owner, r.text, r.labels, r.subjects, new)
                        moved.append((rid, new))
            changes.append(AccessChange(turn.turn_id, revoked, subjects, tuple(moved)))
            self._count("access_changes")
            self._count("rescoped_rows", len(moved))
        text = self.redact(turn.text)
        if text != turn.text:
            self._count("redacted_rows")
        row = RowPlan(f"{turn.turn_id}", turn.turn_id, turn.speaker.principal_id, text,
                      rules.categories(self.domain, text), subjects, self.circle_of(subjects) | {turn.speaker.principal_id})
        self.rows[row.row_id] = row
        return TurnPlan(turn, tuple(deletions), tuple(changes), row)
