"""``vgpud plugin``: the command-line entry (registered by ``vgpud.cli``).

Parses flags, loads the settings once, configures logging, and runs
:func:`vgpud.plugin.run.main` until interrupted. Bad input ends with a message and
exit status 2, never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import anyio
import typer

from vgpud.config import ConfigError, load_settings, with_feature_gates

DEFAULT_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_PODRES = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_STATE = "/var/lib/vgpud"


def plugin(
    node_name: Annotated[str | None, typer.Option(
        "--node-name", envvar="NODE_NAME", help="This node's name (default $NODE_NAME).")] = None,
    kubeconfig: Annotated[str | None, typer.Option(
        "--kubeconfig", help="kubeconfig file (else in-cluster, else $KUBECONFIG).")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", help="Settings file (YAML or JSON).")] = None,
    device_plugin_dir: Annotated[str, typer.Option(
        "--device-plugin-dir", help="kubelet's device-plugin directory.")] = DEFAULT_DIR,
    pod_resources_socket: Annotated[str, typer.Option(
        "--pod-resources-socket", help="kubelet's PodResources socket.")] = DEFAULT_PODRES,
    state_dir: Annotated[str, typer.Option(
        "--state-dir", help="Per-allocation config and state directories.")] = DEFAULT_STATE,
    fake_devices: Annotated[str | None, typer.Option(
        "--fake-devices", help="Read GPUs from this YAML/JSON file instead of NVML.")] = None,
    listen: Annotated[str | None, typer.Option(
        "--listen", help="HOST:PORT of /metrics (default: plugin.metricsListen).")] = None,
    feature_gates: Annotated[str | None, typer.Option(
        "--feature-gates", help="Gates over the settings file, e.g. CorePlugin=true,"
        "MemoryPlugin=true (VGPU-Manager's names, old and new, are understood).")] = None,
) -> None:
    """Run the kubelet device plugin on a GPU node."""
    from vgpud.kube.errors import KubeError
    from vgpud.node.devices import DiscoveryError
    from vgpud.node.shim import ShimError
    from vgpud.plugin.run import PluginOptions, main

    try:
        settings, notes = with_feature_gates(load_settings(config, env=os.environ),
                                             feature_gates, "plugin")
    except ConfigError as e:
        typer.echo(f"vgpud: {e}", err=True)
        raise typer.Exit(2) from None
    for note in notes:
        typer.echo(f"vgpud: --feature-gates: {note}", err=True)
    try:
        from vgpud.logs import configure
    except ImportError:
        pass
    else:
        configure(settings.logLevel, settings.logFormat)
    if not node_name:
        typer.echo("vgpud: --node-name (or $NODE_NAME) is required", err=True)
        raise typer.Exit(2)
    opts = PluginOptions(
        node_name=node_name, device_plugin_dir=Path(device_plugin_dir),
        pod_resources_socket=Path(pod_resources_socket), state_dir=Path(state_dir),
        settings=settings, metrics_listen=listen, require_shim=fake_devices is None)
    try:
        anyio.run(main, opts, kubeconfig, fake_devices)
    except KeyboardInterrupt:
        pass
    except (KubeError, DiscoveryError, ShimError, ValueError, OSError) as e:
        typer.echo(f"vgpud plugin: {e}", err=True)
        raise typer.Exit(2) from None
