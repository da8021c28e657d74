"""``memwarden`` command line: serve, keys (create/list/rotate/revoke), ledger, authz check, adopt, erase.

The demo, the probe, the GateMem benchmark and the local stack are not part of the product: they are
``memwarden-eval`` (the ``evaluation/`` package of the repository); the old ``memwarden demo|probe|bench|stack``
names stay as hidden commands that say so (exit 2).

Every command reads its settings with `sidecar.config.load_settings`: an unknown ``MEMWARDEN_*`` variable,
an unknown config-file key or a bad value stops it with one line naming the key (exit 2). Messages for
the operator go to stderr; stdout carries what a command answers (``serve``: the decision log).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from sidecar.config import ConfigError, Settings, load_settings
from sidecar.errors import LedgerOpenError, PolicyLoadError
from sidecar.ledger import Ledger, ledger_from_settings, redact_url


def version_text() -> str:
    """``memwarden <version of the installed distribution>``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"memwarden {version('memwarden')}"
    except PackageNotFoundError:
        return "memwarden (not installed)"


def _version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


app = typer.Typer(help="memwarden: Cedar governance sidecar for agent memory", no_args_is_help=True)


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """memwarden: Cedar governance sidecar for agent memory."""

keys = typer.Typer(help="manage API keys (stored as salted hashes in the ledger)", no_args_is_help=True)
app.add_typer(keys, name="keys")
ledger_cli = typer.Typer(help="ledger schema (SQLite file or MEMWARDEN_LEDGER_URL PostgreSQL)", no_args_is_help=True)
app.add_typer(ledger_cli, name="ledger")
console = Console()
err = Console(stderr=True, highlight=False, soft_wrap=True)

from sidecar.adopt.cli import adopt_app  # noqa: E402  (its own module: adopt chroma|mem0)

app.add_typer(adopt_app, name="adopt")

from sidecar.erase.cli import erase as _erase  # noqa: E402  (its own module: purge and verify erasure)

app.command("erase")(_erase)


def _load(**overrides: Any) -> Settings:
    """Settings, or a one-line refusal naming the key (exit 2)."""
    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        err.print(f"memwarden: configuration refused: {exc}", markup=False)
        raise typer.Exit(2) from None


def _settings(ledger: Optional[Path]) -> Settings:
    return _load(ledger_path=ledger, ledger_url=None) if ledger else _load()  # --ledger: an SQLite file


def open_store(settings: Settings, code: int = 1) -> Ledger:
    """The ledger the settings name, or a one-line refusal naming it (a URL without its password) and what
    to check (exit `code`): `LedgerOpenError`, raised by `sidecar.ledger.open_ledger`."""
    try:
        return ledger_from_settings(settings)
    except LedgerOpenError as exc:
        err.print(f"memwarden: {exc}", markup=False)
        raise typer.Exit(code) from None


