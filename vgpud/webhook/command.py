"""The ``vgpud webhook`` command line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import anyio
import typer

from vgpud.config import ConfigError, load_settings
from vgpud.logs import configure


def webhook(
    listen: Annotated[str, typer.Option(
        help="HOST:PORT for HTTPS: POST /mutate and /validate")] = "0.0.0.0:9443",
    tls_cert: Annotated[Path, typer.Option(
        help="serving certificate (PEM); reloaded when the file changes")] = Path("tls.crt"),
    tls_key: Annotated[Path, typer.Option(help="its private key (PEM)")] = Path("tls.key"),
    config: Annotated[Path | None, typer.Option(help="settings file (YAML or JSON)")] = None,
    metrics_listen: Annotated[str | None, typer.Option(
        help="HOST:PORT (plain HTTP) for /healthz, /readyz and /metrics (default: on "
             "--listen)")] = None,
    kubeconfig: Annotated[str | None, typer.Option(
        help="kubeconfig file (default: in-cluster, else $KUBECONFIG)")] = None,
    bootstrap_secret: Annotated[str | None, typer.Option(
        help="built-in certificates: keep a CA and serving certificate in this Secret, "
             "write the pair to --tls-cert/--tls-key, and set the caBundle")] = None,
    namespace: Annotated[str | None, typer.Option(
        envvar="POD_NAMESPACE", help="namespace of the Secret (default $POD_NAMESPACE)")] = None,
    service_name: Annotated[str, typer.Option(
        help="the webhook Service, for the certificate's DNS names")] = "vgpud-webhook",
    webhook_configuration: Annotated[str | None, typer.Option(
        help="Mutating/ValidatingWebhookConfiguration whose caBundle to set")] = None,
) -> None:
    """Run the admission webhook: set schedulerName and defaults, refuse bad GPU requests."""
    from vgpud.kube.errors import ConfigError as KubeConfigError
    from vgpud.kube.errors import KubeError
    from vgpud.process import parse_listen
    from vgpud.webhook.bootstrap import BootstrapError
    from vgpud.webhook.run import BootstrapOptions, run_webhook
    from vgpud.webhook.tls import TlsError

    try:
        settings = load_settings(config, env=os.environ)
        parse_listen(listen)
        if metrics_listen:
            parse_listen(metrics_listen, "--metrics-listen")
        if bootstrap_secret and not namespace:
            raise ValueError("--bootstrap-secret needs --namespace (or $POD_NAMESPACE)")
    except (ConfigError, ValueError) as e:
        typer.echo(f"vgpud: {e}", err=True)
        raise typer.Exit(2) from None
    configure(settings.logLevel, settings.logFormat)
    boot = None
    if bootstrap_secret:
        assert namespace
        boot = BootstrapOptions(bootstrap_secret, namespace, service_name, webhook_configuration)
    try:
        anyio.run(lambda: run_webhook(settings, kubeconfig=kubeconfig, listen=listen,
                                      tls_cert=tls_cert, tls_key=tls_key,
                                      metrics_listen=metrics_listen, bootstrap=boot))
    except (KubeConfigError, ConfigError, TlsError, BootstrapError, KubeError) as e:
        typer.echo(f"vgpud webhook: {e}", err=True)
        raise typer.Exit(2) from None
    except OSError as e:
        typer.echo(f"vgpud webhook: cannot serve on {listen}: {e.strerror or e}", err=True)
        raise typer.Exit(1) from None
