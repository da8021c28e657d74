"""The cedarpy boundary: parsing, schema validation and authorization replay.

This is the only module of ``invariants`` that calls the Cedar engine (cedarpy 4.12).
Everything else works on the typed AST (``cedarpy.pst`` dataclasses) and on plain
Cedar JSON (request dicts and entity lists in the Cedar JSON entity format,
https://docs.cedarpolicy.com/auth/entities-syntax.html).

Errors: ``PolicyInvalid`` (syntax or validation error, with file, line and column). Cedar's messages
carry no position; `locate` recovers it (``invariants.source``): a syntax error is at the first token
whose prefix of the text already fails with the file's error (LR parsers fail on the first token they
cannot shift), refined to the token the message names ("invalid variable: x", "the input `\\q` is
not a valid escape") when Cedar reports it at the end of the statement.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, NoReturn

import cedarpy
from cedarpy import pst

from .errors import PolicyInvalid
from .source import Token, find_fragment, line_col, tokens

__all__ = ["Policy", "PolicyFile", "load_policy_files", "validate", "authorize", "Replay", "parse_text",
           "check_schema", "locate"]


@dataclass(frozen=True)
class Policy:
    """One policy: the AST, where it was written (1-based line and column of its first token), and its
    display id (the ``@id`` annotation, else ``file:line``). ``template`` marks a policy template
    (``?principal``/``?resource`` slots): valid Cedar that Cedar evaluates only through links, which
    policy-check does not model (UNKNOWN)."""

    ast: pst.Template
    file: str
    line: int
    id: str
    text: str
    column: int = 1
    template: bool = False
    unmodelled: str | None = None  # why the condition is not translated (then ``ast`` has no clauses): UNKNOWN

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class PolicyFile:
    path: str
    text: str
    policies: list[Policy] = field(default_factory=list)


_LEX = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\n]*|[{}()\[\];]|[^"/{}()\[\];]+|/', re.S)


def _statements(text: str) -> list[tuple[int, str]]:
    """Split Cedar policy text into top-level statements: (offset of the first token, text)."""
    out: list[tuple[int, str]] = []
    depth, start = 0, None
    for m in _LEX.finditer(text):
        tok = m.group()
        if not tok.startswith("//") and tok.strip():
            if start is None:
                start = m.start() + len(tok) - len(tok.lstrip())
            if tok in ("{", "(", "["):
                depth += 1
            elif tok in ("}", ")", "]"):
                depth -= 1
            elif tok == ";" and depth == 0:
                out.append((start, text[start:m.end()]))
                start = None
    if start is not None:
        out.append((start, text[start:]))
    return out


def _parse_error(text: str) -> str | None:
    """Cedar's parse error for ``text``, or None when Cedar parses it (text deeper than cedarpy's typed-AST
    nesting limit parses: `parse_text` flattens it or reports UNKNOWN)."""
    try:
        _to_pst(text)
    except ValueError as exc:
        return None if NESTING in str(exc) else str(exc)
    return None


# cedarpy.policies_to_pst refuses expressions nested deeper than 100 levels ("expression nesting exceeds the
# supported limit of 100 levels"): a chain of 99 `||` or `&&` is that deep, though Cedar parses, validates and
# evaluates it.
NESTING = "expression nesting exceeds"
NESTING_LIMIT = 100
NESTING_MODELLED = 500  # deeper (original, unbalanced) expressions are UNKNOWN: see `_flattened`
_DEEP_STACK = 512 * 1024 * 1024  # bytes of (virtual) stack for the thread reading deep Cedar JSON
_DEEP_RECURSION = 200_000


def _deep(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread with a large stack and recursion limit: ``json.loads`` of a long chain's Cedar JSON
    (two objects per level) recurses once per level. Returns its value or raises its exception."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["v"] = fn()
        except BaseException as exc:  # noqa: BLE001 — re-raised on the caller's thread
            out["e"] = exc

    old_stack, old_limit = threading.stack_size(), sys.getrecursionlimit()
    threading.stack_size(_DEEP_STACK)
    sys.setrecursionlimit(max(old_limit, _DEEP_RECURSION))
    try:
        t = threading.Thread(target=run, name="policy-check-deep")
        t.start()
        t.join()
    finally:
        threading.stack_size(old_stack)
        sys.setrecursionlimit(old_limit)
    if "e" in out:
        raise out["e"]
    return out["v"]


def _balance(node: Any) -> Any:
    """Cedar JSON (EST) with every chain of one operator ``&&`` or ``||`` rebuilt as a balanced tree, in the same
    left-to-right order. Exact: both operators are associative in Cedar, errors and short-circuiting included
    (``(a || b) || c`` and ``a || (b || c)`` evaluate ``a``, then ``b`` only when ``a`` is false, then ``c``
    only when both are, and raise the first error met). A chain of n terms becomes ⌈log2 n⌉ levels deep."""
    if isinstance(node, list):
        return [_balance(x) for x in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        op = next(iter(node))
        if op in ("&&", "||") and isinstance(node[op], dict) and set(node[op]) == {"left", "right"}:
            terms: list[Any] = []
            stack = [node]
            while stack:
                n = stack.pop()
                if isinstance(n, dict) and len(n) == 1 and op in n and isinstance(n[op], dict) \
                        and set(n[op]) == {"left", "right"}:
                    stack += [n[op]["right"], n[op]["left"]]
                else:
                    terms.append(_balance(n))

            def build(ts: list[Any]) -> Any:
                if len(ts) == 1:
                    return ts[0]
                mid = len(ts) // 2
                return {op: {"left": build(ts[:mid]), "right": build(ts[mid:])}}

            return build(terms)
    return {k: _balance(v) for k, v in node.items()}


def _depth(node: Any) -> int:
    """Nesting depth of the expressions in Cedar JSON (EST): one level per operator object (iterative)."""
    best, stack = 0, [(node, 0)]
    while stack:
        n, d = stack.pop()
        if isinstance(n, dict):
            if len(n) == 1 and next(iter(n)) not in ("Value", "Var", "Slot", "__entity"):
                d += 1
            stack += [(v, d) for v in n.values()]
        elif isinstance(n, list):
            stack += [(v, d) for v in n]
        best = max(best, d)
    return best


def _flattened(stmt: str) -> tuple[tuple[Any, bool], str | None]:
    """The typed AST of one statement too deep for cedarpy's converter: its &&/|| chains balanced (`_balance`),
    through Cedar's own JSON form and back. Returns ``((ast, template), None)``, or ``((ast without its
    conditions, template), reason)`` when the statement is deeper than `NESTING_MODELLED` (Cedar's evaluator
    fails on very deep expressions with "recursion limit reached", at a depth that depends on the stack left:
    about 1,700 `||` terms on an 8 MiB main thread) or still too deep for the converter once balanced; the
    caller reports every check such a policy can affect as UNKNOWN naming the limit, never as invalid."""
    doc = _deep(lambda: json.loads(cedarpy.policies_to_json_str(stmt)))
    conds = [pol.get("conditions", []) for g in ("staticPolicies", "templates") for pol in doc.get(g, {}).values()]
    depth = _depth(conds)
    if depth <= NESTING_MODELLED:
        try:
            balanced = _deep(lambda: json.dumps(_balance(doc)))
            return _only(_to_pst(cedarpy.policies_from_json_str(balanced))), None
        except (ValueError, RecursionError):  # no chain to balance: still too deep for the converter
            reason = (f"expression nesting deeper than the {NESTING_LIMIT} levels cedarpy's typed AST supports "
                      "once its &&/|| chains are flattened")
    else:
        reason = (f"expression nesting {depth} levels deep, beyond the {NESTING_MODELLED} levels policy-check "
                  "models (Cedar's evaluator stops with \"recursion limit reached\" on deep enough expressions)")
    for cs in conds:
        cs.clear()
    return _only(_to_pst(cedarpy.policies_from_json_str(json.dumps(doc)))), reason


def _to_pst(text: str) -> Any:
    """``cedarpy.policies_to_pst(text)`` on a thread with a large stack: the converter recurses natively and a
    chain of a few thousand terms overflows a main thread's stack before it reports its nesting limit."""
    return _deep(lambda: cedarpy.policies_to_pst(text))