def banner(settings: Settings, host: str, port: int, services: Any, metrics_on: bool) -> list[str]:
    """The start-up lines of ``memwarden serve``: listener, backend, policy set, ledger, metrics, mode."""
    gate = services.policy.current.gate
    pinned = f", pinned from {settings.invariants_dir}" if settings.invariants_dir else ""
    ledger = (f"postgresql {redact_url(settings.ledger_url)} (schema {settings.ledger_schema})" if settings.ledger_url
              else f"sqlite {settings.ledger_path}")
    mode = {"off": "enforce",
            "reads": "SHADOW (reads): Cedar denials of read, list and search are logged and counted, NOT enforced "
                     "(writes, updates, deletes, tenant isolation, authentication and the ledger still are)",
            "all": "SHADOW (all): Cedar denials are logged and counted, NOT enforced, writes and deletes included — "
                   "data the policies protect can be overwritten or destroyed (tenant isolation, authentication and "
                   "the ledger still are enforced)"}[settings.shadow_mode]
    tls = getattr(services, "tls", None)
    identity = getattr(services, "identity", None)
    jwt = getattr(identity, "jwt", None)
    return [
        f"{version_text()} listening on {'https' if tls is not None else 'http'}://{host}:{port}",
        "  tls       " + (tls.describe() if tls is not None else "off (cleartext: bind 127.0.0.1, or terminate TLS "
                                                                  "in front; see README 'TLS and identity')"),
        "  identity  API keys" + (f"; JWT {jwt.describe()}" if jwt is not None else ""),
        f"  backend   {settings.backend} {settings.backend_url}",
        f"  policies  {settings.policies_dir} sha256 {services.policy.digest} — {gate.policies} policies; "
        f"{gate.invariants} invariants proved ({gate.baseline} baseline{pinned}); {gate.tests} policy tests passed",
        f"  rows      decided {gate.row_decisions or 'per row'}",
        f"  ledger    {ledger}",
        "  metrics   " + (f"http://{settings.metrics_host}:{settings.metrics_port}/metrics" if metrics_on else "off"),
        f"  mode      {mode}",
        "  decisions " + ((f"file {settings.decision_log_path}" if settings.decision_log_sink == "file" else "stdout")
                          + (f"; shipped to {services.shipper.safe_url} ({settings.decision_log_format}, gzip, batches "
                             f"of {settings.decision_log_batch_max} or every {settings.decision_log_flush_s:g} s, buffer "
                             f"{settings.decision_log_buffer_max})" if getattr(services, "shipper", None) else "")
                          if settings.decision_log == "on" else "OFF (MEMWARDEN_DECISION_LOG=off: no audit trail)"),
    ]


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="bind address"),
    port: int = typer.Option(8080, help="bind port"),
    backend_url: Optional[str] = typer.Option(None, help="backend base URL (else MEMWARDEN_BACKEND_URL)"),
    policies: Optional[Path] = typer.Option(None, help="policies directory (else MEMWARDEN_POLICIES_DIR)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file (else MEMWARDEN_LEDGER_PATH)"),
    tls_cert: Optional[Path] = typer.Option(None, help="PEM certificate chain: serve HTTPS (else MEMWARDEN_TLS_CERT)"),
    tls_key: Optional[Path] = typer.Option(None, help="PEM private key of --tls-cert (else MEMWARDEN_TLS_KEY)"),
) -> None:
    """Run the sidecar until interrupted."""
    import uvicorn

    from sidecar.app import create_app

    overrides: dict[str, object] = {}
    if backend_url:
        overrides["backend_url"] = backend_url
    if policies:
        overrides["policies_dir"] = policies
    if ledger:
        overrides["ledger_path"] = ledger
    if tls_cert:
        overrides["tls_cert"] = tls_cert
    if tls_key:
        overrides["tls_key"] = tls_key
    settings = _load(**overrides)
    from sidecar.jwtauth import JwtConfigError
    from sidecar.policy_reload import PolicyRefused
    from sidecar.tls import TlsConfigError

    try:
        application = create_app(settings)
    except PolicyRefused as exc:
        err.print(f"memwarden: policy set refused ({exc.result}); POLICIES_DIR={settings.policies_dir}"
                  + (f" INVARIANTS_DIR={settings.invariants_dir}" if settings.invariants_dir else "")
                  + "; nothing is served:", markup=False)
        for line in exc.problems:
            err.print(f"  {line}", markup=False)
        raise typer.Exit(2) from None
    except PolicyLoadError as exc:
        err.print(f"memwarden: policies failed to load: {exc}", markup=False)
        raise typer.Exit(2) from None
    except LedgerOpenError as exc:
        err.print(f"memwarden: {exc}; nothing is served", markup=False)
        raise typer.Exit(1) from None
    except TlsConfigError as exc:
        err.print(f"memwarden: TLS refused: {exc}; nothing is served", markup=False)
        raise typer.Exit(2) from None
    except JwtConfigError as exc:
        err.print(f"memwarden: JWT settings refused: {exc}; nothing is served", markup=False)
        raise typer.Exit(2) from None
    stop_metrics = None
    if settings.metrics_port:
        from sidecar.metrics import serve_metrics
        try:
            stop_metrics = serve_metrics(application.state.services.metrics, settings.metrics_host, settings.metrics_port,
                                         readyz=application.state.services.readiness_report)
        except OSError as exc:
            err.print(f"memwarden: metrics listener {settings.metrics_host}:{settings.metrics_port}: {exc} "
                      "(set MEMWARDEN_METRICS_PORT to a free port, or 0 for none)", markup=False)
            raise typer.Exit(2) from exc
    for line in banner(settings, host, port, application.state.services, bool(settings.metrics_port)):
        err.print(line, markup=False)
    from sidecar.drain import DrainingServer
    from sidecar.server import ConnectionLimits, guarded_protocol

    limits = ConnectionLimits(idle_timeout_s=settings.idle_timeout_s, header_timeout_s=settings.header_timeout_s,
                              max_head_bytes=settings.max_head_bytes,
                              max_connections=settings.max_connections,
                              max_pipelined_requests=settings.max_pipelined_requests,
                              max_unsent_bytes=settings.max_unsent_bytes, write_timeout_s=settings.write_timeout_s)
    try:
        # proxy_headers=False: memwarden reads neither the peer address nor the scheme, and a forwarded
        # header is an identity claim it strips (`canonicalize.IDENTITY_HEADER_PREFIXES`), so uvicorn's
        # ProxyHeadersMiddleware (a layer per request) has nothing to do; server_header=False: no
        # ``server: uvicorn`` on every answer (RFC 9110 §10.2.4 makes it optional).
        tls = application.state.services.tls
        # With TLS, uvicorn is handed the context `sidecar.tls.ServerTls` keeps (its public ssl_context_factory),
        # so a certificate reloaded into it serves the next handshake.
        config = uvicorn.Config(application, host=host, port=port, log_level="warning", access_log=False,
                                http=guarded_protocol(limits), timeout_keep_alive=max(1, int(settings.idle_timeout_s)),
                                proxy_headers=False, server_header=False,
                                timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]
                                ssl_context_factory=(lambda _config, _default: tls.context) if tls is not None else None)
        # uvicorn.run's own steps, with a server that drains on SIGTERM (`sidecar.drain`) and exits 0 after it.
        server = DrainingServer(config, application.state.services, settings.shutdown_drain_s)
        server.run()
        if not server.started:
            raise typer.Exit(3)  # uvicorn's STARTUP_FAILURE: the port taken, the lifespan failed
    finally:
        if stop_metrics is not None:
            stop_metrics()


