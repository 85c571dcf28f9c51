"""The ``vgpud`` command: one binary, one subcommand per role."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from vgpud.config import ConfigError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="vgpud: share NVIDIA GPUs between Kubernetes pods as hard-limited slices.",
)

DEFAULT_SCENARIO = "seed-003.yaml"


class Output(enum.Enum):
    text = "text"
    json = "json"


def examples_dir() -> Path:
    """The bundled scenarios: inside the wheel, or ``examples/`` of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_examples", here.parent / "examples"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("the bundled examples are missing from this installation")


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"vgpud: {message}", err=True)
    return typer.Exit(code)


@app.command()
def simulate(
    scenario: Annotated[Path | None, typer.Argument(
        help=f"Scenario file (YAML/JSON). Default: the bundled {DEFAULT_SCENARIO}.")] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json")] = Output.text,
    plot: Annotated[Path | None, typer.Option(
        help="Also draw per-GPU allocation into this PNG (needs the 'plot' extra).")] = None,
) -> None:
    """Place a scenario's pods with the scheduler's own core, without a cluster."""
    from vgpud.scenario import ScenarioError, load_scenarios
    from vgpud.simulate import render_json, render_plot, render_text, run

    path = scenario if scenario is not None else examples_dir() / DEFAULT_SCENARIO
    try:
        results = [run(s) for s in load_scenarios(path)]
    except (ScenarioError, ConfigError) as e:
        raise fail(str(e)) from None
    typer.echo(render_json(results) if output is Output.json else render_text(results))
    if plot is not None:
        try:
            render_plot(results, str(plot))
        except ImportError:
            raise fail("--plot needs matplotlib: pip install 'vgpud[plot]'") from None
        typer.echo(f"wrote {plot}", err=True)


@app.command("examples")
def list_examples() -> None:
    """List the bundled scenarios."""
    for p in sorted(examples_dir().glob("*.yaml")):
        typer.echo(str(p))


inspect_app = typer.Typer(
    no_args_is_help=True, add_completion=False,
    help="Show the cluster's GPUs, their slices and why GPU pods are pending.")
app.add_typer(inspect_app, name="inspect")

KubeconfigOpt = Annotated[str | None, typer.Option(
    help="kubeconfig file (default: in-cluster, else $KUBECONFIG)")]
SchedulerOpt = Annotated[str | None, typer.Option(
    "--scheduler", help="ask a running vgpud scheduler's JSON API at this URL (its ops "
    "address, e.g. http://localhost:9395) instead of the API server")]
ConfigOpt = Annotated[Path | None, typer.Option(
    help="settings file (the scheduler's), for how pending pods are judged")]


def _inspect(what: str, *, kubeconfig: str | None, scheduler: str | None,
             config: Path | None, output: str, node: str | None = None,
             pod: str | None = None) -> None:
    import anyio

    from vgpud.config import load_settings
    from vgpud.inspection import (
        ApiSource,
        Format,
        InspectError,
        SchedulerSource,
        gpus_table,
        nodes_table,
        pod_text,
        quotas_table,
        render,
    )
    from vgpud.kube.client import KubeClient
    from vgpud.kube.errors import ConfigError as KubeConfigError
    from vgpud.kube.errors import KubeError

    try:
        fmt = Format(output)
    except ValueError:
        raise fail(f"--output {output!r}: choose text, wide, json or yaml") from None
    namespace, name = "", ""
    if pod is not None:
        namespace, _, name = pod.rpartition("/")
        namespace = namespace or "default"
        if not name or "/" in namespace:
            raise fail(f"{pod!r}: give the pod as NAMESPACE/NAME (or NAME in default)")
    try:
        settings = load_settings(config)
    except ConfigError as e:
        raise fail(str(e)) from None

    async def main() -> str:
        import aiohttp

        if scheduler:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                src = SchedulerSource(s, scheduler)
                if what == "pod":
                    doc = await src.pod(namespace, name)
                    return render(doc, fmt, pod_text(doc))
                if what == "quotas":
                    rows = await src.quotas()
                    return render(rows, fmt, quotas_table(rows))
                v = await src.view(node)
        else:
            async with KubeClient.connect(kubeconfig) as kube:
                api = ApiSource(kube, settings)
                await api.load()
                for w in api.warnings:
                    typer.echo(f"vgpud: warning: {w}", err=True)
                if what == "pod":
                    doc = await api.pod(namespace, name)
                    return render(doc, fmt, pod_text(doc))
                if what == "quotas":
                    rows = await api.quotas()
                    return render(rows, fmt, quotas_table(rows))
                v = api.view(node)
        wide = fmt is Format.wide
        if what == "nodes":
            return render(_by_node(v.gpus), fmt, nodes_table(v, wide))
        return render(v.gpus, fmt, gpus_table(v, wide))

    try:
        typer.echo(anyio.run(main))
    except (InspectError, KubeConfigError, KubeError) as e:
        raise fail(str(e), 1) from None


