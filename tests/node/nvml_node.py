"""A child process: the plugin over the fake NVML (nvidia-ml-py loads
``tests/fakes/build/libnvidia-ml.so.1`` by its soname, so the knobs must be in the
environment before the process starts), with the API stand-in and the fake kubelet, and
one of the node scenarios run against it:

    python -m tests.node.nvml_node hotplug|mixed|single|mixed-hami|single-hami

Exits 0 when the scenario's assertions held; a failed assertion's traceback goes to
stderr. ``tests/node/test_nvml_scenarios.py`` sets the knobs and runs it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pynvml

from tests.plugin.harness import VGPU, node_harness
from tests.plugin.hotplug import SETTINGS, hotplug_scenario
from tests.plugin.mig import mixed_scenario, single_scenario
from vgpud.node.nvml import NvmlGpus


class NvmlBus:
    """GPUs of the fake NVML: each change is a line of its events file (lost and remove,
    add, replace); what is present is what NVML enumerates."""

    def __init__(self, events: Path, spare: int) -> None:
        self.events = events
        self.spare = spare
        pynvml.nvmlInit()

    def _line(self, text: str) -> None:
        with self.events.open("a") as f:
            f.write(text)

    def _minor(self, uuid: str) -> int:
        return int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByUUID(uuid)))

    def present(self) -> list[str]:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                out.append(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            except pynvml.NVMLError:  # lost, not yet off the bus
                continue
        return [u.decode() if isinstance(u, bytes) else u for u in out]

    def remove(self, uuid: str) -> None:
        n = self._minor(uuid)
        self._line(f"lost {n}\nremove {n}\n")  # Xid 79, then off the bus

    def add(self) -> None:
        self._line(f"add {self.spare}\n")

    def replace(self, uuid: str) -> None:
        self._line(f"replace {self._minor(uuid)}\n")


async def main(scenario: str) -> None:
    def source(_file: Path) -> NvmlGpus:
        return NvmlGpus(wait_ms=20)

    if scenario == "hotplug":
        async with node_harness(settings=SETTINGS, source=source) as h:
            await hotplug_scenario(h, NvmlBus(Path(os.environ["FAKECUDA_EVENTS"]), spare=4))
        return
    strategy, _, preset = scenario.partition("-")
    preset = preset or "vgpu-manager"
    number, memory = ((VGPU, "nvidia.com/vgpu-memory") if preset == "vgpu-manager"
                      else ("nvidia.com/gpu", "nvidia.com/gpumem"))
    settings = {"resourcePreset": preset, "deviceSplitCount": 4,
                "plugin": {"migStrategy": strategy}}
    async with node_harness(settings=settings, source=source, resources=[number]) as h:
        if strategy == "mixed":
            await mixed_scenario(h, number)
        else:
            await single_scenario(h, number, memory)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
