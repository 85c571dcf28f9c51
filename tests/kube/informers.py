"""What the informer tests share: pods to create, a projection, a quick backoff, and
an informer of pods' nodes that records its events."""

from __future__ import annotations

from typing import Any

from tests.builders import gpu_pod
from vgpud.kube.backoff import Backoff
from vgpud.kube.cache import Event, Informer
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.resources import PODS


def pod(name: str, node: str = "", namespace: str = "default") -> dict[str, Any]:
    return gpu_pod(name, namespace=namespace, annotations=None, scheduler=None, node=node or None,
                   image="busybox", typed=False)


def node_of(pod: Json) -> str:
    return str(pod["spec"].get("nodeName", ""))


def fast_backoff() -> Backoff:
    return Backoff(initial=0.01, cap=0.05, jitter=0)


def recording(kube: KubeClient, **options: Any) -> tuple[Informer[str], list[Event[str]]]:
    """An informer of each pod's node (quick to back off) and the events it emits."""
    informer: Informer[str] = Informer(kube, PODS, project=node_of, backoff=fast_backoff(),
                                       **options)
    events: list[Event[str]] = []
    informer.subscribe(events.append)
    return informer, events
