"""Provenance, supersession and deletion closure shared by every backend profile (docs/design.md §4).

Pure helpers:

- `content_digest`: keyed HMAC-SHA256 over normalised content (`normalise_content`: default-ignorable
  code points removed, Unicode NFKC, case-folded, format characters such as zero-width spaces removed,
  whitespace collapsed, punctuation and symbols at the edges stripped), so a deleted memory's content
  cannot be re-written under another id, spelt differently, without the text.
- `load_single_valued`: the predicates declared single-valued in ``policies/single_valued.txt``
  (one predicate per line, ``#`` comments). A triple with such a predicate supersedes the active row
  for the same (subject, predicate) in its collection and visibility partition (`fact_partition`).
- `split_metadata`: a client's metadata → (plain keys, requested governance and provenance keys).
- `provenance_metadata`: the ``mw_source``/``mw_derived_from``/triple keys stamped into a row.
- `history_view`: the ``include_superseded`` / ``as_of`` query parameters.

`Provenance` holds the rules a profile applies around its backend calls — parents must be
readable, superseding needs ``supersede`` on the current fact of the row's partition, deleted content may not come back where
the writer could read it, links to superseded rows only where readable, deletion closure — so each
profile only maps its own row shapes (Chroma columns, Mem0 memories) onto them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import regex

from sidecar.errors import BadRequest, Conflict, Forbidden
from sidecar.governance import SCOPES, Principal, Row, agent_id, fact_partition
from sidecar.ledger.base import StaleFact, check_names, now_us

if TYPE_CHECKING:
    from sidecar.exchange import Exchange
    from sidecar.ledger import Ledger
    from sidecar.stages.authorize import Authorizer

SINGLE_VALUED_FILE = "single_valued.txt"
_WS = re.compile(r"\s+")
# Unicode's Default_Ignorable_Code_Point property (UAX #44, DerivedCoreProperties.txt): code points a renderer
# shows as nothing — U+00AD, U+034F, U+115F, U+180B–U+180F, U+200B–U+200F, U+2060–U+206F, U+3164, U+FE00–U+FE0F,
# U+FEFF, U+FFA0, U+E0000–U+E0FFF and the unassigned code points reserved as ignorable — as the `regex` package's
# Unicode tables define it (the standard library has no such property).
_IGNORABLE = regex.compile(r"\p{Default_Ignorable_Code_Point}+")
_PREDICATE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

GOVERNED_PREFIX = "mw_"
# Requestable on a new row only (provenance and the triple are fixed once written).
WRITE_ONCE = ("mw_derived_from", "mw_subject", "mw_predicate", "mw_object")
# Governed metadata keys a client may request; the sidecar stamps these and the rest.
REQUESTABLE = ("mw_scope", "mw_fleet", "mw_readers", "mw_labels") + WRITE_ONCE
FIXED_ONCE_WRITTEN = "provenance and triples are fixed once written; write a new row instead"
_UNSEEN: Any = object()  # `Provenance.links`: an id the request did not read


def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed and trimmed: the spelling of a triple's subject and predicate."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def _edge(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch)[0] in "PS"


def normalise_content(text: str) -> str:
    """The form in which memory content is compared (deletion closure, the forgotten-content rule):
    default-ignorable code points (Unicode's Default_Ignorable_Code_Point property: zero-width characters,
    the combining grapheme joiner U+034F, variation selectors U+FE00–U+FE0F and U+E0100–U+E01EF, Mongolian
    free variation selectors, Hangul fillers, tags, ...) removed, then Unicode NFKC, case-folded, format
    characters (category Cf: BOM, soft hyphen, bidi controls) removed, whitespace runs collapsed to one
    space, and punctuation, symbols and whitespace at both ends stripped. ``"The key is 42."``,
    ``" the KEY is\u200b 42 "``, ``"the key\u034f is 42\ufe0f"`` and ``"¡The key is 42!"`` compare equal;
    ``"The key is 43"`` and ``"the key, is 42"`` do not. Inserting a default-ignorable code point anywhere
    never changes the result (they are removed before anything else; NFKC and case folding map no other
    code point to one)."""
    return _normalise_cf(_IGNORABLE.sub("", text))


def _normalise_cf(text: str) -> str:
    """`normalise_content` before it removed default-ignorable code points (format characters removed, the
    others kept): a normalisation of `legacy_content_digests`, and the steps after that removal."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    visible = "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")
    collapsed = _WS.sub(" ", visible)
    start, end = 0, len(collapsed)
    while start < end and _edge(collapsed[start]):
        start += 1
    while end > start and _edge(collapsed[end - 1]):
        end -= 1
    return collapsed[start:end]


