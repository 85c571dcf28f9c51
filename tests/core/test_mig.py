"""MIG in the core: instances are devices of their own; one placed whole (``mixed``)
takes only requests for its profile, one shared (``single``) takes vGPU slices like a
GPU, and a physical GPU in MIG mode takes nothing. The codec and the request parser
carry the profile."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import gpu_pod
from vgpud.core.allocate import Allocator
from vgpud.core.codec import CodecError, decode_node_devices, encode_node_devices
from vgpud.core.model import Defaults, Gpu, Node, NodeInventory
from vgpud.core.requests import RequestError, parse_pod

A100 = "NVIDIA A100-SXM4-80GB"


def mig_node(name: str, *, mixed: bool, profiles: tuple[str, ...] = ("1g.10gb", "1g.10gb",
             "2g.20gb"), full: int = 1, split: int = 4) -> Node:
    """One A100 in MIG mode with ``profiles`` and ``full`` ordinary GPUs beside it."""
    parent = f"GPU-{name}-mig"
    mem = {"1g.10gb": 9728, "2g.20gb": 19456, "3g.40gb": 38912}
    gpus = [Gpu(uuid=parent, index=0, model=A100, memory=81920, split=split, mig=True)]
    for i, p in enumerate(profiles):
        gpus.append(Gpu(uuid=f"MIG-{name}-{i}", index=0, model=f"{A100} MIG {p}",
                        memory=mem[p], split=1 if mixed else split,
                        profile=p if mixed else "", parent=parent))
    for i in range(full):
        gpus.append(Gpu(uuid=f"GPU-{name}-{i + 1}", index=i + 1, model=A100, memory=81920,
                        split=split))
    return Node(name, NodeInventory(tuple(gpus)))


def pod(name: str, **limits: Any) -> dict[str, Any]:
    return gpu_pod(name, limits, uid=True, annotations=None, scheduler=None, image=None,
                   typed=False)


def test_a_profile_request_takes_whole_instances_of_that_profile_only() -> None:
    a = Allocator(Defaults())
    a.set_node(mig_node("n", mixed=True))
    first = a.schedule(parse_pod(pod("a", **{"nvidia.com/mig-1g.10gb": 2}), Defaults()))
    assert first.placement is not None
    devs = first.placement.containers[0].devices
    assert sorted(d.uuid for d in devs) == ["MIG-n-0", "MIG-n-1"]
    assert [(d.memory, d.cores) for d in devs] == [(9728, 100), (9728, 100)]
    # both 1g.10gb instances are held: the next one does not fit, resolvably
    got = a.filter(parse_pod(pod("b", **{"nvidia.com/mig-1g.10gb": 1}), Defaults()), ["n"])
    assert got.feasible == [] and got.failed["n"].resolvable
    # a profile the node does not have: never
    got = a.filter(parse_pod(pod("c", **{"nvidia.com/mig-3g.40gb": 1}), Defaults()), ["n"])
    assert got.feasible == [] and not got.failed["n"].resolvable
    assert "whole MIG 3g.40gb instance(s)" in got.failed["n"].message
    # vGPU requests go to the ordinary GPU only, never to an instance or the MIG parent
    v = a.schedule(parse_pod(pod("v", **{"nvidia.com/vgpu-number": 1,
                                          "nvidia.com/vgpu-memory": 1000}), Defaults()))
    assert v.placement is not None
    assert [d.uuid for d in v.placement.containers[0].devices] == ["GPU-n-1"]
    two = a.filter(parse_pod(pod("w", **{"nvidia.com/vgpu-number": 2,
                                          "nvidia.com/vgpu-memory": 1000}), Defaults()), ["n"])
    assert two.feasible == [] and not two.failed["n"].resolvable
    assert "not in MIG mode" in two.failed["n"].message


def test_shared_instances_take_vgpu_slices_like_small_gpus() -> None:
    a = Allocator(Defaults())
    a.set_node(mig_node("n", mixed=False, full=0, profiles=("3g.40gb", "3g.40gb")))
    placed = []
    for i in range(8):  # split 4 on each of two instances
        d = a.schedule(parse_pod(pod(f"p{i}", **{"nvidia.com/vgpu-number": 1,
                                                  "nvidia.com/vgpu-memory": 4000}), Defaults()))
        assert d.placement is not None, d
        placed.append(d.placement.containers[0].devices[0].uuid)
    assert sorted(set(placed)) == ["MIG-n-0", "MIG-n-1"]
    big = a.filter(parse_pod(pod("big", **{"nvidia.com/vgpu-number": 1,
                                           "nvidia.com/vgpu-memory": 40000}), Defaults()), ["n"])
    assert big.feasible == [] and not big.failed["n"].resolvable  # larger than any instance
    # no profile request fits a shared instance
    prof = a.filter(parse_pod(pod("x", **{"nvidia.com/mig-3g.40gb": 1}), Defaults()), ["n"])
    assert prof.feasible == [] and not prof.failed["n"].resolvable


def test_hami_preset_speaks_the_same_mig_names() -> None:
    d = Defaults(preset="hami")
    a = Allocator(d)
    a.set_node(mig_node("n", mixed=True))
    got = a.schedule(parse_pod(pod("h", **{"nvidia.com/mig-2g.20gb": 1}), d))
    assert got.placement is not None
    assert got.placement.containers[0].devices[0].uuid == "MIG-n-2"


@pytest.mark.parametrize(("limits", "message"), [
    ({"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}, "one profile per container"),
    ({"nvidia.com/mig-1g.10gb": 1, "nvidia.com/vgpu-memory": 100}, "one or the other"),
    ({"nvidia.com/mig-huge": 1}, "not a MIG profile name"),
    ({"nvidia.com/mig-1g.10gb": "1.5"}, "whole number"),
    ({"nvidia.com/mig-1g.10gb": 10_000}, "more than"),
])
def test_bad_mig_requests_are_refused_with_a_reason(limits: dict[str, Any],
                                                    message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_pod(pod("bad", **limits), Defaults())


def test_zero_instances_is_no_gpu_request() -> None:
    assert not parse_pod(pod("z", **{"nvidia.com/mig-1g.10gb": 0}), Defaults()).wants_gpu


def test_codec_round_trips_instances_and_rejects_bad_profiles() -> None:
    inv = mig_node("n", mixed=True).inventory
    text = encode_node_devices(inv)
    assert decode_node_devices(text) == inv
    plain = encode_node_devices(NodeInventory((Gpu("GPU-a", 0, "m", 1000),)))
    assert "profile" not in plain and "parent" not in plain  # old readers see no change
    bad = text.replace('"profile":"1g.10gb"', '"profile":"1g.10gb; rm -rf"', 1)
    with pytest.raises(CodecError, match="not a MIG profile name"):
        decode_node_devices(bad)


def test_codec_round_trips_an_instances_nvml_ids_and_rejects_others() -> None:
    inv = NodeInventory((Gpu("GPU-a", 0, "A100", 81920, mig=True),
                         Gpu("MIG-b", 0, "A100 MIG", 9728, parent="GPU-a", instance="13-0")))
    text = encode_node_devices(inv)
    assert '"instance":"13-0"' in text and decode_node_devices(text) == inv
    assert "instance" not in encode_node_devices(NodeInventory((Gpu("GPU-c", 0, "m", 1),)))
    for bad in ("13", "13-0-1", "a-b", "-1-0", "013-0"):
        with pytest.raises(CodecError, match="is not a MIG instance's ids"):
            decode_node_devices(text.replace('"13-0"', f'"{bad}"'))