def _only(ps: Any) -> tuple[Any, bool]:
    """The one policy or template of a parsed statement, and whether it is a template."""
    if ps.static_policies:
        return next(iter(ps.static_policies.values())), False
    return next(iter(ps.templates.values())), True


_FRAGMENT = re.compile(r"`([^`]*)`")


_CLOSED_STR = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_CEDAR_OPS = {"==", "!=", "<=", ">=", "&&", "||", "::", "(", ")", "[", "]", "{", "}", ",", ";", ".", ":", "<", ">",
              "!", "+", "-", "*", "%", "@", "?", "="}


def locate(text: str, message: str, parse: Callable[[str], str | None], reverse: bool = True) -> int:
    """Offset in ``text`` of the error ``message`` that ``parse(text)`` reports (``parse`` answers a
    text's error message, or None when it parses).

    Cedar's parser recovers at the end of a statement and reports the first error of a complete text,
    but "unexpected end of input" for any prefix that stops inside a statement. So: (1) the statement
    is the first whose end (a ``;`` outside brackets) closes a prefix that fails with ``message``
    (binary search over statement ends); (2) inside it, an "unexpected token `X`" is the first ``X``
    whose prefix, closed with ``;``, already fails with ``message``; an "invalid token" the first lexeme
    Cedar cannot read (an unterminated string, a stray character); any other message (Cedar's
    conversion errors: "invalid variable: x", "the input `\\q` is not a valid escape") the first
    token the message names — a `backticked` fragment, the last one first when ``reverse``, or the
    text after the last ": " — else the statement's first token."""
    toks = tokens(text)
    if not toks:
        return 0
    bare = message.removeprefix("error parsing schema: ")
    if bare.startswith("unexpected end of input"):
        return toks[-1].end
    cuts, depth = [], 0
    for i, t in enumerate(toks):
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth = max(0, depth - 1)
        elif t.text == ";" and depth == 0:
            cuts.append(i)
    lo, hi = 0, len(cuts)  # the answer is a cut index in [0, len(cuts)]; len(cuts) means "after the last"
    while lo < hi:
        mid = (lo + hi) // 2
        if parse(text[:toks[cuts[mid]].end]) == message:
            hi = mid
        else:
            lo = mid + 1
    first = cuts[lo - 1] + 1 if lo > 0 else 0
    last = cuts[lo] if lo < len(cuts) else len(toks) - 1
    first = min(first, last)
    if bare.startswith("unexpected token"):
        named = _FRAGMENT.findall(bare)
        cands = [i for i in range(first, last + 1) if named and toks[i].text == named[0]]
        if named and named[0] == ";" and cands:
            return toks[cands[0]].start
        for i in cands:
            if parse(text[:toks[i].end] + " ;") == message:
                return toks[i].start
        return toks[cands[0]].start if cands else toks[first].start
    if bare.startswith("invalid token"):
        for t in toks[first:last + 1]:
            if (t.kind == "str" and not _CLOSED_STR.fullmatch(t.text)) or \
                    (t.kind == "op" and t.text not in _CEDAR_OPS):
                return t.start
        return toks[first].start
    return _refine(text, toks, first, last, message, reverse, parse)


