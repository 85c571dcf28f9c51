"""The in-memory doubles (tests/doubles.py) keep the shape of the ports they stand for:
each public method of ``PodBinder``'s writes, of ``ClusterApi`` and of
``KubeClient.request`` is there, with the same parameters, so code that calls the real
one calls the double the same way."""

from __future__ import annotations

import inspect

import pytest

from tests.doubles import MemoryBinder, MemoryCluster, MemoryKube
from vgpud.kube.client import KubeClient
from vgpud.kube.writes import PodBinder
from vgpud.node.cluster import ClusterApi


def params(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


def methods(port: type) -> list[str]:
    return [n for n, v in vars(port).items() if not n.startswith("_") and callable(v)]


@pytest.mark.parametrize(("double", "real", "names"), [
    (MemoryBinder, PodBinder, ["bind", "read_pod"]),
    (MemoryCluster, ClusterApi, methods(ClusterApi)),
    (MemoryKube, KubeClient, ["request"]),
])
def test_a_double_has_its_ports_methods(double: type, real: type, names: list[str]) -> None:
    assert names
    for name in names:
        ours, theirs = getattr(double, name), getattr(real, name)
        assert params(ours) == params(theirs), name
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs), name
