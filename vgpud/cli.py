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
        from vgpud.webhook.command import webhook
    except ImportError:
        pass
    else:
        app.command("webhook", help="Run the admission webhook for GPU pods.")(webhook)


_register_roles()