def _fragments(message: str, reverse: bool) -> list[str]:
    frags = _FRAGMENT.findall(message)
    if reverse:
        frags.reverse()
    if ": " in message:
        frags.append(message.rsplit(": ", 1)[1].strip())
    return [f for f in frags if f]


def _occurrences(text: str, toks: list[Token], frag: str, lo: int, k: int, attribute: bool) -> list[int]:
    """Every offset among tokens ``lo..k`` where `find_fragment` finds ``frag``, in order."""
    out: list[int] = []
    j = lo
    while j <= k:
        off = find_fragment(text, toks, frag, j, k, attribute)
        if off is None:
            break
        out.append(off)
        j = next((i for i in range(j, k + 1) if toks[i].end > off), k) + 1
    return out


def _removal_fixes(text: str, toks: list[Token], lo: int, k: int, off: int,
                   parse: Callable[[str], str | None]) -> bool:
    """Whether the statement of tokens ``lo..k`` parses once the token starting at ``off`` is removed."""
    t = next((x for x in toks[lo:k + 1] if x.start == off), None)
    if t is None:
        return False
    a, b = toks[lo].start, toks[k].end
    return parse(text[a:t.start] + " " + text[t.end:b]) is None


def _refine(text: str, toks: list[Token], lo: int, k: int, message: str, reverse: bool,
            parse: Callable[[str], str | None] | None = None) -> int:
    """The token of statement ``lo..k`` that a conversion error names. A name can occur more than once
    (``when`` as the policy's condition and as a stray call ``when (…)``), and a message can name several
    (``like`` and ``principal``): the first occurrence of any whose removal lets the statement parse is
    the offending one, else the first occurrence of the first name found. A message naming no token ("function
    calls must be of the form …") is at the first token whose removal lets the statement parse, else at
    the statement's first token."""
    attribute = "attribute `" in message
    if message.startswith("duplicate annotation: "):  # the second one is the duplicate
        frag = message.split(": ", 1)[1]
        first = find_fragment(text, toks, frag, lo, k)
        later = [i for i, t in enumerate(toks) if lo <= i <= k and first is not None and t.start > first]
        again = find_fragment(text, toks, frag, later[0], k) if later else None
        if again is not None:
            return again
    found = [offs for offs in (_occurrences(text, toks, f, lo, k, attribute) for f in _fragments(message, reverse))
             if offs]
    if found:
        if parse is not None and (len(found) > 1 or len(found[0]) > 1):
            fixed = next((o for offs in found for o in offs if _removal_fixes(text, toks, lo, k, o, parse)), None)
            if fixed is not None:
                return fixed
        return found[0][0]
    if parse is not None and k - lo < 400:
        fixed = next((t.start for t in toks[lo:k + 1] if _removal_fixes(text, toks, lo, k, t.start, parse)), None)
        if fixed is not None:
            return fixed
    return toks[lo].start


