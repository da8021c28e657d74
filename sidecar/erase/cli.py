"""``memwarden erase [--verify]``: purge the backend's deleted data from its disk, and check what remains.

Settings as every command (`sidecar.config.load_settings`): the backend kind (``MEMWARDEN_BACKEND``), its data
directory (``MEMWARDEN_ERASE_DATA_PATH`` or ``--data-path``) and the ledger (``MEMWARDEN_LEDGER_URL`` /
``MEMWARDEN_LEDGER_PATH``, ``--ledger FILE``). Steps: report the deletes the backend confirmed and those still
pending; purge (`sidecar.erase.BACKENDS`: Chroma runs ``chroma vacuum``; Mem0 has nothing to run) unless
``--no-purge``; with ``--verify``, match the given texts against the ledger's content digests and scan the data
directory (and every ``--scan DIR``) for them.

Texts come from ``--text-file FILE`` (one per line; ``-`` reads standard input) or ``--text`` (visible in the
process list and shell history: prefer the file). They are never written anywhere; the report names them by
number. Exit codes: 0 purged and (with ``--verify``) no text found in a complete scan · 1 a text (or a piece
of it) remains, a file could not be read, or the purge failed · 2 refused input or settings.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from sidecar.config import ConfigError, Settings, load_settings
from sidecar.erase import BACKENDS, EraseError, Purge, VerifyReport, verify

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _settings(ledger: Optional[Path]) -> Settings:
    try:
        return load_settings(**({"ledger_path": ledger, "ledger_url": None} if ledger else {}))
    except ConfigError as exc:
        err.print(f"memwarden: configuration refused: {exc}", markup=False)
        raise typer.Exit(2) from None


def _refuse(message: str) -> typer.Exit:
    err.print(f"memwarden erase: {message}", markup=False)
    return typer.Exit(2)


def read_texts(texts: list[str], text_file: Optional[str]) -> list[str]:
    """The texts to look for: each ``--text``, then each non-empty line of `text_file` (``-``: stdin), in order.
    Raises `typer.Exit` (2) for a file that cannot be read as UTF-8."""
    out_texts = [t for t in texts if t]
    if text_file:
        try:
            raw = sys.stdin.read() if text_file == "-" else Path(text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _refuse(f"--text-file {text_file}: {getattr(exc, 'strerror', None) or exc}") from None
        out_texts += [line for line in raw.splitlines() if line]
    return out_texts


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _when(us: int | None) -> str:
    return "none yet" if us is None else datetime.fromtimestamp(us / 1e6, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(doc: dict[str, Any], report: VerifyReport | None) -> list[str]:
    """The text report (`doc` is the JSON report)."""
    module = BACKENDS[doc["backend"]]
    lines = [f"memwarden erase: {doc['backend']}" + (f", data directory {doc['data_path']}" if doc["data_path"] else "")]
    d = doc["deletes"]
    lines.append(f"  deletes   newest confirmed by the backend: {_when(d['newest_confirmed_us'])}; {d['pending']} pending "
                 "(the sidecar's reconciler retries them; not purged before the backend deletes them)")
    p = doc["purge"]
    if doc.get("purge_error"):
        lines.append(f"  purge     FAILED: {doc['purge_error']}")
    elif p is None:
        lines.append("  purge     skipped (--no-purge)")
    elif p["ran"]:
        lines.append(f"  purge     ran `{p['command']}` in {p['seconds']:.2f} s: {p['what']}")
    else:
        lines.append(f"  purge     {p['what']}")
    if report is None:
        return lines
    lines.append(f"  verify    {len(report.texts)} text(s); {report.files} files ({_size(report.bytes)}) scanned in "
                 + ", ".join(report.roots))
    for t in report.texts:
        rows = (f"the content of {t.deleted_count} deleted row(s)" + (f" ({', '.join(t.deleted_rows)})" if t.deleted_rows else "")
                if t.deleted_count else "not the content of any deleted row in the ledger (up to normalisation)")
        live = f"; {t.live_count} live row(s) hold the same content (their copies are found too)" if t.live_count else ""
        lines.append(f"  text {t.number}    {rows}{live}")
        if not t.found:
            lines.append("            not found")
        for f in t.found:
            if f.places:
                where = ", ".join(f"{n} in {k}" for k, n in sorted(f.where.items()))
                forms = ", ".join(f"{k} ×{n}" for k, n in sorted(f.forms.items()))
                lines.append(f"            REMAINS in {f.file}: {f.places} place(s) ({forms}; {where}) at offsets "
                             + ", ".join(map(str, f.offsets)))
            else:
                lines.append(f"            PIECES in {f.file}: {f.pieces_found} of its {f.pieces_total} 32-byte pieces "
                             "(a text split across storage pages, or shared phrasing)")
            hint = module.hint(f.file)
            if hint:
                lines.append(f"              {hint}")
    for u in report.unreadable:
        lines.append(f"  NOT READ  {u}")
    found = sum(1 for t in report.texts if t.remains)
    lines.append("  result    " + ("nothing found: none of the texts is in the files scanned" if report.clean else
                                   f"{found} of {len(report.texts)} text(s) remain on disk" if found else
                                   "incomplete: some files could not be read"))
    lines.append("  a byte scan cannot see:")
    lines += [f"    - {c}" for c in report.cannot_see]
    return lines


def erase(
    data_path: Optional[Path] = typer.Option(None, "--data-path", help="the backend's data directory on this host (else MEMWARDEN_ERASE_DATA_PATH)"),
    verify_: bool = typer.Option(False, "--verify", help="scan for the given texts after the purge and report what remains"),
    text: Optional[list[str]] = typer.Option(None, "--text", help="a deleted text to look for (repeatable; visible in ps: prefer --text-file)"),
    text_file: Optional[str] = typer.Option(None, "--text-file", help="deleted texts to look for, one per line ('-': stdin)"),
    scan_dirs: Optional[list[Path]] = typer.Option(None, "--scan", help="another directory to scan (repeatable): backups, a vector store's data"),
    no_purge: bool = typer.Option(False, "--no-purge", help="only report (and verify); run nothing"),
    timeout: float = typer.Option(600.0, min=1, help="seconds the backend's purge may take"),
    chroma_cli: Optional[str] = typer.Option(None, help="the `chroma` command (else beside this Python, else on PATH)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file (else MEMWARDEN_LEDGER_URL / MEMWARDEN_LEDGER_PATH)"),
    fmt: str = typer.Option("text", "--format", help="text or json"),
) -> None:
    """Purge the backend's deleted data from its disk (Chroma: `chroma vacuum`; Mem0: nothing it offers) and,
    with --verify, scan for given texts and report what remains and where."""
    if fmt not in ("text", "json"):
        raise _refuse("--format is text or json")
    settings = _settings(ledger)
    backend = settings.backend
    module = BACKENDS[backend]
    data_path = data_path or settings.erase_data_path
    texts = read_texts(text or [], text_file)
    roots = ([data_path] if data_path else []) + list(scan_dirs or [])
    if verify_ and not texts:
        raise _refuse("--verify needs the deleted texts (--text-file FILE, or --text): memwarden keeps only keyed "
                      "digests of deleted content, never the text, so it cannot search for it by itself")
    if verify_ and not roots:
        raise _refuse("--verify needs a directory to scan: --data-path (or MEMWARDEN_ERASE_DATA_PATH), or --scan DIR")
    if not no_purge and backend == "chroma" and data_path is None:
        raise _refuse("Chroma's purge runs `chroma vacuum` on its data directory: give --data-path (the `chroma run --path` "
                      "directory, on this host) or --no-purge")
    if verify_:
        missing = [str(r) for r in roots if not r.is_dir()]
        if missing:
            raise _refuse(f"not a directory: {', '.join(missing)}")
    if not no_purge and backend == "chroma" and data_path is not None:
        from sidecar.erase import chroma

        try:
            chroma.check_data_path(data_path)
            chroma.cli(chroma_cli)
        except EraseError as exc:
            raise _refuse(str(exc)) from None

    from sidecar.ledger import ledger_from_settings

    store = ledger_from_settings(settings)
    ok = True
    report: VerifyReport | None = None
    try:
        doc: dict[str, Any] = {"backend": backend, "data_path": str(data_path) if data_path else None,
                               "deletes": {"newest_confirmed_us": store.last_backend_delete(backend),
                                           "pending": len(store.pending_tombstones(backend))},
                               "purge": None, "purge_error": None, "verify": None}
        if not no_purge:
            try:
                result: Purge = module.purge(data_path, timeout, chroma_cli) if backend == "chroma" else module.purge()
                doc["purge"] = result.to_json()
            except EraseError as exc:
                doc["purge_error"], ok = str(exc), False
        if verify_:
            try:
                report = verify(store, backend, roots, texts)
            except EraseError as exc:
                raise _refuse(str(exc)) from None
            doc["verify"] = report.to_json()
            ok = ok and report.clean
    finally:
        store.close()
    doc["ok"] = ok
    if fmt == "json":
        out.print(json.dumps(doc, indent=1), markup=False)
    else:
        for line in render(doc, report):
            out.print(line, markup=False)
    raise typer.Exit(0 if ok else 1)