def _by_node(gpus: list[dict[str, object]]) -> list[dict[str, object]]:
    nodes: dict[str, list[dict[str, object]]] = {}
    for g in gpus:
        nodes.setdefault(str(g["node"]), []).append(g)
    return [{"node": n, "gpus": gs} for n, gs in sorted(nodes.items())]


OutputOpt = Annotated[str, typer.Option("--output", "-o", help="text, wide, json or yaml")]


@inspect_app.command("nodes")
def inspect_nodes(kubeconfig: KubeconfigOpt = None, scheduler: SchedulerOpt = None,
                  config: ConfigOpt = None, output: OutputOpt = "text") -> None:
    """Each GPU node: GPUs, health, memory / cores / vGPUs allocated of capacity, pods."""
    _inspect("nodes", kubeconfig=kubeconfig, scheduler=scheduler, config=config,
             output=output)


@inspect_app.command("gpus")
def inspect_gpus(node: Annotated[str | None, typer.Option(help="only this node")] = None,
                 kubeconfig: KubeconfigOpt = None, scheduler: SchedulerOpt = None,
                 config: ConfigOpt = None, output: OutputOpt = "text") -> None:
    """Each GPU: allocation against capacity, health, and (wide) whose slices it holds."""
    _inspect("gpus", kubeconfig=kubeconfig, scheduler=scheduler, config=config,
             output=output, node=node)


@inspect_app.command("pod")
def inspect_pod(pod: Annotated[str, typer.Argument(help="NAMESPACE/NAME")],
                kubeconfig: KubeconfigOpt = None, scheduler: SchedulerOpt = None,
                config: ConfigOpt = None, output: OutputOpt = "text") -> None:
    """One pod: what it asks, its assignment and limits, or why it is pending."""
    _inspect("pod", kubeconfig=kubeconfig, scheduler=scheduler, config=config,
             output=output, pod=pod)


@inspect_app.command("quotas")
def inspect_quotas(kubeconfig: KubeconfigOpt = None, scheduler: SchedulerOpt = None,
                   config: ConfigOpt = None, output: OutputOpt = "text") -> None:
    """Each namespace's vGPU memory / cores quota against what its pods really take."""
    _inspect("quotas", kubeconfig=kubeconfig, scheduler=scheduler, config=config,
             output=output)


def _register_roles() -> None:
    try:
        from vgpud.extender.command import scheduler
    except ImportError:
        pass
    else:
        app.command("scheduler", help="Run the kube-scheduler extender.")(scheduler)
    try:
        from vgpud.plugin.command import plugin
    except ImportError:
        pass
    else:
        app.command("plugin", help="Run the kubelet device plugin on a GPU node.")(plugin)
    try:
        from vgpud.dra.command import dra
    except ImportError:
        pass
    else:
        app.command("dra", help="Run the kubelet DRA plugin on a GPU node.")(dra)
    try:
        from vgpud.webhook.command import webhook
    except ImportError:
        pass
    else:
        app.command("webhook", help="Run the admission webhook for GPU pods.")(webhook)


_register_roles()
