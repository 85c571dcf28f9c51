"""GPUs that come and go, over the fake-devices file (the scenario: hotplug.py)."""

from __future__ import annotations

import pytest

from tests.plugin.harness import node_harness
from tests.plugin.hotplug import SETTINGS, FileBus, hotplug_scenario

pytestmark = pytest.mark.anyio


async def test_remove_add_and_swap_gpus_under_running_pods() -> None:
    async with node_harness(4, settings=SETTINGS) as h:
        await hotplug_scenario(h, FileBus.of(h.devices_file))