def content_keys(spec: str) -> tuple[str, ...]:
    """``"data,text"`` → ``("data", "text")``: the metadata keys a Chroma row's text may be kept in."""
    return tuple(k for k in (x.strip() for x in spec.split(",")) if k)


def row_text(document: Any, metadata: Any, keys: Iterable[str]) -> str | None:
    """The content of a Chroma row: its document when it is a string, else the first of `keys` whose value in
    `metadata` is a non-empty string (mem0's OSS ``Memory`` writes no document and keeps the text in metadata
    ``data``), else None (the row has no content to compare)."""
    if isinstance(document, str):
        return document
    if isinstance(metadata, dict):
        for key in keys:
            value = metadata.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def content_digest(key: bytes, text: str) -> str:
    """Hex HMAC-SHA256 of `normalise_content(text)` under the ledger's content key."""
    return hmac.new(key, normalise_content(text).encode("utf-8"), hashlib.sha256).hexdigest()


def legacy_content_digests(key: bytes, text: str) -> tuple[str, ...]:
    """The HMACs earlier normalisations gave `text` (never stored for a new row; looked up with
    `content_digest` so content deleted before an upgrade still matches): format characters removed but other
    default-ignorable code points kept (before the Default_Ignorable_Code_Point normalisation), and NFKC, case
    and whitespace only (before ledger schema version 3) — each of `text` as sent and of `text` with its default-ignorable code points removed,
    so an invisible mark added to content deleted before the upgrade does not get it past the rule either.
    Distinct, without `content_digest`'s own value; at most 3."""
    current = normalise_content(text)
    stripped = _IGNORABLE.sub("", text)
    forms = dict.fromkeys(f for f in (_normalise_cf(text), normalise(text), normalise(stripped)) if f != current)
    return tuple(hmac.new(key, f.encode("utf-8"), hashlib.sha256).hexdigest() for f in forms)


def load_single_valued(policies_dir: Path) -> frozenset[str]:
    """Predicates from ``<policies_dir>/single_valued.txt``; empty when the file is absent.

    Raises ValueError naming the line for a malformed predicate (checked at start-up).
    """
    path = Path(policies_dir) / SINGLE_VALUED_FILE
    if not path.exists():
        return frozenset()
    out = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        if not _PREDICATE.match(item):
            raise ValueError(f"{path}:{n}: {item!r} is not a predicate name")
        out.add(item)
    return frozenset(out)


