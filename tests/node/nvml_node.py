"""A child process: the plugin over the fake NVML (nvidia-ml-py loads
``tests/fakes/build/libnvidia-ml.so.1`` by its soname, so the knobs must be in the
environment before the process starts), with the API stand-in and the fake kubelet, and
one of the node scenarios run against it:

    python -m tests.node.nvml_node hotplug|mixed|single|mixed-hami|single-hami

Exits 0 when the scenario's assertions held; a failed assertion's traceback goes to
stderr. ``tests/node/test_nvml_scenarios.py`` sets the knobs and runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio

from tests.plugin.harness import VGPU, node_harness
from tests.plugin.hotplug import SETTINGS, hotplug_scenario
from tests.plugin.mig import LAYOUT, mixed_scenario, single_scenario
from vgpud.node.nvml import NvmlGpus

ENUMERATE = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        u = pynvml.nvmlDeviceGetUUID(h)
        out.append([u.decode() if isinstance(u, bytes) else u, pynvml.nvmlDeviceGetMinorNumber(h)])
    except pynvml.NVMLError:  # lost, not yet off the bus
        continue
print(json.dumps(out))
"""

HOLD = """
import pynvml, sys
pynvml.nvmlInit()
print(pynvml.nvmlDeviceGetCount(), flush=True)
sys.stdin.readline()
print(pynvml.nvmlDeviceGetCount(), flush=True)
"""


class NvmlBus:
    """GPUs of the fake NVML: each change is a line of its events file (lost and remove,
    add, replace); what is present is what a fresh NVML session enumerates, asked in a
    child process (as ``nvidia-smi`` would be): this process is the plugin's, and an NVML
    reference of its own would keep the plugin's session, and its device list, alive."""

    def __init__(self, events: Path, spare: int) -> None:
        self.events = events
        self.spare = spare
        self._minors = self._enumerate()

    @staticmethod
    def _enumerate() -> dict[str, int]:
        done = subprocess.run([sys.executable, "-c", ENUMERATE], capture_output=True,
                              text=True, timeout=60, check=True)
        return {str(uuid): int(minor) for uuid, minor in json.loads(done.stdout)}

    def _line(self, text: str) -> None:
        with self.events.open("a") as f:
            f.write(text)
        self._minors = self._enumerate()

    def present(self) -> list[str]:
        return list(self._minors)

    def remove(self, uuid: str) -> None:
        n = self._minors[uuid]
        self._line(f"lost {n}\nremove {n}\n")  # Xid 79, then off the bus

    def add(self) -> None:
        # the fake NVML fixes its device list at nvmlInit, as NVML does: a session open
        # across the add does not count the new GPU; the plugin must start a new one
        held = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert held.stdin and held.stdout
        before = held.stdout.readline()
        self._line(f"add {self.spare}\n")
        after, _ = held.communicate("\n", timeout=60)
        assert before == after and len(self._minors) == int(before) + 1, (before, after)

    def replace(self, uuid: str) -> None:
        self._line(f"replace {self._minors[uuid]}\n")


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
        # each instance published with NVML's GPU and compute instance ids (the names
        # vgpud dra gives them, which another instance's destruction does not move)
        inv = await h.published_inventory()
        ids = {(g.parent, g.instance) for g in inv.devices if g.parent}
        assert len(ids) == sum(len(p) for p in LAYOUT.values()), ids
        assert all(re.fullmatch(r"\d+-\d+", i) for _, i in ids), ids
        if strategy == "mixed":
            await mixed_scenario(h, number)
        else:
            await single_scenario(h, number, memory)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