def parse_text(text: str, path: str) -> PolicyFile:
    """Parse one policy file; raises ``PolicyInvalid`` naming the offending token's line and column.

    A statement deeper than cedarpy's typed-AST limit (a chain of 99 or more ``||``/``&&`` terms) is valid
    Cedar: its chains are balanced (`_flattened`); one still too deep keeps no condition and is marked
    ``unmodelled`` (the checks it can affect are UNKNOWN naming the limit)."""
    pf = PolicyFile(path, text)
    stmts = _statements(text)
    if not stmts:
        return pf
    try:
        ps = _to_pst(text)
    except ValueError as exc:
        if NESTING not in str(exc):
            _invalid(text, path, exc)
        ps = None
    if ps is None:
        asts: list[tuple[Any, bool, str | None]] = []
        for _, st in stmts:
            try:
                asts.append((*_only(_to_pst(st)), None))
            except ValueError as exc:
                if NESTING not in str(exc):
                    _invalid(text, path, exc)
                (ast, tpl), why = _flattened(st)
                asts.append((ast, tpl, why))
    else:
        # Cedar numbers policies and templates together in source order (policy0, policy1, ...). A template is
        # kept, so that every check it can affect answers UNKNOWN naming it (translate: "template slot").
        def order(kv: tuple[str, Any]) -> int:
            m = re.fullmatch(r"policy(\d+)", kv[0])
            return int(m.group(1)) if m else -1

        pols = sorted([(k, v, False) for k, v in ps.static_policies.items()] +
                      [(k, v, True) for k, v in ps.templates.items()], key=lambda kv: order(kv[:2]))
        if len(pols) != len(stmts) or any(order(p[:2]) < 0 for p in pols):
            raise PolicyInvalid([(path, 1, "-", "could not locate policies in the file")])
        asts = [(p, tpl, None) for _, p, tpl in pols]
    if len(asts) != len(stmts):
        raise PolicyInvalid([(path, 1, "-", "could not locate policies in the file")])
    for (off, st), (p, tpl, why) in zip(stmts, asts):
        ln, col = line_col(text, off)
        pid = p.annotations.get("id") or f"{Path(path).name}:{ln}"
        pf.policies.append(Policy(p, path, ln, pid, st.strip(), col, tpl, why))
    return pf


def _invalid(text: str, path: str, exc: ValueError) -> NoReturn:
    off = locate(text, str(exc), _parse_error)
    line, col = line_col(text, off)
    raise PolicyInvalid([(path, line, "-", f"syntax error: {exc}")], [col]) from exc


def load_policy_files(paths: list[Path]) -> list[PolicyFile]:
    """Parse each ``.cedar`` file; policy order is file order, then source order."""
    return [parse_text(p.read_text(encoding="utf-8"), str(p)) for p in paths]


def _schema_error(schema_text: str) -> str | None:
    res = cedarpy.validate_policies("", schema_text)
    for err in res.errors:
        return re.sub(r"^Schema parse error: ", "", err.error)
    return None


_JSON_POS = re.compile(r"at line (\d+) column (\d+)$")
_UNRESOLVED = re.compile(r"^failed to resolve types?: (.+)$")
_TWICE = re.compile(r"^error parsing schema: `([^`]+)` is declared twice$")


