"""The three users of the fit vocabulary agree (issue 8).

For random clusters, random load and a random pod: a node is feasible by the filter
exactly when :func:`~vgpud.core.choose.place` finds a placement on it and the ledger
accepts that placement. The raw vectorised filter is the same set when it claims to be
exact, and a superset otherwise. A node refused as *unresolvable* stays refused when
every other pod leaves; a node refused as *resolvable* takes the pod on an empty
cluster.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import examples
from vgpud.core.allocate import Allocator
from vgpud.core.choose import place
from vgpud.core.fit import filter_nodes
from vgpud.core.model import Defaults, Gpu, Node, NodeInventory, Placement
from vgpud.core.requests import RequestError, parse_pod

MODELS = ("NVIDIA A100-SXM4-40GB", "Tesla V100-PCIE-32GB", "NVIDIA L4")


@st.composite
def nodes(draw: st.DrawFn) -> list[Node]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 4))
        uuids = [f"GPU-{i}-{k}" for k in range(n)]
        linked = draw(st.booleans())
        gpus = tuple(
            Gpu(uuid=u, index=k, model=draw(st.sampled_from(MODELS)),
                memory=draw(st.sampled_from([8000, 16000, 40000])),
                split=draw(st.integers(1, 4)), numa=draw(st.integers(0, 1)),
                links=tuple(x for x in uuids if x != u) if linked else (),
                healthy=draw(st.booleans().map(lambda b: b or draw(st.booleans()))),
                mig=draw(st.integers(0, 9)) == 0)
            for k, u in enumerate(uuids))
        out.append(Node(f"n{i}", NodeInventory(
            gpus, memory_scaling=draw(st.sampled_from([1.0, 1.5])),
            core_scaling=draw(st.sampled_from([1.0, 1.15])))))
    return out


def _limits(draw: st.DrawFn) -> dict[str, Any]:
    lim: dict[str, Any] = {"nvidia.com/vgpu-number": draw(st.integers(1, 3))}
    kind = draw(st.sampled_from(["memory", "percent", "none"]))
    if kind == "memory":
        lim["nvidia.com/vgpu-memory"] = draw(st.sampled_from([1, 4000, 8000, 12000, 30000]))
    elif kind == "percent":
        lim["nvidia.com/vgpu-memory-percentage"] = draw(st.sampled_from([10, 50, 100]))
    lim["nvidia.com/vgpu-cores"] = draw(st.sampled_from([0, 15, 30, 50, 100]))
    return lim


@st.composite
def pods(draw: st.DrawFn, name: str) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "resources": {"limits": _limits(draw)}}
                  for i in range(draw(st.integers(1, 2)))]
    init = []
    for i in range(draw(st.integers(0, 2))):
        c: dict[str, Any] = {"name": f"i{i}", "resources": {"limits": _limits(draw)}}
        if draw(st.booleans()):
            c["restartPolicy"] = "Always"  # a sidecar
        init.append(c)
    ann = {"nvidia.com/device-scheduler-policy": draw(st.sampled_from(["binpack", "spread"]))}
    topology = draw(st.sampled_from(["", "numa", "link"]))
    if topology:
        ann["nvidia.com/device-topology-mode"] = topology
    if draw(st.integers(0, 4)) == 0:
        ann["nvidia.com/include-gpu-type"] = draw(st.sampled_from(["A100", "V100", "L4"]))
    if draw(st.integers(0, 4)) == 0:
        ann["nvidia.com/exclude-gpu-uuid"] = f"GPU-0-{draw(st.integers(0, 3))}"
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                         "annotations": ann}, "spec": spec}


def _allocator(cluster: list[Node]) -> Allocator:
    a = Allocator(Defaults())
    for n in cluster:
        a.set_node(n)
    return a


@pytest.mark.property
@settings(max_examples=examples(120, 1000))
@given(cluster=nodes(), load=st.lists(pods("load"), max_size=6), probe=pods("probe"))
def test_filter_place_and_ledger_agree(cluster: list[Node], load: list[dict[str, Any]],
                                       probe: dict[str, Any]) -> None:
    a = _allocator(cluster)
    for i, manifest in enumerate(load):
        manifest["metadata"]["uid"] = f"uid-load-{i}"
        manifest["metadata"]["name"] = f"load-{i}"
        try:
            a.schedule(parse_pod(manifest, a.defaults))
        except RequestError:
            pass
    try:
        pod = parse_pod(probe, a.defaults)
    except RequestError:
        return
    if not pod.wants_gpu:
        return
    names = [n.name for n in cluster]
    got = a.filter(pod, names)
    assert set(got.feasible) | set(got.failed) == set(names)
    raw = filter_nodes(a.cluster, pod)
    raw_feasible = {a.cluster.node_names[i] for i in raw.feasible.tolist()}
    empty = _allocator(cluster)
    for name in names:
        placed = place(a.cluster, pod, name)
        accepted = isinstance(placed, Placement) and a.ledger.room(placed) is None
        assert (name in got.feasible) == accepted, (name, got.failed.get(name), placed)
        assert name in raw_feasible or not accepted
        if raw.exact:
            assert (name in raw_feasible) == accepted
        if name in got.failed:
            fits_empty = isinstance(place(empty.cluster, pod, name), Placement)
            assert got.failed[name].resolvable == fits_empty, (name, got.failed[name])
    assert a.ledger.violations() == []


def _one_node(split: int, numa: tuple[int, ...]) -> Allocator:
    gpus = tuple(Gpu(uuid=f"GPU-{k}", index=k, model="NVIDIA A100-SXM4-40GB", memory=8000,
                     split=split, numa=n) for k, n in enumerate(numa))
    return _allocator([Node("n0", NodeInventory(gpus))])


def _manifest(name: str, numbers: list[int], ann: dict[str, str] | None = None,
              ) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "annotations": ann or {}},
            "spec": {"containers": [{"name": f"c{i}", "resources": {"limits": {
                "nvidia.com/vgpu-number": n, "nvidia.com/vgpu-memory": 1}}}
                for i, n in enumerate(numbers)]}}


def test_two_containers_never_fit_one_gpu_of_split_1_even_when_it_is_busy() -> None:
    """Found by the property above: the vector filter judged each container alone and
    called the node resolvable ("split count used up") while it can never hold both."""
    a = _one_node(split=1, numa=(0,))
    assert a.schedule(parse_pod(_manifest("load", [1]), a.defaults)).placement is not None
    got = a.filter(parse_pod(_manifest("probe", [1, 1]), a.defaults), ["n0"])
    assert got.feasible == []
    assert not got.failed["n0"].resolvable, got.failed["n0"]


def test_a_numa_request_no_numa_node_can_hold_is_unresolvable_first() -> None:
    """Found by the property above: 3 GPUs on one NUMA node were asked of a node with
    NUMA nodes of 2 and 1 GPUs; "split count used up" (resolvable) was reported first."""
    a = _one_node(split=1, numa=(0, 0, 1))
    for i in range(2):
        placed = a.schedule(parse_pod(_manifest(f"load{i}", [1]), a.defaults)).placement
        assert placed is not None
    pod = parse_pod(_manifest("probe", [3], {"nvidia.com/device-topology-mode": "numa"}),
                    a.defaults)
    got = a.filter(pod, ["n0"])
    assert got.failed["n0"].code == "numa" and not got.failed["n0"].resolvable
