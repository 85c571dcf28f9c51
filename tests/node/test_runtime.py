"""The node runtime on its own (vgpud.node.runtime), as a second adapter would start it:
no device plugin imported, no kubelet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.standin import ApiServer
from vgpud.config import parse_settings
from vgpud.core.codec import NODE_DEVICES
from vgpud.kube.client import KubeClient
from vgpud.node.cluster import KubeCluster
from vgpud.node.devices import Changes
from vgpud.node.fakegpus import FakeGpus
from vgpud.node.runtime import Node, NodeOptions, run_node
from vgpud.node.vendors import Nvidia

pytestmark = pytest.mark.anyio
NODE = "gpu-node-1"


def _devices(path: Path, n: int) -> None:
    path.write_text(json.dumps({"devices": [
        {"uuid": f"GPU-fa4ecda0-0000-4000-8000-{i:012x}", "index": i, "model": "NVIDIA Fake",
         "memory": 24576, "numa": 0, "links": [], "healthy": True, "mig": False}
        for i in range(n)]}))


def test_the_node_runtime_imports_no_adapter() -> None:
    code = ("import sys, vgpud.node.runtime, vgpud.node.configure\n"
            "print([m for m in sys.modules if m.startswith('vgpud.plugin')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.stdout.strip() == "[]"


async def test_run_node_is_ready_when_started_and_rediscovers_once_served(tmp_path: Path,
                                                                          ) -> None:
    root = tmp_path
    devices = root / "devices.json"
    _devices(devices, 2)
    settings = parse_settings({"plugin": {"shimHostDir": str(root / "shim"),
                                          "rediscoverSeconds": 0.1}})
    opts = NodeOptions(NODE, root / "podresources.sock", root / "state", settings,
                       metrics_listen="127.0.0.1:0", require_shim=False)
    async with ApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                             "status": {}})
        async with KubeClient.for_url(api.url) as kube, anyio.create_task_group() as tg:
            gpus = Nvidia(FakeGpus(devices, poll_interval=0.05), name="fake")
            node: Node = await tg.start(run_node, opts, gpus, KubeCluster(kube))
            assert len(node.devices.uuids) == 2 and node.metrics_port
            assert node.pods.cached("default", "nobody") is None  # the watch is filled
            seen: list[Changes] = []
            changed = anyio.Event()

            async def hook(changes: Changes) -> None:
                seen.append(changes)
                changed.set()

            node.on_change(hook)
            _devices(devices, 3)
            await anyio.sleep(0.5)
            assert not seen  # rediscovery waits for the adapter
            node.serving()
            with anyio.fail_after(10):
                await changed.wait()
            assert len(seen[0].added) == 1 and len(node.devices.uuids) == 3
            def published() -> bool:
                notes = api.get("nodes", NODE, "")["metadata"].get("annotations") or {}
                return NODE_DEVICES in notes

            with anyio.fail_after(10):
                while not published():  # noqa: ASYNC110 - the stand-in's store has no event
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("node_resources", [True, False])
async def test_the_gated_node_totals_are_an_adapters_to_publish(tmp_path: Path,
                                                                node_resources: bool) -> None:
    """With the CorePlugin and MemoryPlugin gates on, the device plugin's runtime writes the
    node totals into the Node's status capacity; ``vgpud dra``'s (``node_resources`` off:
    no device-plugin resource on its node, no nodes/status in its role) writes only the
    inventory annotation."""
    from vgpud.dra.run import DraOptions

    assert DraOptions(node_name=NODE, pod_resources_socket=tmp_path,
                      state_dir=tmp_path).node().node_resources is False
    devices = tmp_path / "devices.json"
    _devices(devices, 2)
    settings = parse_settings({"plugin": {"shimHostDir": str(tmp_path / "shim"),
                                          "featureGates": {"CorePlugin": True,
                                                           "MemoryPlugin": True}}})
    opts = NodeOptions(NODE, tmp_path / "podresources.sock", tmp_path / "state", settings,
                       metrics_listen="", require_shim=False, node_resources=node_resources)
    async with ApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                             "status": {}})
        async with KubeClient.for_url(api.url) as kube, anyio.create_task_group() as tg:
            gpus = Nvidia(FakeGpus(devices, poll_interval=0.05), name="fake")
            await tg.start(run_node, opts, gpus, KubeCluster(kube))

            def annotated() -> bool:
                return NODE_DEVICES in (api.get("nodes", NODE, "")["metadata"].get(
                    "annotations") or {})

            with anyio.fail_after(10):
                while not annotated():  # noqa: ASYNC110 - the stand-in's store has no event
                    await anyio.sleep(0.05)
            await anyio.sleep(0.3)  # the totals follow the annotation in the same round
            capacity = api.get("nodes", NODE, "")["status"].get("capacity") or {}
            if node_resources:
                assert {"nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory"} <= set(capacity)
            else:
                assert not capacity, capacity
            tg.cancel_scope.cancel()