def _declarations(toks: list[Token], name: str) -> list[int]:
    """Offsets where ``name`` is declared (``entity N``, ``action "n", m``, ``type N``; a name in the
    head of a declaration, before ``in``, ``appliesTo``, ``=`` or a body)."""
    out, head = [], False
    for i, t in enumerate(toks):
        if t.text in ("entity", "action", "type") and (i == 0 or toks[i - 1].text in (";", "{", "}", ")")):
            head = True
            continue
        if head and t.text in ("in", "appliesTo", "=", "{", "[", ";", "tags", "enum"):
            head = False
        if head and t.text != "," and (t.text == name or (t.kind == "str" and t.text[1:-1] == name)):
            out.append(t.start)
    return out


def check_schema(schema_text: str, file: str) -> None:
    """Have Cedar parse the schema (either format); raises ``PolicyInvalid`` at the line and column of
    the error: the offending token of a syntax error, the first reference to an unresolved type, the
    declaration a "declared twice" names, serde's position in a JSON schema."""
    msg = _schema_error(schema_text)
    if msg is None:
        return
    m, u, twice = _JSON_POS.search(msg), _UNRESOLVED.match(msg), _TWICE.match(msg)
    toks = tokens(schema_text)
    decl = _declarations(toks, twice.group(1)) if twice else []
    if m:
        line, col = int(m.group(1)), int(m.group(2))
    elif len(decl) >= 2:
        line, col = line_col(schema_text, decl[1])
    else:
        offs: list[int] = []
        if u:
            for name in (n.strip() for n in u.group(1).split(",")):
                o = find_fragment(schema_text, toks, name, 0, len(toks) - 1)
                if o is not None:
                    offs.append(o)
        off = min(offs) if offs else locate(schema_text, msg, _schema_error, reverse=False)
        line, col = line_col(schema_text, off)
    raise PolicyInvalid([(file, line, "-", f"schema error: {msg}")], [col])


def validate(policies: list[Policy], schema_text: str, what: str = "policy", schema_file: str = "schema") -> None:
    """Validate ``policies`` against the schema (Cedar strict validation,
    https://docs.cedarpolicy.com/policies/validation.html); raises ``PolicyInvalid``
    listing every error with file, line and column (the token the message names, else the policy's
    first). Duplicate ``@id`` annotations are errors too. A schema Cedar rejects is reported by
    `check_schema` at its position in ``schema_file``."""
    check_schema(schema_text, schema_file)
    problems: list[tuple[str, int, str, str]] = []
    cols: list[int] = []
    seen: dict[str, Policy] = {}
    for p in policies:
        if p.id in seen:
            problems.append((p.file, p.line, p.id, f"duplicate {what} id (first at {seen[p.id].file}:{seen[p.id].line})"))
            cols.append(p.column)
        seen[p.id] = p
    if policies:
        text = "\n".join(p.text for p in policies)
        try:
            res = cedarpy.validate_policies(text, schema_text)
        except ValueError as exc:
            raise PolicyInvalid([(schema_file, 0, "-", f"schema rejected by Cedar: {exc}")]) from exc
        for err in res.errors:
            m = re.fullmatch(r"policy(\d+)", err.policy_id or "")
            pol = policies[int(m.group(1))] if m and int(m.group(1)) < len(policies) else None
            msg = re.sub(r"^for policy `policy\d+`, ", "", err.error)
            line, col = (pol.line, pol.column) if pol else (0, 0)
            if pol is not None:
                toks = tokens(pol.text)
                off = None
                for frag in _fragments(msg, reverse=False):
                    off = find_fragment(pol.text, toks, frag, 0, len(toks) - 1, "attribute `" in msg)
                    if off is not None:
                        break
                if off is None:  # a type error names no token: the operand of the condition that has it
                    off = _operand_with(pol.text, toks, err.error, schema_text)
                if off is not None:
                    dl, dc = line_col(pol.text, off)
                    line, col = pol.line + dl - 1, (pol.column + dc - 1 if dl == 1 else dc)
            where = (pol.file if pol else "?", line, pol.id if pol else err.policy_id)
            # Cedar may report one fault twice ("unexpected type …" and "the types … are not compatible"):
            # one problem per position, its messages joined.
            same = next((i for i, (f, ln, pid, _) in enumerate(problems)
                         if (f, ln, pid) == where and cols[i] == col), None)
            if same is not None:
                if msg not in problems[same][3]:
                    problems[same] = (*where, f"{problems[same][3]}; {msg}")
                continue
            problems.append((*where, msg))
            cols.append(col)
    if problems:
        raise PolicyInvalid(problems, cols)


