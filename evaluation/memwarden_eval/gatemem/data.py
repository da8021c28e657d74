"""GateMem's data files (``bench/data/<domain>/{episodes,checkpoints}.jsonl`` of rzhub/GateMem, MIT) as typed,
immutable values — with what ingest may see kept apart from the hidden annotations.

GateMem's protocol (its bench/README.md, "Evaluation Protocol") forbids a method to read ``query_type``,
``attack_type``, ``expected_action``, ``judge_spec`` or ``leak_targets``. Here that is a matter of types:

- `load_episodes` reads ``episodes.jsonl`` only and returns `Episode` values: principals, relationships
  (``entities``) and turns. An `Episode` holds no reference to any checkpoint; ingest receives nothing else.
- `load_checkpoints` reads ``checkpoints.jsonl`` and splits each line into a `Probe` (what the asker asks, and
  when: ``checkpoint_id``, ``episode_id``, ``as_of_turn_id``, ``asker``, ``query_text``) and an `Annotation`
  (the hidden fields, used only by the scorer and by the upper-bound variant that says so).

Errors: `GateMemFormatError` (a ValueError) names the file and line of anything malformed; nothing is guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

DOMAINS = ("medical", "office", "education", "household")
QUERY_TYPES = ("utility", "privacy", "safety")


class GateMemFormatError(ValueError):
    """A data file that is not GateMem's schema: names the file, the line and the problem."""


@dataclass(frozen=True, slots=True)
class Principal:
    """One principal of an episode (``entities.principals[]``)."""

    principal_id: str
    role: str
    display_name: str


@dataclass(frozen=True, slots=True)
class Relationship:
    """One ``entities.relationships[]`` entry: its ``type`` and the other fields as strings (read-only)."""

    type: str
    attrs: Mapping[str, str]

    def get(self, key: str, default: str = "") -> str:
        return self.attrs.get(key, default)


@dataclass(frozen=True, slots=True)
class Speaker:
    """An authenticated identity: ``principal_id`` and ``role`` (a turn's speaker, a checkpoint's asker)."""

    principal_id: str
    role: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn, in episode order (`index` from 0). `turn_kind` and `timestamp` are absent in some domains."""

    turn_id: str
    index: int
    speaker: Speaker
    text: str
    turn_kind: str | None
    timestamp: str | None


@dataclass(frozen=True, slots=True)
class Episode:
    """What ingest may see of one episode: its principals, relationships and turns — and nothing else."""

    episode_id: str
    domain: str
    principals: tuple[Principal, ...]
    relationships: tuple[Relationship, ...]
    turns: tuple[Turn, ...]

    def principal(self, principal_id: str) -> Principal | None:
        for p in self.principals:
            if p.principal_id == principal_id:
                return p
        return None

    def turn_index(self, turn_id: str) -> int:
        """The index of `turn_id`; KeyError if the episode has no such turn."""
        for t in self.turns:
            if t.turn_id == turn_id:
                return t.index
        raise KeyError(turn_id)


@dataclass(frozen=True, slots=True)
class Probe:
    """A checkpoint as the asker poses it: who asks, what, and after which turn."""

    checkpoint_id: str
    episode_id: str
    as_of_turn_id: str
    asker: Speaker
    query_text: str


@dataclass(frozen=True, slots=True)
class Annotation:
    """The hidden fields of one checkpoint (scoring and analysis only; GateMem bench/README.md).

    `include`/`not_include` are ``judge_spec``'s patterns; `leak_targets` the protected or deleted strings."""

    checkpoint_id: str
    query_type: str
    attack_type: str | None
    expected_action: str
    include: tuple[str, ...]
    not_include: tuple[str, ...]
    leak_targets: tuple[str, ...]
    notes: str


