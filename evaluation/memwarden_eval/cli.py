"""``memwarden-eval`` command line: demo, probe (run, report), bench (gatemem, gatemem-report), stack.

The evaluation half of memwarden, a package of its own (``evaluation/``, distribution ``memwarden-eval``)
so that the product wheel (``memwarden``: serve, keys, ledger, authz check, adopt, erase, policy-check)
carries none of it. It starts real servers (`memwarden_eval.harness`): `chroma run`, our Mem0 REST test
server (`memwarden_eval.mem0_server`) and ``memwarden serve`` of the installed product.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from sidecar.config import default_policies_dir
from sidecar.ledger import open_ledger


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        def installed(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "(not installed)"

        typer.echo(f"memwarden-eval {installed('memwarden-eval')} (memwarden {installed('memwarden')})")
        raise typer.Exit(0)


app = typer.Typer(help="memwarden-eval: the demo, governance probes, benchmarks and a local stack for memwarden",
                  no_args_is_help=True)


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """memwarden-eval: the demo, governance probes, benchmarks and a local stack for memwarden."""


console = Console()
err = Console(stderr=True, highlight=False, soft_wrap=True)


@app.command()
def demo(
    workdir: Optional[Path] = typer.Option(None, help="keep state here (default: a temp dir)"),
    probe: bool = typer.Option(True, help="also run a small probe (direct vs sidecar side by side)"),
    backend: str = typer.Option("chroma", help="chroma, or mem0 (our Mem0 REST server on the real mem0ai Memory)"),
) -> None:
    """Start Chroma and the sidecar, run the multi-agent scenario, print what each principal saw."""
    if backend == "mem0":
        from memwarden_eval.demo_mem0 import run_mem0_demo

        raise typer.Exit(run_mem0_demo(workdir))
    if backend != "chroma":
        raise typer.BadParameter("backend must be chroma or mem0")
    from memwarden_eval.demo import run_demo

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
    from memwarden_eval.probe.experiments import Sizes
    from memwarden_eval.probe.plan import Plan
    from memwarden_eval.probe.runner import BACKENDS, no_embed, print_table, run_embedded, run_probe

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
            from memwarden_eval.embeddings import embed
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
    from memwarden_eval.probe.report import write_report
    from memwarden_eval.probe.runner import print_table

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

    from memwarden_eval.gatemem import report
    from memwarden_eval.gatemem.data import DOMAINS, GateMemFormatError
    from memwarden_eval.gatemem.runner import Config, run

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
    command = "memwarden-eval " + " ".join(shlex.quote(a) for a in sys.argv[1:])
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
def bench_gatemem_report(run_dir: Path = typer.Argument(..., help="a run directory of memwarden-eval bench gatemem")) -> None:
    """Recompute summary.md/json and the plots of a GateMem run from its records.jsonl and summary.json."""
    from memwarden_eval.gatemem import report

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

    from memwarden_eval.harness import Server, free_port, port_in_use, start_chroma, start_sidecar

    chroma_port = chroma_port or free_port()
    for name, option, number in (("memwarden", "--port", port), ("Chroma", "--chroma-port", chroma_port)):
        problem = port_in_use("127.0.0.1", number)
        if problem:
            err.print(f"memwarden-eval stack: port {number} on 127.0.0.1 (for {name}) is not free: {problem}; "
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
        err.print(f"memwarden-eval stack: {gone.name} exited with status {gone.proc.returncode} (log {gone.log}); "
                  "stopping", markup=False)
        code = 1
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a server that did not start (its log tail is in the message)
        err.print(f"memwarden-eval stack: {exc}", markup=False)
        code = 2
    finally:
        for child in reversed(children):
            child.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise typer.Exit(code)



if __name__ == "__main__":
    app()