@keys.command("create")
def keys_create(
    tenant: Optional[str] = typer.Option(None, help="tenant name (agent and admin keys)"),
    fleet: Optional[str] = typer.Option(None, help="fleet name (agent keys)"),
    agent: Optional[str] = typer.Option(None, help="agent name (agent keys)"),
    trust: int = typer.Option(0, min=0, max=3, help="trust 0-3 (agent keys)"),
    role: list[str] = typer.Option([], "--role", help="a role of the agent (Agent.roles in the policies); repeat "
                                   "for several (agent keys)"),
    admin: bool = typer.Option(False, "--admin", help="tenant-wide admin key"),
    operator: bool = typer.Option(False, "--operator", help="deployment-level operator key (no tenant): "
                                  "configure, reset, any tenant's namespace; never tenant data"),
    expires_in: Optional[str] = typer.Option(None, "--expires-in", help="the key stops authenticating after this "
                                             "long (e.g. 30d, 12h, 90m; units s m h d w); default: never"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file"),
) -> None:
    """Create a key and print it once (only its salted hash is stored)."""
    if operator:
        if tenant or fleet or agent or admin:
            console.print("[red]--operator takes no --tenant, --fleet, --agent or --admin[/red]")
            raise typer.Exit(2)
        kind = "operator"
    elif not tenant:
        console.print("[red]give --tenant (agent and admin keys) or --operator[/red]")
        raise typer.Exit(2)
    elif admin == bool(fleet or agent):
        console.print("[red]give either --admin or both --fleet and --agent[/red]")
        raise typer.Exit(2)
    else:
        kind = "admin" if admin else "agent"
    expires_at = _expiry(expires_in, "--expires-in")
    store = open_store(_settings(ledger))
    try:
        record, plaintext = store.create_key(kind, tenant, fleet, agent, trust, roles=role, expires_at=expires_at)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    finally:
        store.close()
    sys.stdout.write(plaintext + "\n")
    roles = f", roles {','.join(record.roles)}" if record.roles else ""
    until = f", expires {_utc(record.expires_at)}" if record.expires_at is not None else ""
    Console(stderr=True).print(f"key id {record.key_id} ({record.principal().describe()}, trust {record.trust}{roles}{until})",
                               style="dim", markup=False)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds of a duration written ``<integer><unit>`` (units s, m, h, d, w: ``30d``, ``12h``, ``0s``). Raises
    ValueError for anything else."""
    import re

    m = re.fullmatch(r"\s*(\d{1,9})\s*([smhdw])\s*", text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration (an integer and a unit: s, m, h, d, w; e.g. 30d)")
    return float(int(m.group(1)) * _UNITS[m.group(2)])


def _expiry(text: Optional[str], option: str) -> Optional[int]:
    """UTC µs `text` (a duration) from now, None for no `text`; a bad or zero duration exits 2 naming `option`."""
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        err.print(f"memwarden: {option}: {exc}", markup=False)
        raise typer.Exit(2) from None
    if seconds <= 0:
        err.print(f"memwarden: {option}: a key that expires at once is a revoked key; give a positive duration", markup=False)
        raise typer.Exit(2)
    from sidecar.ledger.base import now_us

    return now_us() + int(seconds * 1_000_000)


def _utc(us: Optional[int]) -> str:
    """UTC µs as ``YYYY-MM-DD HH:MM:SSZ`` ("" for None)."""
    if us is None:
        return ""
    import datetime as dt

    return dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


@keys.command("list")
def keys_list(
    tenant: Optional[str] = typer.Option(None, help="only this tenant"),
    fmt: str = typer.Option("table", "--format", help="table, or json (one object per key)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file"),
) -> None:
    """List keys (never their secrets): full key ids, principal, state (active, expired, revoked, rotated), when each
    expires and when it was last used (recorded at most once a minute)."""
    from sidecar.ledger.base import now_us

    if fmt not in ("table", "json"):
        err.print("memwarden: --format is table or json", markup=False)
        raise typer.Exit(2)
    store = open_store(_settings(ledger))
    try:
        records = store.list_keys(tenant)
    finally:
        store.close()
    now = now_us()

    def state(k: Any) -> str:
        if k.revoked_at is not None:
            return "revoked"
        if k.expires_at is not None and now >= k.expires_at:
            return "expired"
        return f"rotated to {k.rotated_to}" if k.rotated_to else "active"

    if fmt == "json":
        for k in records:
            typer.echo(json.dumps({"key_id": k.key_id, "kind": k.kind, "tenant": k.tenant, "fleet": k.fleet,
                                   "agent": k.agent, "trust": k.trust, "roles": list(k.roles), "state": state(k),
                                   "created_at": _utc(k.created_at), "expires_at": _utc(k.expires_at) or None,
                                   "last_used_at": _utc(k.last_used_at) or None, "revoked_at": _utc(k.revoked_at) or None,
                                   "rotated_to": k.rotated_to}))
        return
    table = Table()
    table.add_column("key id", no_wrap=True, min_width=16)  # in full, never cut: the other columns wrap first
    for header in ("kind", "tenant", "fleet", "agent", "trust", "roles", "state", "expires (UTC)", "last used (UTC)"):
        table.add_column(header)
    for k in records:
        table.add_row(k.key_id, k.kind, k.tenant or "", k.fleet or "", k.agent or "", str(k.trust), ",".join(k.roles),
                      state(k), _utc(k.expires_at), _utc(k.last_used_at))
    console.print(table)


@keys.command("rotate")
def keys_rotate(
    key_id: str = typer.Argument(..., help="key id (as shown by keys list)"),
    grace: str = typer.Option("1h", help="how long the old key keeps authenticating (e.g. 1h, 30m, 0s)"),
    expires_in: Optional[str] = typer.Option(None, "--expires-in", help="the new key's lifetime (default: the old key's "
                                             "lifetime when it had one, else no expiry)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file"),
) -> None:
    """Replace a key: print a new key of the same principal (kind, tenant, fleet, agent, trust, roles) once; the old
    one keeps authenticating for --grace, then is refused."""
    try:
        grace_s = parse_duration(grace)
    except ValueError as exc:
        err.print(f"memwarden: --grace: {exc}", markup=False)
        raise typer.Exit(2) from None
    expires_at = _expiry(expires_in, "--expires-in")
    store = open_store(_settings(ledger))
    try:
        record, plaintext, until = store.rotate_key(key_id, grace_s, expires_at)
    except ValueError as exc:
        err.print(f"memwarden: {exc}", markup=False)
        raise typer.Exit(1) from None
    finally:
        store.close()
    sys.stdout.write(plaintext + "\n")
    err.print(f"key id {record.key_id} replaces {key_id} ({record.principal().describe()}); {key_id} is refused from "
              f"{_utc(until)}" + (f"; {record.key_id} expires {_utc(record.expires_at)}" if record.expires_at else ""),
              markup=False)


@keys.command("revoke")
def keys_revoke(
    key_id: str = typer.Argument(..., help="key id (as shown by keys list)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file"),
) -> None:
    """Revoke a key; effective on the next request."""
    store = open_store(_settings(ledger))
    ok = store.revoke_key(key_id)
    store.close()
    if not ok:
        console.print(f"[red]no active key {key_id}[/red]")
        raise typer.Exit(1)
    console.print(f"revoked {key_id}")


@ledger_cli.command("migrate")
def ledger_migrate(
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file (else MEMWARDEN_LEDGER_URL / MEMWARDEN_LEDGER_PATH)"),
) -> None:
    """Apply pending ledger migrations (idempotent; replicas starting together migrate once)."""
    settings = _settings(ledger)
    if settings.ledger_url:
        settings = settings.model_copy(update={"ledger_migrate_on_start": True})
    try:
        store = ledger_from_settings(settings)  # migrates at open
    except LedgerOpenError as exc:
        err.print(f"memwarden: {exc}", markup=False)
        raise typer.Exit(1) from None
    except Exception as exc:  # the migration itself failed (a privilege, a conflicting object): nothing applied
        err.print(f"memwarden: ledger migration failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                  markup=False)
        raise typer.Exit(1) from None
    try:
        version = store.migrate()  # type: ignore[attr-defined]
    finally:
        store.close()
    console.print(f"ledger schema at version {version}")


authz = typer.Typer(help="ad-hoc authorization checks against the policy set and ledger (no backend call)",
                    no_args_is_help=True)
app.add_typer(authz, name="authz")


@authz.command("check")
def authz_check(
    key_id: Optional[str] = typer.Option(None, help="the principal: a key id (as shown by keys list)"),
    action: list[str] = typer.Option([], help="action(s): read, write, update, delete, redistribute, search, list, "
                                              "delete_bulk, admin, create_collection (with --database)"),
    row: Optional[str] = typer.Option(None, help="row id (row actions)"),
    collection: Optional[str] = typer.Option(None, help="Chroma collection UUID (Mem0: the deployment, implied)"),
    database: Optional[str] = typer.Option(None, help="namespace database (request-level actions on a namespace)"),
    tenant: Optional[str] = typer.Option(None, help="namespace tenant (default: the principal's)"),
    target_fleet: Optional[str] = typer.Option(None, help="redistribute: the target fleet"),
    target_scope: Optional[str] = typer.Option(None, help="redistribute: the target scope"),
    scope: Optional[str] = typer.Option(None, help="write: scope of the new row (default fleet)"),
    label: list[str] = typer.Option([], "--label", help="write: a label of the new row (repeatable)"),
    include_superseded: bool = typer.Option(False, help="read: a superseded row is servable (as ?include_superseded)"),
    request: Optional[Path] = typer.Option(None, help="a JSON check document (- for stdin) instead of the options"),
    fmt: str = typer.Option("text", "--format", help="text or json"),
    policies: Optional[Path] = typer.Option(None, help="policies directory (else MEMWARDEN_POLICIES_DIR)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file (else MEMWARDEN_LEDGER_URL / _PATH)"),
) -> None:
    """Decide one request as the sidecar would: decision, determining policies, deny reason and the entities
    Cedar saw (policy set admitted through the same gate; exit 0 allow, 1 deny, 2 refused input, 3 the ledger
    cannot be opened)."""
    from sidecar.authzcheck import Checker, CheckError
    from sidecar.policy_reload import PolicyRefused

    if fmt not in ("text", "json"):
        raise typer.BadParameter("--format must be text or json")
    overrides: dict[str, Any] = {}
    if policies:
        overrides["policies_dir"] = policies
    if ledger:
        overrides.update(ledger_path=ledger, ledger_url=None)
    settings = _load(**overrides)
    if request is not None:
        if key_id or action or row or collection or database:
            raise typer.BadParameter("give either --request or the options")
        try:
            text = sys.stdin.read() if str(request) == "-" else request.read_text(encoding="utf-8")
            doc = json.loads(text)
        except (OSError, ValueError) as exc:
            err.print(f"memwarden: --request: {exc}", markup=False)
            raise typer.Exit(2) from None
    else:
        if not key_id or not action:
            raise typer.BadParameter("--key-id and --action are required (or --request FILE)")
        item: dict[str, Any] = {"actions": list(action), "include_superseded": include_superseded}
        for k, v in (("row", row), ("collection", collection), ("database", database), ("tenant", tenant),
                     ("scope", scope)):
            if v is not None:
                item[k] = v
        if label:
            item["labels"] = list(label)
        if target_fleet is not None or target_scope is not None:
            item["context"] = {"target_fleet": target_fleet, "target_scope": target_scope}
        doc = {"key_id": key_id, "resources": [item]}
    store = open_store(settings, code=3)  # not 1: that is a deny
    try:
        answer = Checker(settings, store).check(doc)
    except PolicyRefused as exc:
        err.print(f"memwarden: policy set refused ({exc.result}); POLICIES_DIR={settings.policies_dir}:", markup=False)
        for line in exc.problems:
            err.print(f"  {line}", markup=False)
        raise typer.Exit(2) from None
    except CheckError as exc:
        err.print(f"memwarden: check refused: {exc}", markup=False)
        raise typer.Exit(2) from None
    finally:
        store.close()
    if fmt == "json":
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    else:
        out = Console(soft_wrap=True, highlight=False)
        out.print(f"policy set sha256 {answer['policy_sha256']} ({settings.policies_dir}); principal "
                  f"{answer['principal'] or '(unknown or revoked key)'}", markup=False)
        for r in answer["results"]:
            out.print(f"{r['decision'].upper():5} {r['action']} {r['resource']}"
                      + (f"  reason {r['reason']}" if r["reason"] else "")
                      + (f"  policies {', '.join(r['policies'])}" if r["policies"] else "")
                      + (f"  errors {'; '.join(r['errors'])}" if r["errors"] else ""), markup=False)
            if r["request"] is not None:
                out.print("  request  " + json.dumps(r["request"], separators=(",", ":")), markup=False)
                out.print("  entities " + json.dumps(r["entities"], separators=(",", ":")), markup=False)
    raise typer.Exit(0 if all(r["decision"] == "allow" for r in answer["results"]) else 1)


EVAL_INSTALL = "pip install -e ./evaluation"  # in a checkout of memwarden, next to the product; `make demo` does it


def _moved(name: str) -> None:
    """A command that moved to ``memwarden-eval``: one line saying where and how to install it (exit 2)."""

    def command(ctx: typer.Context) -> None:
        err.print(f"memwarden {name}: moved to the evaluation package: run `memwarden-eval {name} ...`; "
                  f"to install it, in a checkout of memwarden: {EVAL_INSTALL}", markup=False)
        raise typer.Exit(2)

    app.command(name, hidden=True, add_help_option=False,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(command)


for _name in ("demo", "probe", "bench", "stack"):
    _moved(_name)


if __name__ == "__main__":
    app()