def _operand_with(text: str, toks: list[Token], error: str, schema_text: str) -> int | None:
    """Offset in a policy's ``text`` of the first top-level ``&&``/``||`` operand of a ``when``/``unless``
    body that, validated alone in the policy's scope, gives the same error (Cedar's validator reports type
    errors without a position), or None."""
    bare = re.sub(r"^for policy `policy\d+`, ", "", error)
    head_end = next((i for i, t in enumerate(toks) if t.text in ("when", "unless")), None)
    if head_end is None:
        return None
    head = text[:toks[head_end].start]
    i = head_end
    while i < len(toks):
        if toks[i].text in ("when", "unless") and i + 1 < len(toks) and toks[i + 1].text == "{":
            kw, j, depth, start = toks[i].text, i + 2, 0, i + 2
            spans = []
            while j < len(toks):
                t = toks[j].text
                if t in ("(", "[", "{"):
                    depth += 1
                elif t in (")", "]", "}"):
                    if depth == 0:
                        break
                    depth -= 1
                elif t in ("&&", "||") and depth == 0:
                    spans.append((start, j - 1))
                    start = j + 1
                j += 1
            spans.append((start, j - 1))
            if len(spans) > 1:
                for a, b in spans:
                    if a > b:
                        continue
                    cand = f"{head} {kw} {{ {text[toks[a].start:toks[b].end]} }};"
                    try:
                        res = cedarpy.validate_policies(cand, schema_text)
                    except ValueError:
                        continue
                    if any(re.sub(r"^for policy `policy\d+`, ", "", e.error) == bare for e in res.errors):
                        return toks[a].start
            i = j
        i += 1
    return None


@dataclass(frozen=True)
class Replay:
    """Cedar's answer for one request: ``allow``, the ids of the determining policies
    and of the policies whose evaluation errored (display ids)."""

    allow: bool
    reasons: frozenset[str]
    errors: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        return {"decision": "allow" if self.allow else "deny",
                "reasons": sorted(self.reasons), "errors": sorted(self.errors)}


@lru_cache(maxsize=64)
def _policy_set(text: str) -> Any:
    """A parsed cedarpy PolicySet for ``text`` (kept: a replay or policy test does not re-parse the set;
    ids stay ``policy0``, ``policy1``, … in source order), or the text itself if Cedar rejects it (then
    is_authorized reports the error as before)."""
    try:
        return cedarpy.PolicySet.from_str(text)
    except Exception:  # noqa: BLE001 — is_authorized gives the engine's own answer for such text
        return text


@lru_cache(maxsize=16)
def _schema(schema_text: str | None) -> Any:
    """A parsed cedarpy Schema for ``schema_text`` (kept across calls), None for none, or the text itself
    if Cedar rejects it."""
    if schema_text is None:
        return None
    try:
        return cedarpy.Schema.from_str(schema_text)
    except Exception:  # noqa: BLE001
        return schema_text


def authorize(request: dict[str, Any], policies: list[Policy], entities: list[dict[str, Any]],
              schema_text: "str | cedarpy.Schema | None") -> Replay:
    """Evaluate one request with cedarpy.is_authorized.

    ``request``: {"principal": {"type","id"}, "action": {...}, "resource": {...}, "context": {...}}.
    A request or entity set that Cedar rejects (schema violation) counts as Deny with the
    engine's message in ``errors`` — the sidecar denies it the same way.
    """
    text = "\n".join(p.text for p in policies)
    ids = [p.id for p in policies]
    schema = _schema(schema_text) if schema_text is None or isinstance(schema_text, str) else schema_text
    res = cedarpy.is_authorized(request, _policy_set(text), entities, schema)

    def _name(pid: str) -> str:
        m = re.fullmatch(r"policy(\d+)", pid)
        return ids[int(m.group(1))] if m and int(m.group(1)) < len(ids) else pid

    errs = set()
    for e in res.diagnostics.errors:
        m = re.search(r"policy `(policy\d+)`", e)
        errs.add(_name(m.group(1)) if m else e)
    return Replay(res.decision == cedarpy.Decision.Allow,
                  frozenset(_name(r) for r in res.diagnostics.reasons), frozenset(errs))
