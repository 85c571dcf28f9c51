"""``vgpud dra``: the command-line entry (registered by ``vgpud.cli``).

Parses flags, loads the settings once, configures logging, and runs
:func:`vgpud.dra.run.main` until interrupted. Bad input ends with a message and exit
status 2, never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import anyio
import typer

from vgpud.config import ConfigError, load_settings

DEFAULT_PODRES = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_STATE = "/var/lib/vgpud"


def dra(
    node_name: Annotated[str | None, typer.Option(
        "--node-name", envvar="NODE_NAME", help="This node's name (default $NODE_NAME).")] = None,
    kubeconfig: Annotated[str | None, typer.Option(
        "--kubeconfig", help="kubeconfig file (else in-cluster, else $KUBECONFIG).")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", help="Settings file (YAML or JSON).")] = None,
    kubelet_dir: Annotated[str, typer.Option(
        "--kubelet-dir", help="kubelet's --root-dir (its plugins and plugins_registry "
        "directories are under it).")] = "/var/lib/kubelet",
    cdi_dir: Annotated[str, typer.Option(
        "--cdi-dir", help="Where the container runtime reads CDI specs.")] = "/var/run/cdi",
    pod_resources_socket: Annotated[str, typer.Option(
        "--pod-resources-socket", help="kubelet's PodResources socket.")] = DEFAULT_PODRES,
    state_dir: Annotated[str, typer.Option(
        "--state-dir", help="Per-claim config and state directories, the checkpoint."
        )] = DEFAULT_STATE,
    fake_devices: Annotated[str | None, typer.Option(
        "--fake-devices", help="Read GPUs from this YAML/JSON file instead of NVML.")] = None,
    listen: Annotated[str | None, typer.Option(
        "--listen", help="HOST:PORT of /metrics (default: plugin.metricsListen).")] = None,
) -> None:
    """Run the kubelet DRA plugin (driver gpu.vgpud.io) on a GPU node."""
    from vgpud.dra.run import DraOptions, main
    from vgpud.kube.errors import KubeError
    from vgpud.node.devices import DiscoveryError
    from vgpud.node.shim import ShimError

    try:
        settings = load_settings(config, env=os.environ)
    except ConfigError as e:
        typer.echo(f"vgpud: {e}", err=True)
        raise typer.Exit(2) from None
    from vgpud.logs import configure

    configure(settings.logLevel, settings.logFormat)
    if not node_name:
        typer.echo("vgpud: --node-name (or $NODE_NAME) is required", err=True)
        raise typer.Exit(2)
    opts = DraOptions(
        node_name=node_name, pod_resources_socket=Path(pod_resources_socket),
        state_dir=Path(state_dir), settings=settings, metrics_listen=listen,
        require_shim=fake_devices is None, kubelet_dir=Path(kubelet_dir),
        cdi_dir=Path(cdi_dir))
    try:
        anyio.run(main, opts, kubeconfig, fake_devices)
    except KeyboardInterrupt:
        pass
    except (KubeError, DiscoveryError, ShimError, ValueError, OSError) as e:
        typer.echo(f"vgpud dra: {e}", err=True)
        raise typer.Exit(2) from None
