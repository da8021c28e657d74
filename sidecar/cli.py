"""``memwarden`` command line: serve, keys (create/list/revoke), demo."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from sidecar.config import Settings
from sidecar.errors import PolicyLoadError
from sidecar.ledger import ledger_from_settings, open_ledger

app = typer.Typer(help="memwarden: Cedar governance sidecar for agent memory", no_args_is_help=True)
keys = typer.Typer(help="manage API keys (stored as salted hashes in the ledger)", no_args_is_help=True)
app.add_typer(keys, name="keys")
ledger_cli = typer.Typer(help="ledger schema (SQLite file or MEMWARDEN_LEDGER_URL PostgreSQL)", no_args_is_help=True)
app.add_typer(ledger_cli, name="ledger")
console = Console()


def _settings(ledger: Optional[Path]) -> Settings:
    return Settings(ledger_path=ledger, ledger_url=None) if ledger else Settings()  # --ledger: an SQLite file


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="bind address"),
    port: int = typer.Option(8080, help="bind port"),
    backend_url: Optional[str] = typer.Option(None, help="backend base URL (else MEMWARDEN_BACKEND_URL)"),
    policies: Optional[Path] = typer.Option(None, help="policies directory (else MEMWARDEN_POLICIES_DIR)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file (else MEMWARDEN_LEDGER_PATH)"),
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
    settings = Settings(**overrides)  # type: ignore[arg-type]
    try:
        application = create_app(settings)
    except PolicyLoadError as exc:
        console.print(f"[red]memwarden: policies failed to load:[/red] {exc}")
        raise typer.Exit(2) from exc
    stop_metrics = None
    if settings.metrics_port:
        from sidecar.metrics import serve_metrics
        try:
            stop_metrics = serve_metrics(application.state.services.metrics, settings.metrics_host, settings.metrics_port)
        except OSError as exc:
            console.print(f"[red]memwarden: metrics listener {settings.metrics_host}:{settings.metrics_port}: {exc}[/red] "
                          "(set MEMWARDEN_METRICS_PORT to a free port, or 0 for none)")
            raise typer.Exit(2) from exc
    from sidecar.server import ConnectionLimits, guarded_protocol

    limits = ConnectionLimits(idle_timeout_s=settings.idle_timeout_s, header_timeout_s=settings.header_timeout_s,
                              max_connections=settings.max_connections)
    try:
        uvicorn.run(application, host=host, port=port, log_level="warning", access_log=False,
                    http=guarded_protocol(limits), timeout_keep_alive=max(1, int(settings.idle_timeout_s)))
    finally:
        if stop_metrics is not None:
            stop_metrics()


@keys.command("create")
def keys_create(
    tenant: Optional[str] = typer.Option(None, help="tenant name (agent and admin keys)"),
    fleet: Optional[str] = typer.Option(None, help="fleet name (agent keys)"),
    agent: Optional[str] = typer.Option(None, help="agent name (agent keys)"),
    trust: int = typer.Option(0, min=0, max=3, help="trust 0-3 (agent keys)"),
    admin: bool = typer.Option(False, "--admin", help="tenant-wide admin key"),
    operator: bool = typer.Option(False, "--operator", help="deployment-level operator key (no tenant): "
                                  "configure, reset, any tenant's namespace; never tenant data"),
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
    store = ledger_from_settings(_settings(ledger))
    try:
        record, plaintext = store.create_key(kind, tenant, fleet, agent, trust)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    finally:
        store.close()
    sys.stdout.write(plaintext + "\n")
    Console(stderr=True).print(f"key id {record.key_id} ({record.principal().describe()}, trust {record.trust})", style="dim")


@keys.command("list")
def keys_list(
    tenant: Optional[str] = typer.Option(None, help="only this tenant"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file"),
) -> None:
    """List keys (never their secrets)."""
    store = ledger_from_settings(_settings(ledger))
    table = Table("key id", "kind", "tenant", "fleet", "agent", "trust", "revoked")
    for k in store.list_keys(tenant):
        table.add_row(k.key_id, k.kind, k.tenant or "", k.fleet or "", k.agent or "", str(k.trust), "yes" if k.revoked_at else "")
    store.close()
    console.print(table)


@keys.command("revoke")
def keys_revoke(
    key_id: str = typer.Argument(..., help="key id (as shown by keys list)"),
    ledger: Optional[Path] = typer.Option(None, help="SQLite ledger file"),
) -> None:
    """Revoke a key; effective on the next request."""
    store = ledger_from_settings(_settings(ledger))
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
        store = ledger_from_settings(settings)
    except Exception as exc:
        console.print(f"[red]memwarden: ledger not reachable or migration failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    try:
        version = store.migrate()  # type: ignore[attr-defined]
    finally:
        store.close()
    console.print(f"ledger schema at version {version}")


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


@app.command()
def stack(
    workdir: Path = typer.Option(Path(".memwarden/stack"), help="Chroma data, ledger and logs"),
    port: int = typer.Option(8080, help="sidecar port"),
    tenant: str = typer.Option("demo", help="tenant to provision"),
) -> None:
    """Run `chroma run` + the sidecar on 127.0.0.1 until interrupted; print how to call it."""
    import time

    from sidecar.harness import start_chroma, start_sidecar

    ledger_path = workdir / "ledger.db"
    store = open_ledger(str(ledger_path))
    admin = store.create_key("admin", tenant, None, None, 0)[1]
    agent = store.create_key("agent", tenant, "main", "agent1", 1)[1]
    store.close()
    chroma = start_chroma(workdir / "chroma")
    policies = Path(__file__).resolve().parent.parent / "policies"
    side = start_sidecar(chroma.url, ledger_path, policies, port=port)
    console.print(f"Chroma: {chroma.url} (do not expose)   memwarden: {side.url}")
    console.print(f"admin key for tenant {tenant!r}: {admin}\nagent key ({tenant}/main/agent1, trust 1): {agent}")
    console.print(f"curl -H 'X-API-Key: {agent}' {side.url}/api/v2/auth/identity")
    console.print(f"more keys: memwarden keys create --ledger {ledger_path} --tenant {tenant} --fleet F --agent A --trust N")
    console.print("Ctrl-C stops both.")
    try:
        while side.proc.poll() is None and chroma.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        side.stop()
        chroma.stop()


if __name__ == "__main__":
    app()
