"""The ``vgpud scheduler`` command line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import anyio
import typer

from vgpud.config import ConfigError, load_settings, with_feature_gates
from vgpud.logs import configure


def scheduler(
    kubeconfig: Annotated[str | None, typer.Option(
        help="kubeconfig file (default: in-cluster, else $KUBECONFIG)")] = None,
    listen: Annotated[str, typer.Option(
        help="HOST:PORT for the extender's verbs (filter/prioritize/bind); keep it on "
             "localhost beside kube-scheduler")] = "127.0.0.1:8888",
    metrics_listen: Annotated[str | None, typer.Option(
        help="HOST:PORT for /healthz, /readyz and /metrics (default: the --listen address)",
    )] = None,
    config: Annotated[Path | None, typer.Option(help="settings file (YAML or JSON)")] = None,
    leader_elect: Annotated[bool, typer.Option(
        help="take a coordination.k8s.io Lease so only one replica runs the reschedule "
             "controller (every replica serves filter, prioritize and bind)")] = False,
    lease_namespace: Annotated[str, typer.Option(help="namespace of the Lease")] = "kube-system",
    feature_gates: Annotated[str | None, typer.Option(
        help="gates over the settings file, e.g. SerialBindNode=true,GPUTopology=false "
             "(VGPU-Manager's names, old and new, are understood)")] = None,
) -> None:
    """Run the kube-scheduler extender: filter, prioritize and bind GPU pods."""
    from vgpud.extender.run import run_scheduler
    from vgpud.kube.errors import ConfigError as KubeConfigError
    from vgpud.process import parse_listen

    try:
        settings, notes = with_feature_gates(load_settings(config, env=os.environ),
                                             feature_gates, "scheduler")
        parse_listen(listen)
        if metrics_listen:
            parse_listen(metrics_listen, "--metrics-listen")
    except (ConfigError, ValueError) as e:
        typer.echo(f"vgpud: {e}", err=True)
        raise typer.Exit(2) from None
    configure(settings.logLevel, settings.logFormat)
    for note in notes:
        typer.echo(f"vgpud: --feature-gates: {note}", err=True)
    try:
        anyio.run(lambda: run_scheduler(settings, kubeconfig=kubeconfig, listen=listen,
                                        metrics_listen=metrics_listen,
                                        leader_elect=leader_elect,
                                        lease_namespace=lease_namespace))
    except (KubeConfigError, ConfigError) as e:
        typer.echo(f"vgpud: {e}", err=True)
        raise typer.Exit(2) from None
    except OSError as e:
        typer.echo(f"vgpud: cannot serve on {listen}: {e.strerror or e}", err=True)
        raise typer.Exit(1) from None
