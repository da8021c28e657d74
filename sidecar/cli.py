"""``memwarden`` command line: serve, keys (create/list/rotate/revoke), ledger, authz check, adopt, erase, demo, probe, bench, stack.

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

from sidecar.config import ConfigError, Settings, default_policies_dir, load_settings
from sidecar.errors import LedgerOpenError, PolicyLoadError
from sidecar.ledger import Ledger, ledger_from_settings, open_ledger, redact_url


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


@app.command()
def demo(
    workdir: Optional[Path] = typer.Option(None, help="keep state here (default: a temp dir)"),
    probe: bool = typer.Option(True, help="also run a small probe (direct vs sidecar side by side)"),
    backend: str = typer.Option("chroma", help="chroma, or mem0 (our Mem0 REST server on the real mem0ai Memory)"),
) -> None:
    """Start Chroma and the sidecar, run the multi-agent scenario, print what each principal saw."""
    if backend == "mem0":
        from sidecar.demo_mem0 import run_mem0_demo

        raise typer.Exit(run_mem0_demo(workdir))
    if backend != "chroma":
        raise typer.BadParameter("backend must be chroma or mem0")
    from sidecar.demo import run_demo

    raise typer.Exit(run_demo(workdir, probe=probe))


probe = typer.Typer(help="governance experiments: a backend directly vs through memwarden", no_args_is_help=True)
app.add_typer(probe, name="probe")


@probe.command("run")
def probe_run(
    seed: int = typer.Option(1, help="plan seed (fleet, names, content, samples)"),
    experiments: str = typer.Option("leakage,provenance,propagation,contradiction,forgetting", help="comma-separated"),
    out: Path = typer.Option(Path("runs"), help="parent of the run directory"),
    tenants: int = typer.Option(1), fleets: int = typer.Option(4), agents: int = typer.Option(6),
    small: bool = typer.Option(False, "--small", help="small item counts (seconds, not minutes)"),
    backend: str = typer.Option("chroma", help="chroma, or mem0 (a Mem0 REST server)"),
    backend_url: Optional[str] = typer.Option(None, help="existing backend (else one is started: chroma run / our Mem0 test server)"),
    chroma_url: Optional[str] = typer.Option(None, hidden=True, help="alias of --backend-url for --backend chroma"),
    backend_key: Optional[str] = typer.Option(None, help="Mem0's API key (X-API-Key) for the direct target"),
    sidecar_url: Optional[str] = typer.Option(None, help="existing sidecar in front of --backend-url"),
    ledger: Optional[Path] = typer.Option(None, help="that sidecar's ledger (keys are provisioned in it)"),
) -> None:
    """Run the experiments on a backend directly and through the sidecar; write a run directory."""
    from sidecar.probe.experiments import Sizes
    from sidecar.probe.plan import Plan
    from sidecar.probe.runner import BACKENDS, no_embed, print_table, run_embedded, run_probe

    if backend not in BACKENDS:
        console.print(f"[red]--backend must be one of {', '.join(BACKENDS)}[/red]")
        raise typer.Exit(2)
    if chroma_url and (backend_url or backend != "chroma"):
        console.print("[red]--chroma-url is --backend-url for --backend chroma; give one of them[/red]")
        raise typer.Exit(2)
    backend_url = backend_url or chroma_url
    names = [e.strip() for e in experiments.split(",") if e.strip()]
    sizes = Sizes.tiny() if small else Sizes()
    if backend_url or sidecar_url or ledger:
        if not (backend_url and sidecar_url and ledger):
            console.print("[red]--backend-url, --sidecar-url and --ledger go together[/red]")
            raise typer.Exit(2)
        if backend == "chroma":
            from sidecar.embeddings import embed
        else:
            embed = no_embed
        run_dir = run_probe(Plan.build(seed, tenants, fleets, agents), names, backend_url, sidecar_url, ledger, out, embed,
                            sizes, console, backend=backend, backend_key=backend_key)
    else:
        run_dir = run_embedded(seed, names, out, sizes, console, tenants, fleets, agents, backend=backend)
    print_table(run_dir, console)
    console.print(f"run directory: {run_dir}")


@probe.command("report")
def probe_report(run_dir: Path = typer.Argument(..., help="a run directory with events.jsonl")) -> None:
    """Recompute summary.csv, summary.md and plots from events.jsonl alone."""
    from sidecar.probe.report import write_report
    from sidecar.probe.runner import print_table

    if not (run_dir / "events.jsonl").exists():
        console.print(f"[red]{run_dir}/events.jsonl not found[/red]")
        raise typer.Exit(2)
    write_report(run_dir)
    print_table(run_dir, console)


bench = typer.Typer(help="public benchmarks replayed through memwarden", no_args_is_help=True)
app.add_typer(bench, name="bench")


@bench.command("gatemem")
def bench_gatemem(
    data: Path = typer.Option(..., help="a checkout of GateMem's bench/data (one directory per domain)"),
    domains: str = typer.Option("medical,office,education,household", help="comma-separated"),
    k: str = typer.Option("5,10,20", help="top-k values, comma-separated"),
    backend: str = typer.Option("chroma", help="chroma, or mem0 (our Mem0 REST test server on mem0ai, started for the run)"),
    jobs: int = typer.Option(2, min=1, help="episodes replayed at once"),
    out: Optional[Path] = typer.Option(None, help="run directory (default runs/gatemem-<UTC time>)"),
    episodes: Optional[int] = typer.Option(None, min=1, help="only the first N episodes of each domain"),
) -> None:
    """Replay GateMem turn by turn into the backend alone (Chroma or Mem0), through memwarden with ingest-time labels, and through
    memwarden with labels from the hidden annotations (upper bound); score every checkpoint at the retrieval
    layer and write records.jsonl, summary.md/json and plots."""
    import datetime as dt
    import shlex
    import sys

    from sidecar.bench.gatemem import report
    from sidecar.bench.gatemem.data import DOMAINS, GateMemFormatError
    from sidecar.bench.gatemem.runner import Config, run

    names = tuple(d.strip() for d in domains.split(",") if d.strip())
    unknown = [d for d in names if d not in DOMAINS]
    if unknown or not names:
        console.print(f"[red]unknown domain(s) {unknown}; choose from {', '.join(DOMAINS)}[/red]")
        raise typer.Exit(2)
    try:
        ks = tuple(sorted({int(x) for x in k.split(",") if x.strip()}))
    except ValueError:
        ks = ()
    if not ks or ks[0] < 1:
        console.print("[red]--k must be positive integers, comma-separated[/red]")
        raise typer.Exit(2)
    if backend not in ("chroma", "mem0"):
        console.print(f"[red]--backend {backend}: choose chroma or mem0[/red]")
        raise typer.Exit(2)
    missing = [d for d in names if not (data / d / "episodes.jsonl").exists() or not (data / d / "checkpoints.jsonl").exists()]
    if missing:
        console.print(f"[red]{data} has no episodes.jsonl/checkpoints.jsonl for {', '.join(missing)}[/red]")
        raise typer.Exit(2)
    run_dir = out or Path("runs") / f"gatemem-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    cfg = Config(data_dir=data, out_dir=run_dir, domains=names, ks=ks, jobs=jobs, episodes=episodes,
                 cause_k=10 if 10 in ks else ks[len(ks) // 2], backend=backend)
    command = "memwarden " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:  # the run directory is rewritten after each domain, so a long run leaves results as it goes
        results, timings, wall = run(cfg, progress=lambda s: console.print(s, highlight=False),
                                     on_domain=lambda done, t, w: report.write(cfg, done, t, w, command + "  (partial)"))
    except GateMemFormatError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    md = report.write(cfg, results, timings, wall, command)
    typer.echo(md.read_text(encoding="utf-8"))
    typer.echo(f"run directory: {run_dir}")


@bench.command("gatemem-report")
def bench_gatemem_report(run_dir: Path = typer.Argument(..., help="a run directory of memwarden bench gatemem")) -> None:
    """Recompute summary.md/json and the plots of a GateMem run from its records.jsonl and summary.json."""
    from sidecar.bench.gatemem import report

    if not (run_dir / "records.jsonl").exists() or not (run_dir / "summary.json").exists():
        console.print(f"[red]{run_dir} has no records.jsonl and summary.json[/red]")
        raise typer.Exit(2)
    typer.echo(report.render(run_dir, report.load(run_dir)).read_text(encoding="utf-8"))


@app.command()
def stack(
    workdir: Path = typer.Option(Path(".memwarden/stack"), help="Chroma data, ledger and logs"),
    port: int = typer.Option(8080, min=1, max=65535, help="sidecar port"),
    chroma_port: int = typer.Option(0, min=0, max=65535, help="Chroma port (0: a free one)"),
    tenant: str = typer.Option("demo", help="tenant to provision"),
) -> None:
    """Run `chroma run` + the sidecar on 127.0.0.1 until Ctrl-C or SIGTERM (both stop the two servers);
    print how to call it. Exits 2, before starting anything or creating keys, when a port is taken; 1 when
    a server stops on its own."""
    import signal
    import time

    from sidecar.harness import Server, free_port, port_in_use, start_chroma, start_sidecar

    chroma_port = chroma_port or free_port()
    for name, option, number in (("memwarden", "--port", port), ("Chroma", "--chroma-port", chroma_port)):
        problem = port_in_use("127.0.0.1", number)
        if problem:
            err.print(f"memwarden stack: port {number} on 127.0.0.1 (for {name}) is not free: {problem}; "
                      f"choose another with {option}", markup=False)
            raise typer.Exit(2)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM and SIGHUP stop the stack exactly as Ctrl-C does

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    ledger_path = workdir / "ledger.db"
    children: list[Server] = []
    code = 0
    try:
        children.append(start_chroma(workdir / "chroma", port=chroma_port))
        chroma = children[0]
        # `memwarden serve`, through the same policy gate, with the packaged default policy set.
        children.append(start_sidecar(chroma.url, ledger_path, default_policies_dir(), port=port))
        side = children[1]
        store = open_ledger(str(ledger_path))
        try:
            admin = store.create_key("admin", tenant, None, None, 0)[1]
            agent = store.create_key("agent", tenant, "main", "agent1", 1)[1]
        finally:
            store.close()
        # Plain lines (never wrapped): the keys and the curl line are copied from here.
        typer.echo(f"Chroma: {chroma.url} (do not expose)   memwarden: {side.url}")
        typer.echo(f"admin key for tenant {tenant!r}: {admin}")
        typer.echo(f"agent key ({tenant}/main/agent1, trust 1): {agent}")
        typer.echo(f"curl -H 'X-API-Key: {agent}' {side.url}/api/v2/auth/identity")
        typer.echo(f"more keys: memwarden keys create --ledger {ledger_path} --tenant {tenant} --fleet F --agent A --trust N")
        typer.echo("Ctrl-C (or SIGTERM) stops both.")
        while all(c.proc.poll() is None for c in children):
            time.sleep(0.5)
        gone = next(c for c in children if c.proc.poll() is not None)
        err.print(f"memwarden stack: {gone.name} exited with status {gone.proc.returncode} (log {gone.log}); "
                  "stopping", markup=False)
        code = 1
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a server that did not start (its log tail is in the message)
        err.print(f"memwarden stack: {exc}", markup=False)
        code = 2
    finally:
        for child in reversed(children):
            child.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise typer.Exit(code)


if __name__ == "__main__":
    app()
