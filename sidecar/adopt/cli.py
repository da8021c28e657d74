"""``memwarden adopt chroma|mem0 --rules FILE [--dry-run]``: bring existing backend rows under governance.

Settings as every command (`sidecar.config.load_settings`): the backend URL and credential
(``MEMWARDEN_BACKEND_URL``, ``MEMWARDEN_BACKEND_TOKEN``, ``MEMWARDEN_BACKEND_AUTH_HEADER``; default header
``Authorization`` for Chroma, ``X-API-Key`` for Mem0) and the ledger (``MEMWARDEN_LEDGER_URL`` or
``MEMWARDEN_LEDGER_PATH``; ``--ledger FILE`` for an SQLite file). Exit codes: 0 done · 1 the backend or the
ledger failed (what was committed stays; run again to resume) or a Mem0 listing hit its 1000-row limit ·
2 refused input (rules file, unknown agents, a collection registered elsewhere, bad settings).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sidecar.config import ConfigError, Settings, backend_tls_context, load_settings

adopt_app = typer.Typer(help="adopt the rows of an existing Chroma collection or Mem0 store, by declared rules",
                        no_args_is_help=True)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

RULES = typer.Option(..., "--rules", exists=True, dir_okay=False, help="the rules file (TOML; see README 'Adopt')")
DRY_RUN = typer.Option(False, "--dry-run", help="print what would be assigned; register nothing in the ledger, write nothing to the backend")
BACKEND_URL = typer.Option(None, help="backend base URL (else MEMWARDEN_BACKEND_URL)")
LEDGER = typer.Option(None, help="SQLite ledger file (else MEMWARDEN_LEDGER_URL / MEMWARDEN_LEDGER_PATH)")
REPORT = typer.Option(None, help="write the whole report (every uncovered row) to this JSON file")
FORMAT = typer.Option("text", "--format", help="text or json (the report on stdout)")
SHOW = typer.Option(20, min=0, help="uncovered rows listed in the text report")


def _settings(ledger: Optional[Path], backend_url: Optional[str]) -> Settings:
    overrides: dict[str, Any] = {}
    if ledger:
        overrides.update(ledger_path=ledger, ledger_url=None)
    if backend_url:
        overrides["backend_url"] = backend_url
    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        err.print(f"memwarden: configuration refused: {exc}", markup=False)
        raise typer.Exit(2) from None


def _open_store(settings: Settings) -> Any:
    """The ledger, or a one-line refusal naming it and what to check (exit 1, as `memwarden keys`)."""
    from sidecar.errors import LedgerOpenError
    from sidecar.ledger import ledger_from_settings

    try:
        return ledger_from_settings(settings)
    except LedgerOpenError as exc:
        err.print(f"memwarden adopt: {exc}", markup=False)
        raise typer.Exit(1) from None


def _refuse(message: str, code: int = 2) -> typer.Exit:
    err.print(f"memwarden adopt: {message}", markup=False)
    return typer.Exit(code)


def _auth_header(settings: Settings, default: str) -> str:
    return settings.backend_auth_header if "backend_auth_header" in settings.model_fields_set else default


def _check_agents(rules: Any, ledger: Any) -> None:
    named = rules.agents()
    unknown = sorted(named - set(ledger.agent_entities(named)))
    if unknown:
        raise _refuse(f"the rules name agents the ledger does not know: {', '.join(unknown)} — create their keys "
                      "first (memwarden keys create --tenant T --fleet F --agent A --trust N)")


def _progress(total: int | None, label: str) -> Progress:
    p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                 console=err, transient=True, disable=not err.is_terminal)
    p.add_task(label, total=total)
    return p


def _print(reports: list[Any], fmt: str, show: int, report_file: Optional[Path]) -> None:
    docs = [r.to_json() for r in reports]
    if report_file:
        report_file.write_text(json.dumps(docs, indent=1) + "\n", encoding="utf-8")
    if fmt == "json":
        out.print(json.dumps(docs, indent=1), markup=False)
        return
    for r in reports:
        out.print(f"{r.backend} {r.label} ({r.collection})" + (" — dry run, nothing written" if r.dry_run else ""),
                  markup=False)
        out.print(f"  scanned {r.scanned}", markup=False)
        out.print(f"  {'would adopt' if r.dry_run else 'adopted'} {r.adopted}", markup=False)
        for name, counts in (("scope", r.by_scope), ("owner", r.by_owner), ("rule", r.by_rule), ("label", r.by_label)):
            if counts:
                out.print(f"    by {name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), markup=False)
        out.print(f"  already governed {r.already} (left as they are; {r.restamped} {'would be ' if r.dry_run else ''}"
                  "re-stamped into the backend)",
                  markup=False)
        if r.changing:
            out.print(f"  changing {len(r.changing)} (stamped with other governance by an update that did not reach the "
                      "ledger: withheld from reads, left as they are until their owner updates their governance again)", markup=False)
            for row_id in r.changing[:show]:
                out.print(f"    {row_id}", markup=False)
        out.print(f"  tombstoned {r.tombstoned} (never adopted again), pending {r.pending} (writes in flight, left alone)",
                  markup=False)
        out.print(f"  not covered {len(r.uncovered)} (not adopted: they stay denied)", markup=False)
        for row_id, reason in r.uncovered[:show]:
            out.print(f"    {row_id}  {reason}", markup=False)
        if len(r.uncovered) > show:
            out.print(f"    … and {len(r.uncovered) - show} more" + (f" (all in {report_file})" if report_file else
                                                                      " (--report FILE lists them all)"), markup=False)
        for entity in r.truncated:
            out.print(f"  INCOMPLETE: Mem0 listed 1000 memories for {entity} (its limit per call): some were not seen",
                      markup=False)


@adopt_app.command("chroma")
def adopt_chroma(rules_file: Path = RULES, dry_run: bool = DRY_RUN, backend_url: Optional[str] = BACKEND_URL,
                 ledger: Optional[Path] = LEDGER, page: int = typer.Option(1000, min=1, max=5000, help="rows per get, ledger transaction and update"),
                 report: Optional[Path] = REPORT, fmt: str = FORMAT, show: int = SHOW) -> None:
    """Adopt the rows of the Chroma collections the rules file lists (its tenant is the Chroma tenant)."""
    from sidecar.adopt.engine import adopt
    from sidecar.adopt.rules import RulesError, load_rules
    from sidecar.adopt.targets import ChromaTarget, TargetError
    from sidecar.provenance import content_keys
    from sidecar.ledger import CollectionRecord, now_us

    if fmt not in ("text", "json"):
        raise typer.BadParameter("--format must be text or json")
    try:
        rules = load_rules(rules_file)
    except RulesError as exc:
        raise _refuse(str(exc)) from None
    if not rules.collections():
        raise _refuse(f"{rules_file}: no [[collection]] to adopt")
    settings = _settings(ledger, backend_url)
    store = _open_store(settings)
    reports = []
    try:
        _check_agents(rules, store)
        for spec in rules.collections():
            label = f"collection {rules.tenant}/{spec.database}/{spec.name}"
            try:
                target = ChromaTarget(str(settings.backend_url), rules.tenant, spec.database, spec.name,
                                      token=settings.backend_token, auth_header=_auth_header(settings, "Authorization"),
                                      timeout_s=max(settings.backend_timeout_s, 60.0), page=page,
                                      content_keys=content_keys(settings.chroma_content_keys),
                                      verify=backend_tls_context(settings))
            except TargetError as exc:
                raise _refuse(f"{label}: {exc}", 1) from None
            try:
                rec = store.get_collection("chroma", target.collection)
                if rec is not None and (rec.tenant, rec.database) != (rules.tenant, spec.database):
                    raise _refuse(f"{label}: its id {target.collection} is registered to {rec.tenant}/{rec.database}")
                if rec is None and not dry_run:
                    try:
                        store.register_collection(CollectionRecord("chroma", target.collection, rules.tenant, spec.database,
                                                                   spec.name, "adopt", now_us()))
                    except Exception as exc:  # the id is known to the ledger as deleted (a reset or deleted collection)
                        raise _refuse(f"{label}: the ledger holds {target.collection} as a deleted collection; "
                                      f"its rows stay tombstoned ({type(exc).__name__})") from None
                with _progress(target.total(), label) as progress:
                    reports.append(adopt(target, rules, spec, store, label=label, dry_run=dry_run,
                                         on_page=lambda n: progress.advance(progress.task_ids[0], n),
                                         failpoints=settings.failpoints))
            except TargetError as exc:
                _print(reports, fmt, show, report)
                raise _refuse(f"{label}: {exc} — run again to resume", 1) from None
            finally:
                target.close()
    finally:
        store.close()
    _print(reports, fmt, show, report)


@adopt_app.command("mem0")
def adopt_mem0(rules_file: Path = RULES, dry_run: bool = DRY_RUN, backend_url: Optional[str] = BACKEND_URL,
               ledger: Optional[Path] = LEDGER, report: Optional[Path] = REPORT, fmt: str = FORMAT,
               show: int = SHOW) -> None:
    """Adopt the memories of a Mem0 REST server: every entity GET /entities reports, and those the rules name."""
    from sidecar.adopt.engine import adopt
    from sidecar.adopt.rules import NATIVE_IDS, RulesError, _Mem0, load_rules
    from sidecar.adopt.targets import Mem0Target, TargetError

    if fmt not in ("text", "json"):
        raise typer.BadParameter("--format must be text or json")
    try:
        rules = load_rules(rules_file)
    except RulesError as exc:
        raise _refuse(str(exc)) from None
    spec = rules.mem0() or _Mem0()
    settings = _settings(ledger, backend_url)
    store = _open_store(settings)
    named = sorted({(k, getattr(m, k)) for m in rules.spec.map for k in NATIVE_IDS if getattr(m, k)})
    target = Mem0Target(str(settings.backend_url), spec.deployment, token=settings.backend_token,
                        auth_header=_auth_header(settings, "X-API-Key"),
                        timeout_s=max(settings.backend_timeout_s, 60.0), extra_ids=named,
                        verify=backend_tls_context(settings))
    label = f"deployment {spec.deployment} (tenant {rules.tenant})"
    try:
        _check_agents(rules, store)
        try:
            with _progress(target.total(), label) as progress:
                result = adopt(target, rules, spec, store, label=label, dry_run=dry_run,
                               on_page=lambda n: progress.advance(progress.task_ids[0], n), failpoints=settings.failpoints)
        except TargetError as exc:
            raise _refuse(f"{label}: {exc} — run again to resume", 1) from None
    finally:
        target.close()
        store.close()
    _print([result], fmt, show, report)
    if result.truncated:
        raise typer.Exit(1)
