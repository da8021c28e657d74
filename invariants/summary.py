"""One-line English summaries of counterexamples and witnesses.

`request_sentence(request, entities)` reads a concrete Cedar request (Cedar JSON request and entity
list, https://docs.cedarpolicy.com/auth/entities-syntax.html) as a sentence about who asks to do what,
in memwarden's terms where the entity types are memwarden's (``Agent``, ``TenantAdmin``, ``Operator``,
``Memory``, ``Collection``, ``Namespace``, ``Deployment``) and generically otherwise::

    agent agent1 (fleet fleet1, trust 2) · read · an agent-scoped row memory1 owned by agent2 in fleet fleet2

`counterexample_summary(cex)` turns a counterexample of ``invariants.catalog`` (or a witness of
``invariants.matrix``) into one line, e.g. "agent agent1 (fleet fleet1, trust 2) may read an agent-scoped
row memory1 owned by agent2 in fleet fleet2". The text only describes the request and entities the
counterexample holds; it is never parsed back and decides nothing.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

__all__ = ["request_sentence", "counterexample_summary", "describe_principal", "describe_resource", "verb", "quote",
           "policy_strings"]

_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+-]+")
_VERBS = {"delete_bulk": "bulk-delete in", "manage_tenants": "manage the tenants of", "admin": "administer",
          "list": "list", "search": "search"}


def quote(s: str) -> str:
    """A Cedar string literal for ``s``, in ASCII: ``"``, ``\\`` and the common controls escaped as Cedar
    writes them, any other character outside printable ASCII as ``\\u{hex}`` (one escape per code point,
    never a UTF-16 surrogate pair)."""
    out = []
    for ch in s:
        c = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif 0x20 <= c < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\u{{{c:x}}}")
    return '"' + "".join(out) + '"'


def _id(eid: Any) -> str:
    s = str(eid)
    return s if _PLAIN.fullmatch(s) else quote(s)


def _ref(v: Any) -> dict[str, Any] | None:
    if isinstance(v, dict) and "__entity" in v:
        e = v["__entity"]
        return {"type": e.get("type"), "id": e.get("id")}
    if isinstance(v, dict) and set(v) == {"type", "id"}:
        return v
    return None


def _ent_text(v: Any) -> str:
    r = _ref(v)
    if r is None:
        return quote(v) if isinstance(v, str) else json.dumps(v, ensure_ascii=True)
    return _id(r["id"])


def _same(a: Any, b: Any) -> bool:
    ra, rb = _ref(a), _ref(b)
    return ra is not None and rb is not None and ra == rb


def verb(action: str) -> str:
    """The English verb phrase of an action id (``delete_bulk`` → "bulk-delete in")."""
    return _VERBS.get(action, action.replace("_", " "))


def describe_principal(uid: dict[str, Any], attrs: dict[str, Any] | None, resource_attrs: dict[str, Any],
                       strings: frozenset[str] | None = None) -> str:
    """``agent a1 (fleet f1, trust 2)``; the tenant is named when it is not the resource's; roles only those
    in ``strings`` (the string literals of the policies, when given: other roles decide nothing)."""
    kind = {"Agent": "agent", "TenantAdmin": "tenant admin", "Operator": "operator"}.get(uid["type"], uid["type"])
    head = f"{kind} {_id(uid['id'])}"
    if attrs is None:
        return head + " (not in the entity store)"
    parts = []
    if "tenant" in attrs and (uid["type"] == "TenantAdmin" or "tenant" not in resource_attrs
                              or not _same(attrs["tenant"], resource_attrs["tenant"])):
        parts.append(f"tenant {_ent_text(attrs['tenant'])}")
    if "fleet" in attrs:
        parts.append(f"fleet {_ent_text(attrs['fleet'])}")
    if "trust" in attrs:
        parts.append(f"trust {attrs['trust']}")
    roles = [r for r in attrs.get("roles") or [] if strings is None or r in strings]
    if roles:
        parts.append("roles " + ", ".join(_ent_text(r) for r in roles))
    return head + (f" ({', '.join(parts)})" if parts else "")


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def describe_resource(uid: dict[str, Any], attrs: dict[str, Any] | None, principal: dict[str, Any],
                      principal_attrs: dict[str, Any], present: set[tuple[str, str]] | None = None) -> str:
    """``an agent-scoped row m1 owned by a2 in fleet f2`` (status, tenant and whether the principal is a
    reader, when they matter; an empty status is not named)."""
    t, eid = uid["type"], _id(uid["id"])
    if attrs is None:
        return f"{t} {eid} (not in the entity store)"
    other_tenant = "tenant" in attrs and "tenant" in principal_attrs and not _same(attrs["tenant"],
                                                                                    principal_attrs["tenant"])
    tenant = f" of tenant {_ent_text(attrs['tenant'])}" if other_tenant else ""
    if t == "Memory":
        scope, status = attrs.get("scope"), attrs.get("status")
        adjs, odd = [], []
        if status in ("superseded", "deleted"):
            adjs.append(status)
        elif status not in ("active", "") and "status" in attrs:
            odd.append(f"status {json.dumps(status, ensure_ascii=True)}")
        if scope in ("agent", "fleet", "tenant", "restricted"):
            adjs.append(f"{scope}-scoped")
        elif "scope" in attrs:
            odd.append(f"scope {json.dumps(scope, ensure_ascii=True)}")
        adj = " ".join(adjs + ["row"])
        with_ = f" with {' and '.join(odd)}" if odd else ""
        owner = attrs.get("owner")
        own = _ref(owner) == {"type": principal["type"], "id": principal["id"]}
        text = (f"its own {adj} {eid}{with_}" if own else
                f"{_article(adj)} {adj} {eid}{with_}" + (f" owned by {_ent_text(owner)}" if owner is not None else ""))
        oref = _ref(owner)
        if not own and oref is not None and present is not None and (oref["type"], oref["id"]) not in present:
            text += " (absent from the entity store)"
        if "fleet" in attrs:
            text += f" in fleet {_ent_text(attrs['fleet'])}"
        text += tenant
        reader = any(_same(r, {"__entity": principal}) for r in attrs.get("readers", []))
        if reader and not own:
            text += f" with {_id(principal['id'])} among its readers"
        elif scope == "restricted" and not own:
            text += f" ({_id(principal['id'])} not among its readers)"
        return text
    if t == "Deployment":
        return f"the deployment {eid}"
    return f"{t.lower()} {eid}{tenant}"


def _context(ctx: dict[str, Any], present: set[tuple[str, str]] | None = None) -> str:
    if not ctx:
        return ""
    if set(ctx) <= {"target_fleet", "target_scope"} and "target_fleet" in ctx:
        tf = _ref(ctx["target_fleet"])
        absent = tf is not None and present is not None and (tf["type"], tf["id"]) not in present
        out = (f" to a fleet {_ent_text(ctx['target_fleet'])} absent from the entity store" if absent
               else f" to fleet {_ent_text(ctx['target_fleet'])}")
        if "target_scope" in ctx:
            out += f" as {_ent_text(ctx['target_scope'])} scope"
        return out
    return " with context " + ", ".join(f"{k}={_ent_text(v)}" for k, v in sorted(ctx.items()))


def _parts(request: dict[str, Any], entities: list[dict[str, Any]],
           strings: frozenset[str] | None = None) -> tuple[str, str, str, str]:
    ents = {(e["uid"]["type"], e["uid"]["id"]): e.get("attrs", {}) for e in entities}
    p, r = request["principal"], request["resource"]
    pa, ra = ents.get((p["type"], p["id"])), ents.get((r["type"], r["id"]))
    return (describe_principal(p, pa, ra or {}, strings), verb(request["action"]["id"]),
            describe_resource(r, ra, p, pa or {}, set(ents)), _context(request.get("context") or {}, set(ents)))


def request_sentence(request: dict[str, Any], entities: list[dict[str, Any]], modal: str = "may",
                     strings: frozenset[str] | None = None) -> str:
    """"<principal> <modal> <verb> <resource>[ to fleet F]" for a Cedar JSON request and entity list;
    ``strings`` as in `describe_principal`."""
    who, act, what, ctx = _parts(request, entities, strings)
    return f"{who} {modal} {act} {what}{ctx}"


def counterexample_summary(cex: dict[str, Any], strings: frozenset[str] | None = None) -> str:
    """One line for a counterexample of ``invariants.catalog`` (keys ``kind``, ``request``, ``entities``,
    ``cedar`` …) or of ``--compare`` (``invariant`` newly-permitted/newly-denied, ``old``/``new``);
    ``strings`` as in `describe_principal`."""
    req, ents = cex.get("request"), cex.get("entities") or []
    if not req:
        return ""
    kind, inv = cex.get("kind"), cex.get("invariant")
    who, act, what, ctx = _parts(req, ents, strings)
    if kind == "never-errors":
        errs = (cex.get("cedar") or {}).get("errors") or []
        return f"policy {', '.join(errs) or '?'} raises an evaluation error when {who} asks to {act} {what}{ctx}"
    if kind == "monotone":
        raised = cex.get("raised") or {}
        p = req["principal"]
        before = next((e["attrs"].get("trust") for e in ents if e["uid"] == p), None)
        after = next((e["attrs"].get("trust") for e in raised.get("entities", []) if e["uid"] == p), None)
        return f"raising the trust of {who} to {after} (from {before}) removes its permission to {act} {what}{ctx}"
    if inv == "newly-permitted":
        return f"{who} may now {act} {what}{ctx}"
    if inv == "newly-denied":
        return f"{who} may no longer {act} {what}{ctx}"
    return f"{who} may {act} {what}{ctx}"


_STRING_LIT = re.compile(r'"((?:[^"\\]|\\.)*)"')


def policy_strings(policies: list[Any]) -> frozenset[str]:
    """The string literals written in ``policies`` (``Policy.text``), unescaped for the common escapes: a role
    no policy names decides nothing, so a summary leaves it out."""
    return _strings_of("\n".join(getattr(p, "text", "") for p in policies))


@lru_cache(maxsize=8)
def _strings_of(text: str) -> frozenset[str]:
    out = set()
    for m in _STRING_LIT.finditer(text):
        try:
            out.add(json.loads('"' + m.group(1) + '"'))
        except ValueError:
            out.add(m.group(1))
    return frozenset(out)