def split_metadata(p: Principal, meta: Any, *, not_object: str, reserved: Iterable[str] = ()
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split client metadata into (plain, requested governance). Raises `BadRequest` (400) for any
    ``mw_`` key outside `REQUESTABLE`, a non-string requested value, a key in `reserved`, a bad scope,
    fleet or reader list, an empty ``mw_derived_from`` or an incomplete triple; `not_object` is the
    message when `meta` is neither an object nor None.

    Requested values come back parsed: ``mw_readers`` as a tuple of agent uids ``t/f/a``, ``mw_labels``
    (``"pii,finance"``; ``""`` for none) as a sorted tuple of label names (`check_names`; 400 for a bad one),
    ``mw_derived_from`` as a tuple of parent row ids (order kept, duplicates dropped), ``mw_subject`` and
    ``mw_predicate`` normalised (`normalise`).
    """
    if meta is None:
        return {}, {}
    if not isinstance(meta, dict):
        raise BadRequest(not_object)
    reserved = set(reserved)
    plain: dict[str, Any] = {}
    requested: dict[str, Any] = {}
    for key, value in meta.items():
        if key.startswith(GOVERNED_PREFIX):
            if key not in REQUESTABLE:
                raise BadRequest(f"metadata key {key!r} is governed by memwarden and cannot be set")
            if not isinstance(value, str):
                raise BadRequest(f"{key} must be a string")
            requested[key] = value
        elif key in reserved:
            raise BadRequest(f"{key} cannot be set through metadata")
        else:
            plain[key] = value
    if "mw_scope" in requested and requested["mw_scope"] not in SCOPES:
        raise BadRequest(f"mw_scope must be one of {', '.join(SCOPES)}")
    if "mw_fleet" in requested and (not requested["mw_fleet"] or "/" in requested["mw_fleet"] or ":" in requested["mw_fleet"]):
        raise BadRequest("mw_fleet must be a fleet name of your tenant")
    if "mw_readers" in requested:
        readers = []
        for item in filter(None, (s.strip() for s in requested["mw_readers"].split(","))):
            fleet, sep, agent = item.partition("/")
            if not sep or not fleet or not agent or "/" in agent:
                raise BadRequest("mw_readers must be a comma-separated list of fleet/agent")
            readers.append(agent_id(p.tenant, fleet, agent))
        requested["mw_readers"] = tuple(dict.fromkeys(readers))
    if "mw_labels" in requested:
        try:
            requested["mw_labels"] = check_names("label", filter(None, (s.strip() for s in requested["mw_labels"].split(","))))
        except ValueError as exc:
            raise BadRequest(f"mw_labels: {exc}") from None
    if "mw_derived_from" in requested:
        parents = [x.strip() for x in requested["mw_derived_from"].split(",") if x.strip()]
        if not parents:
            raise BadRequest("mw_derived_from must name at least one parent id")
        requested["mw_derived_from"] = tuple(dict.fromkeys(parents))
    triple = [k for k in ("mw_subject", "mw_predicate", "mw_object") if k in requested]
    if triple and len(triple) != 3:
        raise BadRequest("a triple needs mw_subject, mw_predicate and mw_object")
    if triple:
        # One fact per (subject, predicate) whatever the spelling: both are stored normalised (NFKC,
        # case-folded, whitespace collapsed), so "Service:API " and "service:api" are the same subject.
        for key in ("mw_subject", "mw_predicate"):
            requested[key] = normalise(requested[key])
            if not requested[key]:
                raise BadRequest(f"{key} must not be empty")
    return plain, requested


def provenance_metadata(row: Row) -> dict[str, Any]:
    """``mw_source``, and where set ``mw_derived_from`` (``"id1,id2"``) and the triple, of a ledger row."""
    out: dict[str, Any] = {"mw_source": row.source}
    if row.derived_from:
        out["mw_derived_from"] = ",".join(r for _, r in row.derived_from)
    for name in ("subject", "predicate", "object"):
        if getattr(row, name) is not None:
            out[f"mw_{name}"] = getattr(row, name)
    return out


def history_view(query: Mapping[str, str]) -> tuple[bool, int | None]:
    """``?include_superseded=true|false`` and ``?as_of=<UTC µs>`` → (include_superseded, as_of).
    Both widen what is servable, never what Cedar's ``read`` permits. Raises `BadRequest` (400)."""
    flag = query.get("include_superseded", "false")
    if flag not in ("true", "false"):
        raise BadRequest("include_superseded must be true or false")
    as_of = query.get("as_of")
    if as_of is not None and not as_of.isdigit():
        raise BadRequest("as_of must be a UTC timestamp in microseconds")
    return flag == "true", int(as_of) if as_of is not None else None


class Provenance:
    """The §4 rules of one backend profile, over the ledger and the Cedar authorizer.

    `backend` is the ledger backend key (``"chroma"``, ``"mem0"``); collections are ledger collection
    ids. Every check raises the project's own errors (`Forbidden` 403, `Conflict` 409) and marks the
    exchange denied; none calls the backend.
    """

    def __init__(self, backend: str, policies_dir: Path, ledger: Ledger, authz: Authorizer) -> None:
        self.backend = backend
        self.ledger = ledger
        self.authz = authz
        self.single_valued = load_single_valued(policies_dir)
        self.content_key = ledger.content_key()

    def digest(self, text: str) -> str:
        return content_digest(self.content_key, text)

    def set_content(self, row: Row, text: str) -> Row:
        """Record `text` as `row`'s content (its HMAC, and the legacy one for matching older deletions); returns `row`."""
        row.content_hmac = self.digest(text)
        row.content_legacy = legacy_content_digests(self.content_key, text)
        return row

    def new_row(self, ex: Exchange, collection: str, row_id: str, requested: dict[str, Any], text: Any,
                extra: dict[str, Any] | None = None) -> Row:
        """A new row owned and written by the caller: governance from `requested` (default scope
        ``fleet``, the caller's fleet), provenance (source ``<backend>:<operation>:<request id>``,
        parents in `collection`), the triple, and the content HMAC when `text` is a string."""
        assert ex.principal is not None
        p = ex.principal
        predicate = requested.get("mw_predicate")
        return Row(
            backend=self.backend, collection=collection, row_id=row_id, tenant=p.tenant,
            fleet=requested.get("mw_fleet", p.fleet or ""), owner=p.uid[1],
            scope=requested.get("mw_scope", "fleet"), writer=p.uid[1], created_at=now_us(),
            readers=requested.get("mw_readers", ()), labels=requested.get("mw_labels", ()), request_id=ex.request_id,
            source=f"{self.backend}:{ex.operation}:{ex.request_id}",
            derived_from=tuple((collection, parent) for parent in requested.get("mw_derived_from", ())),
            subject=requested.get("mw_subject"), predicate=predicate, object=requested.get("mw_object"),
            single_valued=predicate in self.single_valued,
            content_hmac=self.digest(text) if isinstance(text, str) else None,
            content_legacy=legacy_content_digests(self.content_key, text) if isinstance(text, str) else (),
            extra=extra or {},
        )

    def check_parents(self, ex: Exchange, rows: list[Row]) -> None:
        """Every named parent must exist and be readable by the writer (superseded ones included);
        else 403, the same for a missing, foreign or deleted parent (existence is not revealed)."""
        by_collection: dict[str, list[str]] = {}
        for row in rows:
            for collection, parent in row.derived_from:
                by_collection.setdefault(collection, [])
                if parent not in by_collection[collection]:
                    by_collection[collection].append(parent)
        for collection, parents in by_collection.items():
            readable = self.authz.readable(ex, self.backend, collection, parents, include_superseded=True, count=False)
            if len(readable) != len(parents):
                ex.decision = "deny"
                raise Forbidden("derived_from names a memory you cannot read")

    def check_supersession(self, ex: Exchange, rows: list[Row]) -> dict[str, tuple[str, str] | None]:
        """A single-valued row replaces the active fact of its (subject, predicate) in its own collection
        and visibility partition (`fact_partition`), and needs Cedar ``supersede`` on that fact. Every
        writer into a partition may read every fact in it (default policies, proved by supersede-scope),
        so the decision never concerns a fact the writer cannot read, and a fact in a partition the writer
        does not write into (another agent's private one, another fleet's, another collection's) is never
        looked at: the answer is the same whether it exists or not.

        Returns, per single-valued row of `rows` (in order), the (collection, id) of the fact it will
        supersede — the fact decided here, or the previous row of `rows` with the same key — or None: the
        `expect` of `Ledger.activate_rows`. Raises `Forbidden` when ``supersede`` is denied."""
        current: dict[tuple[str, str, str, str, str], Row | None] = {}
        last: dict[tuple[str, str, str, str, str], tuple[str, str] | None] = {}
        expect: dict[str, tuple[str, str] | None] = {}
        for r in rows:
            if not r.single_valued:
                continue
            key = (r.tenant, r.collection, fact_partition(r), r.subject or "", r.predicate or "")
            if key not in current:
                fact = current[key] = self.ledger.active_fact(self.backend, key[0], key[3], key[4],
                                                              collection=key[1], partition=key[2])
                last[key] = (fact.collection, fact.row_id) if fact is not None else None
            expect[r.row_id] = last[key]
            last[key] = (r.collection, r.row_id)  # a later row of `rows` supersedes this one
        facts = [f for f in current.values() if f is not None]
        if facts and not all(d.allowed for d in self.authz.decide_rows(ex, "supersede", facts)):
            ex.decision = "deny"
            raise Forbidden("superseding this fact is not permitted")
        return expect

    def check_move(self, ex: Exchange, moved: list[tuple[Row, Row]]) -> None:
        """A re-scoped active single-valued row (before, after) moves to another visibility partition;
        if that partition holds an active fact of the same subject and predicate, 409 (nothing changes):
        write a new fact there instead. The mover may write into the target partition, so by the partition
        rule it may read that fact: the 409 is no oracle."""
        for before, after in moved:
            if not before.single_valued or before.status != "active" or fact_partition(before) == fact_partition(after):
                continue
            there = self.ledger.active_fact(self.backend, after.tenant, after.subject or "", after.predicate or "",
                                            collection=after.collection, partition=fact_partition(after))
            if there is not None and there.row_id != after.row_id:
                ex.decision = "deny"
                raise Conflict("a fact with this subject and predicate is active in the target scope; "
                               "write a new fact there to supersede it")

    def activate(self, ex: Exchange, collection: str, rows: list[Row], attempts: int = 100) -> None:
        """Activate reserved `rows` (already written to the backend) in `collection`. A single-valued row
        supersedes only a fact whose `supersede` was decided for this caller: `check_supersession` runs again
        and the ledger activates only if that fact is still the active one (compare-and-set); if another
        write replaced it in between, the decision is taken again on the new fact. So a concurrent write
        cannot make the caller supersede a fact it may not supersede.

        Raises `Forbidden` (403) when the caller may not supersede the fact now active, `Conflict` (409) when
        the fact changed `attempts` times in a row; then nothing is activated and the caller must take
        the rows back out of its backend and release them."""
        ids = [r.row_id for r in rows]
        for _ in range(attempts):
            expect = self.check_supersession(ex, rows)
            try:
                self.ledger.activate_rows(self.backend, collection, ids, expect=expect or None)
                return
            except StaleFact:
                continue
        ex.decision = "deny"
        raise Conflict("the fact kept changing while it was written; retry")

    def forgotten(self, ex: Exchange, rows: list[Row]) -> list[Row]:
        """Those of `rows` whose content is a deleted row's (compared as `normalise_content`) that this
        writer could read (judged as that row was, active) AND that is of the writer's own lineage — it
        owned the deleted row, or is of that row's fleet (a tenant admin: every row of its tenant) — and
        that policy does not let it `reassert`. Deleted content the writer could never read is not an
        oracle (never flagged), and content deleted in another fleet does not bind this one: the rule
        stops a memory coming back where it was, not a text from being written by anyone."""
        assert ex.principal is not None
        p = ex.principal
        digests = [d for r in rows for d in (r.content_hmac, *r.content_legacy) if d]
        if not digests:
            return []
        gone = [g for g in self.ledger.content_copies(self.backend, p.tenant, digests, deleted=True)
                if p.kind == "admin" or g.owner == p.uid[1] or (p.kind == "agent" and g.fleet == p.fleet)]
        if not gone:
            return []
        as_was = [dataclasses.replace(g, status="active") for g in gone]
        known = self.authz.decide_rows(ex, "read", as_was)
        hits = {g.content_hmac for g, d in zip(gone, known) if d.allowed}
        flagged = [r for r in rows if r.content_hmac in hits or not hits.isdisjoint(r.content_legacy)]
        decisions = self.authz.decide_rows(ex, "reassert", flagged)
        return [r for r, d in zip(flagged, decisions) if not d.allowed]

    def check_forgotten(self, ex: Exchange, rows: list[Row]) -> None:
        """409 when any of `rows` carries deleted content this writer could read (see `forgotten`)."""
        if self.forgotten(ex, rows):
            ex.decision = "deny"
            raise Conflict("this content was deleted and may not be written again")

    def links(self, ex: Exchange, collection: str, row_ids: list[str]) -> dict[str, dict[str, str]]:
        """Per row id, the ``mw_supersedes_id`` / ``mw_superseded_by`` metadata to add to a response —
        only links to rows of `collection` the caller may read (superseded ones included); other ids
        are never shown. Rows without a readable link are absent."""
        if not row_ids:
            return {}
        backend = self.backend
        seen = ex.ledger_rows
        rows: dict[str, Any] = {}
        for i in row_ids:  # read for this request's decision: every one, else all from the ledger
            lr = seen.get((backend, collection, i), _UNSEEN)
            if lr is _UNSEEN:
                rows = self.ledger.get_rows(backend, collection, row_ids)
                break
            rows[i] = lr
        targets: list[str] = []
        for lr in rows.values():
            pair = lr.supersedes
            if pair is not None and pair[0] == collection:
                targets.append(pair[1])
            pair = lr.superseded_by
            if pair is not None and pair[0] == collection:
                targets.append(pair[1])
        visible = (self.authz.readable(ex, self.backend, collection, targets, include_superseded=True, count=False)
                   if targets else set())
        out: dict[str, dict[str, str]] = {}
        if not visible:  # no readable target: no row shows a link
            return out
        for row_id, lr in rows.items():
            meta = {key: pair[1] for key, pair in (("mw_supersedes_id", lr.supersedes), ("mw_superseded_by", lr.superseded_by))
                    if pair is not None and pair[0] == collection and pair[1] in visible}
            if meta:
                out[row_id] = meta
        return out

    def decorate(self, ex: Exchange, collection: str, rows: list[dict[str, Any]], *, id_key: str, meta_key: str) -> None:
        """Add `links` to each returned row (a dict with its id under `id_key` and its metadata object
        under `meta_key`, e.g. Chroma ``ids``/``metadatas``, Mem0 ``id``/``metadata``) and narrow its
        ``mw_derived_from`` to readable parents, in place: each row's metadata object is replaced, never
        edited. Rows repeating an id are decorated each from its own metadata."""
        with_meta: list[dict[str, Any]] = []
        ids: list[Any] = []
        for r in rows:
            if isinstance(r.get(meta_key), dict):
                with_meta.append(r)
                ids.append(r[id_key])
        links = self.links(ex, collection, ids)
        if links:
            for r in with_meta:
                if r[id_key] in links:
                    r[meta_key] = {**r[meta_key], **links[r[id_key]]}
        # ``mw_derived_from`` names only the parents the caller may read (as lineage does): the ids of
        # unreadable or deleted parents never leave the sidecar; with none readable the key is dropped.
        # Per row object, not per id: an answer may repeat an id, each copy with its own metadata.
        parents = [(r, [x for x in str(r[meta_key]["mw_derived_from"]).split(",") if x])
                   for r in with_meta if "mw_derived_from" in r[meta_key]]
        if parents:
            wanted = sorted({x for _, xs in parents for x in xs})
            visible = self.authz.readable(ex, self.backend, collection, wanted, include_superseded=True, count=False)
            for r, xs in parents:
                meta = dict(r[meta_key])
                shown = [x for x in xs if x in visible]
                if shown:
                    meta["mw_derived_from"] = ",".join(shown)
                else:
                    meta.pop("mw_derived_from", None)  # a row object listed twice is narrowed twice
                r[meta_key] = meta

    def tombstone(self, ex: Exchange, collection: str, rows: list[Row], closure: str) -> list[tuple[str, str]]:
        """Tombstone `rows` (each already allowed Cedar ``delete``) with their deletion closure, in one
        ledger transaction, before any backend delete: rows derived from them (``closure="cascade"``)
        and the tenant's other rows with the same content that the caller may delete. Returns every
        (collection, row id) tombstoned, `rows` first; the caller deletes them from its backend."""
        assert ex.principal is not None
        p = ex.principal
        ids = [r.row_id for r in rows]
        digests = [d for r in rows for d in (r.content_hmac, *r.content_legacy) if d]
        mine = {(collection, i) for i in ids}
        copies = [c for c in self.ledger.content_copies(self.backend, p.tenant, digests)
                  if (c.collection, c.row_id) not in mine] if digests else []
        copy_ok = self.authz.decide_rows(ex, "delete", copies)
        also = [(c.collection, c.row_id) for c, d in zip(copies, copy_ok) if d.allowed]
        return self.ledger.tombstone(self.backend, collection, ids, p.uid[1], ex.request_id, closure=closure, also=also)
