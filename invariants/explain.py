"""``policy-check explain``: the access matrix (``invariants.matrix``) as tables a reviewer reads, and
its diff between two policy sets.

One table per action (actions with identical tables share one): rows are classes of principals (kind,
trust, relation to the row: tenant, owner, fleet), columns classes of resources and context (scope,
status, reader, target fleet, resource type); a cell is ✓ (permitted for every request of the class),
✗ (denied for every request), ~ (depends on something outside the dimensions: a witness of each side
in ``--format json``), ∅ (no such request) or ? (unknown). Rows and columns that differ in one
dimension and hold the same verdicts are merged, so "trust 2, ≥3" or "any scope" stand for all the
classes they merge; a dimension that does not apply to a row (a tenant admin has no trust) is blank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import product
from typing import Any

from rich.console import Console
from rich.table import Table

from .matrix import COL_ORDER, DIMS, KIND, ROW_ORDER, SYMBOL, Cell, Change, Matrix, MatrixDiff

__all__ = ["Grid", "grids", "render_matrix", "render_diff", "matrix_json", "diff_json", "class_text", "change_text",
           "wrap", "diff_markdown"]

NA = "—"
LIMIT = 12  # witness lines printed by render_diff
STYLE = {"✓": "green", "✗": "red", "~": "yellow", "∅": "dim", "?": "magenta"}
_VALUES: dict[str, list[str]] = {}
for _d in DIMS:
    _VALUES.setdefault(_d.name, [])
    _VALUES[_d.name] += [v for v, _ in _d.values if v not in _VALUES[_d.name]]


@dataclass
class Grid:
    """A merged table: ``rows``/``cols`` are labels (dimension → set of values), ``cells[r][c]`` symbols."""

    actions: list[str]
    rows: list[dict[str, frozenset[str]]]
    cols: list[dict[str, frozenset[str]]]
    cells: list[list[str]]

    def signature(self) -> tuple[Any, ...]:
        return (tuple(tuple(sorted((k, tuple(sorted(v))) for k, v in r.items())) for r in self.rows),
                tuple(tuple(sorted((k, tuple(sorted(v))) for k, v in c.items())) for c in self.cols),
                tuple(tuple(r) for r in self.cells))


def _row_of(c: Cell | Change) -> dict[str, str]:
    out = {"principal": KIND.get(c.principal, c.principal)}
    for d in ROW_ORDER[1:]:
        out[d] = c.coords.get(d, NA)
    return out


def _merge(labels: list[dict[str, frozenset[str]]], vectors: list[tuple[str, ...]], order: tuple[str, ...]
           ) -> tuple[list[dict[str, frozenset[str]]], list[tuple[str, ...]]]:
    """Merge items whose vectors are equal and whose labels differ in exactly one dimension (union of
    that dimension's values), dimension by dimension in ``order``, until nothing merges."""
    items = [(dict(lab), vec) for lab, vec in zip(labels, vectors)]
    changed = True
    while changed:
        changed = False
        for dim in order:
            i = 0
            while i < len(items):
                j = i + 1
                while j < len(items):
                    (a, va), (b, vb) = items[i], items[j]
                    if va == vb and all(a[k] == b[k] for k in a if k != dim) and a[dim] != b[dim]:
                        a[dim] = a[dim] | b[dim]
                        del items[j]
                        changed = True
                    else:
                        j += 1
                i += 1
    return [lab for lab, _ in items], [vec for _, vec in items]


def _grid(action: str, cells: list[Any], symbol: Any) -> Grid:
    rtypes = sorted({c.resource for c in cells})
    cdims = [d for d in COL_ORDER[1:] if any(d in c.coords for c in cells)]
    col_values = [rtypes] + [[v for v in _VALUES[d] if any(c.coords.get(d) == v for c in cells)] for d in cdims]
    cols = [dict(zip(("resource", *cdims), combo)) for combo in product(*col_values)]
    rows: list[dict[str, str]] = []
    for c in cells:
        r = _row_of(c)
        if r not in rows:
            rows.append(r)
    index: dict[tuple[Any, ...], list[Any]] = {}
    for c in cells:
        index.setdefault(tuple(_row_of(c).items()), []).append(c)

    def at(r: dict[str, str], col: dict[str, str]) -> str:
        for c in index.get(tuple(r.items()), []):
            if c.resource == col["resource"] and all(c.coords.get(d, v) == v for d, v in col.items() if d != "resource"):
                return str(symbol(c))
        return ""

    table = [[at(r, col) for col in cols] for r in rows]
    # drop columns no row reaches (e.g. a resource type's cells under another's dimensions)
    keep = [j for j in range(len(cols)) if any(table[i][j] for i in range(len(rows)))]
    cols = [cols[j] for j in keep]
    table = [[row[j] for j in keep] for row in table]
    clabels = [{k: frozenset([v]) for k, v in col.items()} for col in cols]
    cvecs = [tuple(table[i][j] for i in range(len(rows))) for j in range(len(cols))]
    clabels, cvecs = _merge(clabels, cvecs, ("reader", "target", "status", "scope", "resource"))
    table = [[cv[i] for cv in cvecs] for i in range(len(rows))]
    rlabels = [{k: frozenset([v]) for k, v in r.items()} for r in rows]
    rlabels, rvecs = _merge(rlabels, [tuple(row) for row in table], ("trust", "fleet", "owner", "tenant"))
    return Grid([action], rlabels, clabels, [list(v) for v in rvecs])


def grids(cells: list[Any], symbol: Any) -> list[Grid]:
    """One merged grid per action; actions whose grids are identical share one."""
    by_action: dict[str, list[Any]] = {}
    for c in cells:
        by_action.setdefault(c.action, []).append(c)
    out: list[Grid] = []
    for action, cs in by_action.items():
        g = _grid(action, cs, symbol)
        same = next((x for x in out if x.signature() == g.signature()), None)
        if same is not None:
            same.actions.append(action)
        else:
            out.append(g)
    return out


def _values(dim: str, vals: frozenset[str]) -> str:
    if vals == {NA}:
        return ""
    full = set(_VALUES.get(dim, []))
    if dim in _VALUES and set(vals) >= full:
        return ""
    order = _VALUES.get(dim, sorted(vals))
    return ", ".join(v for v in order if v in vals) or ", ".join(sorted(vals))


def row_label(r: dict[str, frozenset[str]]) -> tuple[str, str]:
    who = ", ".join(sorted(r["principal"]))
    trust = _values("trust", r.get("trust", frozenset([NA])))
    if r.get("trust", frozenset([NA])) != {NA}:
        who += f", trust {trust}" if trust else ", any trust"
    rel = [x for x in (_values(d, r.get(d, frozenset([NA]))) for d in ("tenant", "owner", "fleet")) if x]
    return who, " · ".join(rel) or "any"


def col_label(c: dict[str, frozenset[str]], show_resource: bool) -> str:
    parts = []
    if show_resource:
        parts.append(", ".join(sorted(c["resource"])))
    for d in COL_ORDER[1:]:
        if d in c:
            v = _values(d, c[d])
            if v:
                parts.append(f"{d} {v}" if d in ("scope", "status") else v)
    return "\n".join(parts) or "any"


def _table(g: Grid, title: str) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
    t.add_column("principal", no_wrap=True)
    t.add_column("relation to the row", no_wrap=True)
    show_res = len({v for c in g.cols for v in c["resource"]}) > 1
    for c in g.cols:
        t.add_column(col_label(c, show_res), justify="center")
    for r, row in zip(g.rows, g.cells):
        who, rel = row_label(r)
        t.add_row(who, rel, *[f"[{STYLE.get(s[:1], '')}]{s}[/]" if s else "" for s in row])
    return t


def render_matrix(mx: Matrix, target: str, console: Console) -> None:
    """The matrix as rich tables, a legend and the figures of the proof."""
    console.print(f"[bold]Access matrix of {target}[/]: ✓ permitted for every request of the class · "
                  "✗ denied for every request · ~ depends (witnesses of both sides: --format json) · ∅ none",
                  highlight=False)
    for g in grids(mx.cells, lambda c: SYMBOL[c.verdict]):
        console.print(_table(g, ", ".join(g.actions)))
    unknown = [c for c in mx.cells if c.verdict == "unknown"]
    for c in unknown[:5]:
        console.print(f"[magenta]unknown[/] {c.action} ({c.principal} → {c.resource}): {c.message}", highlight=False)
    console.print(f"{len(mx.cells)} cells, {len({(c.action, c.principal, c.resource, tuple(sorted(c.proved_by.items()))) for c in mx.cells})} "
                  f"proved regions, {mx.queries} solver queries, {mx.replays} witnesses replayed through Cedar; "
                  f"{mx.seconds:.1f} s", highlight=False)


def matrix_json(mx: Matrix, target: str) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for c in mx.cells:
        counts[c.verdict] = counts.get(c.verdict, 0) + 1
    return {"tool": "policy-check explain", "version": 1, "target": target, "seconds": round(mx.seconds, 3),
            "queries": mx.queries, "replays": mx.replays, "verdicts": counts,
            "dimensions": {d.name: [v for v, _ in d.values] for d in DIMS},
            "cells": [c.to_json() for c in mx.cells]}


def class_text(c: Cell | Change) -> str:
    """A class in one line: "read: agent, trust 1, same tenant, not owner, other fleet → Memory, scope
    fleet, status active, not a reader"."""
    row = [KIND.get(c.principal, c.principal)] + [f"trust {c.coords['trust']}" if d == "trust" else c.coords[d]
                                                   for d in ROW_ORDER[1:] if d in c.coords]
    col = [c.resource] + [f"{d} {c.coords[d]}" if d in ("scope", "status") else c.coords[d]
                          for d in COL_ORDER[1:] if d in c.coords]
    return f"{c.action}: {', '.join(row)} → {', '.join(col)}"


def change_text(c: Change, w: Any = None) -> str:
    """A changed cell in one line (old→new verdict and its class); with a witness ``w`` of it, also the
    witness's sentence ("… may now read …", "… may no longer read …")."""
    head = f"{SYMBOL[c.old]}→{SYMBOL[c.new]} {class_text(c)}"
    if w is None:
        return head
    modal = " may now " if w is c.widen else " may no longer "
    return f"{'widened' if w is c.widen else 'narrowed'} {head}: {w.summary.replace(' may ', modal, 1)}"


def _change_symbol(c: Change) -> str:
    return f"{SYMBOL[c.old]}→{SYMBOL[c.new]}"


def wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    """``text`` broken at spaces into lines of at most ``width`` columns, continuation lines indented (a
    word longer than a line — a long path — is kept whole)."""
    import textwrap

    return textwrap.wrap(text, width=max(width, 20), subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [""]


def render_diff(diff: MatrixDiff, target: str, console: Console) -> None:
    """Changed cells as tables (old→new verdicts), then one replayed witness per changed action and
    direction, in English."""
    for i, line in enumerate(wrap(f"Access changes {target}: old→new verdict of each class whose permitted "
                                  "requests changed (✓ all, ✗ none, ~ some)", console.width, "    ")):
        console.print(line, highlight=False, markup=False, style="bold" if i == 0 else None)
    if not diff.changes:
        console.print("[green]no class of requests changed[/]")
    tables = [(g, _table(g, ", ".join(g.actions))) for g in grids(diff.changes, _change_symbol)]
    if any(console.measure(t).maximum > console.width for _, t in tables):
        # Too wide for the console (a CI log at 80 columns): one changed cell per block, old→new first.
        for c in diff.changes:
            for line in wrap(f"{_change_symbol(c)} {'widened' if c.widened else 'narrowed'} {class_text(c)}",
                             console.width, "    "):
                console.print(line, highlight=False, markup=False)
    else:
        for _, t in tables:
            console.print(t)
    lines = []
    for c in diff.changes:
        for w, word, modal in ((c.widen, "[red]widened[/]", " may now "), (c.narrow, "[yellow]narrowed[/]", " may no longer ")):
            if w is not None:
                lines.append(f"{_change_symbol(c)} {word} {c.action}: {w.summary.replace(' may ', modal, 1)} "
                             f"(replayed: old {'deny' if w is c.widen else 'allow'}, new "
                             f"{'allow' if w is c.widen else 'deny'}; {', '.join(w.reasons) or 'no policy'})")
    # one witness of each action and direction first, so that a long diff still shows every action
    firsts = {line.split(":", 1)[0]: i for i, line in reversed(list(enumerate(lines)))}
    lines = [lines[i] for i in sorted(firsts.values())] + [x for i, x in enumerate(lines) if i not in firsts.values()]
    for line in lines[:LIMIT]:
        for i, part in enumerate(wrap(line, console.width, "    ")):
            console.print(part, highlight=False, markup=i == 0)
    if len(lines) > LIMIT:
        console.print(f"… {len(lines) - LIMIT} more witnesses in --format json", highlight=False, markup=False)
    for u in diff.unknown:
        for line in wrap(f"unknown {u}", console.width, "    "):
            console.print(line, highlight=False, markup=False)
    for line in wrap(f"{len(diff.changes)} changed cells ({sum(c.widened for c in diff.changes)} widened, "
                     f"{sum(c.narrowed for c in diff.changes)} narrowed), {diff.queries} solver queries, "
                     f"{diff.replays} replays through Cedar; {diff.seconds:.1f} s", console.width, "    "):
        console.print(line, highlight=False, markup=False)


def diff_json(diff: MatrixDiff, target: str) -> dict[str, Any]:
    return {"tool": "policy-check explain --compare", "version": 1, "target": target,
            "seconds": round(diff.seconds, 3), "queries": diff.queries, "replays": diff.replays,
            "widened": diff.widened, "unknown": diff.unknown, "changes": [c.to_json() for c in diff.changes]}


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def diff_markdown(diff: MatrixDiff) -> list[str]:
    """The changed cells as a GitHub-flavoured markdown table (old→new verdict, action, class, replayed
    witness), one row per cell and direction."""
    out = ["| change | action | class of requests | witness (replayed through Cedar) |", "|---|---|---|---|"]
    for c in diff.changes:
        for w, word in ((c.widen, "widened"), (c.narrow, "narrowed")):
            if w is not None:
                modal = " may now " if word == "widened" else " may no longer "
                out.append(f"| {_change_symbol(c)} {word} | {c.action} | {_md(class_text(c).split(': ', 1)[1])} | "
                           f"{_md(w.summary.replace(' may ', modal, 1))} |")
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
