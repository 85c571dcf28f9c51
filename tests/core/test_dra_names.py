"""The DRA device names (vgpud.core.dra): the slices' names and the claims' reading of them
are one function and its inverse, for every inventory entry, in any order; any other name
is refused with a reason, never resolved to a neighbour nor a crash."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import examples
from vgpud.core.dra import DeviceNameError, device_names, device_of, offered_names
from vgpud.core.model import Gpu, NodeInventory
from vgpud.core.slices import devices

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@st.composite
def inventories(draw: st.DrawFn) -> NodeInventory:
    """GPUs by index, some in MIG mode with up to 7 instances (placed whole or shared),
    listed in any order (so the order of the list is never the instances' uuid order by
    construction)."""
    gpus: list[Gpu] = []
    whole = draw(st.booleans())
    for index in range(draw(st.integers(0, 8))):
        parent = f"GPU-{index}"
        mig = draw(st.booleans())
        gpus.append(Gpu(parent, index, "A100", 81920, mig=mig))
        ids = draw(st.booleans())  # NVML's ids known (discovery), or not (a devices file)
        gis = draw(st.permutations(range(1, 15)))
        for k in range(draw(st.integers(0, 7)) if mig else 0):
            gpus.append(Gpu(f"MIG-{index}-{k}", index, "A100 MIG", 9856, split=1,
                            profile="1g.10gb" if whole else "", parent=parent,
                            instance=f"{gis[k]}-0" if ids else ""))
    return NodeInventory(tuple(draw(st.permutations(gpus))))


@pytest.mark.property
@settings(max_examples=examples(150, 2000))
@given(inv=inventories(), other=st.text(max_size=12) | st.from_regex(
    r"\Agpu-[0-9]{1,2}(-mig-[0-9]{1,2})?\Z"))
def test_every_published_name_is_its_entry_and_no_other_name_is_any(inv: NodeInventory,
                                                                    other: str) -> None:
    published = devices(inv)
    names = [d.name for d in published]
    assert len(set(names)) == len(names) and all(DNS_LABEL.match(n) for n in names)
    assert names == offered_names(inv.devices)
    assert {d.uuid for d in published} == {g.uuid for g in inv.devices if not g.mig}
    for d in published:
        assert device_of(inv.devices, d.name).uuid == d.uuid
    assert device_names(inv.devices) == device_names(reversed(inv.devices))
    if other not in names:
        with pytest.raises(DeviceNameError) as e:
            device_of(inv.devices, other)
        assert str(e.value).startswith("has ")


def test_instances_are_counted_per_gpu_in_uuid_order() -> None:
    gpus = (Gpu("GPU-p", 3, "A100", 81920, mig=True),
            Gpu("MIG-b", 3, "A100 MIG", 9856, parent="GPU-p"),
            Gpu("MIG-a", 3, "A100 MIG", 9856, parent="GPU-p"),
            Gpu("GPU-q", 4, "A100", 81920))
    assert device_names(gpus) == {"GPU-p": "gpu-3", "MIG-b": "gpu-3-mig-1",
                                  "MIG-a": "gpu-3-mig-0", "GPU-q": "gpu-4"}
    assert offered_names(gpus) == ["gpu-3-mig-1", "gpu-3-mig-0", "gpu-4"]


def test_an_instance_keeps_its_name_when_another_goes() -> None:
    # named by NVML's GPU and compute instance ids: a claim allocated on gpu-0-mig-9-0
    # before instance 7 was destroyed is prepared on the same instance after
    a, b, c = (Gpu(f"MIG-{x}", 0, "A100 MIG", 9856, parent="GPU-0", instance=f"{gi}-0")
               for x, gi in (("a", 7), ("b", 9), ("c", 11)))
    gpu = Gpu("GPU-0", 0, "A100", 81920, mig=True)
    before = device_names((gpu, a, b, c))
    assert [before[g.uuid] for g in (a, b, c)] == ["gpu-0-mig-7-0", "gpu-0-mig-9-0",
                                                    "gpu-0-mig-11-0"]
    after = (gpu, b, c)
    assert device_of(after, "gpu-0-mig-9-0") is b
    with pytest.raises(DeviceNameError, match="has no MIG instance gpu-0-mig-7-0: GPU 0's "
                       "instances are gpu-0-mig-9-0, gpu-0-mig-11-0"):
        device_of(after, "gpu-0-mig-7-0")