class Annotations(Mapping[str, Annotation]):
    """checkpoint_id → `Annotation`, read-only. Kept out of every object ingest receives."""

    def __init__(self, items: Mapping[str, Annotation]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Annotation:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Annotations({len(self._items)} hidden checkpoint annotations)"


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise GateMemFormatError(f"{path}: cannot read: {exc}") from exc
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GateMemFormatError(f"{path}:{n}: not JSON: {exc}") from exc
            if not isinstance(obj, dict):
                raise GateMemFormatError(f"{path}:{n}: a line must be a JSON object")
            yield n, obj


def _str(obj: Mapping[str, Any], key: str, where: str, optional: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise GateMemFormatError(f"{where}: {key!r} must be a non-empty string")
    return value


def _speaker(obj: Any, where: str) -> Speaker:
    if not isinstance(obj, dict):
        raise GateMemFormatError(f"{where}: must be an object with principal_id and role")
    return Speaker(str(_str(obj, "principal_id", where)), str(_str(obj, "role", where)))


def _patterns(obj: Any, where: str) -> tuple[str, ...]:
    if obj is None:
        return ()
    if not isinstance(obj, list) or not all(isinstance(p, str) for p in obj):
        raise GateMemFormatError(f"{where}: must be a list of strings")
    return tuple(p for p in obj if p)


def parse_episode(obj: Mapping[str, Any], where: str) -> Episode:
    """One ``episodes.jsonl`` object → `Episode`. Raises `GateMemFormatError`."""
    episode_id = str(_str(obj, "episode_id", where))
    domain = str(_str(obj, "domain", where))
    entities = obj.get("entities")
    if not isinstance(entities, dict) or not isinstance(entities.get("principals"), list):
        raise GateMemFormatError(f"{where}: entities.principals must be a list")
    principals = []
    for i, p in enumerate(entities["principals"]):
        w = f"{where}: entities.principals[{i}]"
        if not isinstance(p, dict):
            raise GateMemFormatError(f"{w}: must be an object")
        principals.append(Principal(str(_str(p, "principal_id", w)), str(_str(p, "role", w)),
                                    _str(p, "display_name", w, optional=True) or str(p["principal_id"])))
    if len({p.principal_id for p in principals}) != len(principals):
        raise GateMemFormatError(f"{where}: duplicate principal_id")
    relationships = []
    for i, r in enumerate(entities.get("relationships") or []):
        w = f"{where}: entities.relationships[{i}]"
        if not isinstance(r, dict):
            raise GateMemFormatError(f"{w}: must be an object")
        rtype = str(_str(r, "type", w))
        attrs = {k: str(v) for k, v in r.items() if k != "type" and isinstance(v, (str, int, float, bool))}
        relationships.append(Relationship(rtype, MappingProxyType(attrs)))
    raw_turns = obj.get("turns")
    if not isinstance(raw_turns, list) or not raw_turns:
        raise GateMemFormatError(f"{where}: turns must be a non-empty list")
    turns = []
    seen: set[str] = set()
    for i, t in enumerate(raw_turns):
        w = f"{where}: turns[{i}]"
        if not isinstance(t, dict):
            raise GateMemFormatError(f"{w}: must be an object")
        turn_id = str(_str(t, "turn_id", w))
        if turn_id in seen:
            raise GateMemFormatError(f"{w}: duplicate turn_id {turn_id!r}")
        seen.add(turn_id)
        text = t.get("text")
        if not isinstance(text, str):
            raise GateMemFormatError(f"{w}: 'text' must be a string")
        turns.append(Turn(turn_id, i, _speaker(t.get("speaker"), f"{w}.speaker"), text,
                          _str(t, "turn_kind", w, optional=True), _str(t, "timestamp", w, optional=True)))
    return Episode(episode_id, domain, tuple(principals), tuple(relationships), tuple(turns))


def load_episodes(domain_dir: Path) -> list[Episode]:
    """Episodes of one domain directory (``<dir>/episodes.jsonl``), in file order. Never opens checkpoints."""
    path = Path(domain_dir) / "episodes.jsonl"
    episodes = [parse_episode(obj, f"{path}:{n}") for n, obj in _lines(path)]
    if len({e.episode_id for e in episodes}) != len(episodes):
        raise GateMemFormatError(f"{path}: duplicate episode_id")
    return episodes


def parse_checkpoint(obj: Mapping[str, Any], where: str) -> tuple[Probe, Annotation]:
    """One ``checkpoints.jsonl`` object → (`Probe`, `Annotation`). Raises `GateMemFormatError`."""
    cid = str(_str(obj, "checkpoint_id", where))
    probe = Probe(cid, str(_str(obj, "episode_id", where)), str(_str(obj, "as_of_turn_id", where)),
                  _speaker(obj.get("asker"), f"{where}.asker"), str(_str(obj, "query_text", where)))
    qtype = str(_str(obj, "query_type", where))
    if qtype not in QUERY_TYPES:
        raise GateMemFormatError(f"{where}: query_type {qtype!r} is not one of {QUERY_TYPES}")
    spec = obj.get("judge_spec") or {}
    if not isinstance(spec, dict):
        raise GateMemFormatError(f"{where}: judge_spec must be an object")
    annotation = Annotation(
        cid, qtype, _str(obj, "attack_type", where, optional=True),
        _str(obj, "expected_action", where, optional=True) or str(spec.get("expected_action") or ""),
        _patterns(spec.get("include"), f"{where}: judge_spec.include"),
        _patterns(spec.get("not_include"), f"{where}: judge_spec.not_include"),
        _patterns(obj.get("leak_targets"), f"{where}: leak_targets"),
        str(spec.get("notes") or ""),
    )
    return probe, annotation


def load_checkpoints(domain_dir: Path) -> tuple[list[Probe], Annotations]:
    """Checkpoints of one domain directory (``<dir>/checkpoints.jsonl``): the probes in file order and their
    hidden annotations by checkpoint_id."""
    path = Path(domain_dir) / "checkpoints.jsonl"
    probes: list[Probe] = []
    annotations: dict[str, Annotation] = {}
    for n, obj in _lines(path):
        probe, annotation = parse_checkpoint(obj, f"{path}:{n}")
        if probe.checkpoint_id in annotations:
            raise GateMemFormatError(f"{path}:{n}: duplicate checkpoint_id {probe.checkpoint_id!r}")
        probes.append(probe)
        annotations[probe.checkpoint_id] = annotation
    return probes, Annotations(annotations)


@dataclass(frozen=True)
class DomainData:
    """One domain: episodes (ingest), probes (evaluation) and the hidden annotations (scoring)."""

    domain: str
    episodes: tuple[Episode, ...]
    probes: tuple[Probe, ...]
    annotations: Annotations


def load_domain(data_dir: Path, domain: str) -> DomainData:
    """``<data_dir>/<domain>/``; checks that every probe names a known episode, turn and principal."""
    d = Path(data_dir) / domain
    episodes = load_episodes(d)
    probes, annotations = load_checkpoints(d)
    by_id = {e.episode_id: e for e in episodes}
    for p in probes:
        e = by_id.get(p.episode_id)
        where = f"{d / 'checkpoints.jsonl'}: {p.checkpoint_id}"
        if e is None:
            raise GateMemFormatError(f"{where}: unknown episode {p.episode_id!r}")
        try:
            e.turn_index(p.as_of_turn_id)
        except KeyError:
            raise GateMemFormatError(f"{where}: episode has no turn {p.as_of_turn_id!r}") from None
        if e.principal(p.asker.principal_id) is None:
            raise GateMemFormatError(f"{where}: asker {p.asker.principal_id!r} is not a principal of the episode")
    return DomainData(domain, tuple(episodes), tuple(probes), annotations)
