"""A GPU node wired end to end, as deployed, with real containers.

:func:`gpu_node` gives a :class:`GpuNode`: the API stand-in (in process), the fake
kubelet (grpcio, in process), ``vgpud plugin`` as its own process over the fake NVML
(pynvml loads ``tests/fakes/build/libnvidia-ml.so.1``), and a :class:`tests.oci.Node`
that turns the plugin's Allocate responses into real runc containers. The shim reaches
each container the way the plugin puts it there (``/etc/ld.so.preload``, read only);
the fake driver stands in for the NVIDIA container runtime's libraries
(``/opt/fakecuda``) and for the GPU itself (its state file, shared by every container
and the plugin, and its host-PID oracle, the kernel's view of a PID).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import yaml

from tests import builders
from tests.e2e.cluster import free_port
from tests.fakekubelet import FakePod
from tests.fakekubelet.kubelet import Admitted, FakeKubelet
from tests.fakes.hostpid import HostPidOracle
from tests.oci.conftest import compile_c, node, runc  # noqa: F401 (fixtures)
from tests.oci.kubelet import Bind
from tests.oci.runtime import Container, Node
from tests.standin import ApiServer
from vgpud.core.model import Placement

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"
MIB = 1 << 20
UUID = "GPU-fa4ecda0-0000-4000-8000-{:012x}".format  # the fake driver's GPU n
FAKES = ROOT / "tests/fakes/build"
PROGS = ROOT / "tests/shim/progs/build"


@pytest.fixture(scope="session")
def built() -> None:
    """The shim, the fake driver and NVML, and the test programs."""
    for d in ("csrc", "tests/fakes"):
        subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True)
    subprocess.run(["make", "-s", "-C", str(ROOT / "tests/shim/progs"), f"FAKES={FAKES}"],
                   check=True)


def placement(containers: dict[str, list[tuple[int, int, int]]]) -> Placement:
    """{container: [(gpu, MiB, cores)]} on this node."""
    return builders.placement(containers, node=NODE, uuid=UUID, time="2026-11-23T00:00:00Z")


@dataclass
class GpuNode:
    api: ApiServer
    kubelet: FakeKubelet
    node: Node
    root: Path
    metrics_url: str
    gpu_env: dict[str, str]
    binds: list[Bind]
    plugin: subprocess.Popen[bytes]
    log: Path
    uids: dict[str, str] = field(default_factory=dict)

    def add_pod(self, name: str, grant: Placement, env: dict[str, str] | None = None,
                ) -> dict[str, Any]:
        containers = [{"name": c.name, "image": "cuda", "env": [
            {"name": k, "value": v} for k, v in (env or {}).items()],
            "resources": {"limits": {"nvidia.com/vgpu-number": str(len(c.devices))}}}
            for c in grant.containers]
        pod = self.api.create("pods", builders.gpu_pod(
            name, assignment=grant, node=NODE, phase="Pending", containers=containers), "default")
        self.uids[name] = pod["metadata"]["uid"]
        return pod

    async def admit(self, pod: str, containers: dict[str, int]) -> Admitted:
        fp = FakePod("default", pod, list(containers.items()))
        return await anyio.to_thread.run_sync(self.kubelet.run, fp)

    def container(self, pod: str, name: str, admitted: Admitted, args: list[str],
                  env: dict[str, str] | None = None) -> Container:
        """Container ``name`` of ``pod`` as kubelet would start it: the plugin's Allocate
        response applied, the pod's env over it."""
        return self.node.container(
            name, args, allocate=admitted.responses[name], pod_uid=self.uids[pod],
            pod_env={**self.gpu_env, **(env or {})}, driver=FAKES,
            extra_mounts=self.binds)

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s, s.get(f"{self.metrics_url}/metrics") as r:
            return await r.text()

    async def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.api.objects("events") if e.get("reason") == reason]


def metric(text: str, name: str, **labels: str) -> float | None:
    """A sample's value from Prometheus text, by name and (some of its) labels."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


@contextlib.contextmanager
def _plugin(root: Path, kubeconfig: Path, kubelet: FakeKubelet, settings: dict[str, Any],
            gpu_env: dict[str, str], port: int) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    cfg = root / "vgpud.yaml"
    cfg.write_text(yaml.safe_dump(settings))
    log = root / "plugin.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPUD_", "FAKECUDA_"))}
    env.update(gpu_env, LD_LIBRARY_PATH=str(FAKES), NODE_NAME=NODE,
               VGPUD_SHIM_LIBRARY=str(ROOT / "csrc/build/libvgpu.so.0.1.0"))
    with log.open("wb") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "vgpud", "plugin", "--kubeconfig", str(kubeconfig),
             "--config", str(cfg), "--device-plugin-dir", str(kubelet.plugin_dir),
             "--pod-resources-socket", str(kubelet.podres_socket),
             "--state-dir", str(root / "state"), "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield p, log
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.asynccontextmanager
async def gpu_node(runtime: Node, *, gpus: int = 1, action: str = "warn",
                   ctx_mib: int = 300) -> AsyncIterator[GpuNode]:
    root = runtime.path("world")
    gpu_dir, oracle_dir = runtime.path("gpu"), runtime.path("oracle")
    gpu_env = {"FAKECUDA_STATE": str(gpu_dir / "gpu.state"),
               "FAKECUDA_DEVICES": ",".join(["24576"] * gpus),
               "FAKECUDA_CTX_MIB": str(ctx_mib),
               "FAKECUDA_HOST_PID_SOCK": str(oracle_dir / "hostpid.sock")}
    settings = {"logLevel": "info", "plugin": {
        "shimHostDir": str(root / "shim"), "overLimitAction": action,
        "overLimitGraceSeconds": 1.0, "watchdogIntervalSeconds": 0.25}}
    port = free_port()
    with HostPidOracle(oracle_dir / "hostpid.sock"):
        async with ApiServer() as api:
            api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                                 "status": {}})
            kubeconfig = root / "kubeconfig"
            kubeconfig.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "s",
                "clusters": [{"name": "s", "cluster": {"server": api.url}}],
                "users": [{"name": "s", "user": {"token": "t"}}],
                "contexts": [{"name": "s", "context": {"cluster": "s", "user": "s"}}]}))
            kubelet = FakeKubelet(root)
            kubelet.start_servers()
            try:
                with _plugin(root, kubeconfig, kubelet, settings, gpu_env, port) as (p, log):
                    try:
                        await anyio.to_thread.run_sync(kubelet.wait_registered, 1, 30.0)
                    except Exception:
                        raise AssertionError(f"the plugin did not register:\n"
                                             f"{log.read_text()[-3000:]}") from None
                    binds = [Bind.same(gpu_dir), Bind.same(oracle_dir, read_only=True),
                             Bind(PROGS, "/opt/progs", True)]
                    yield GpuNode(api, kubelet, runtime, root, f"http://127.0.0.1:{port}",
                                  gpu_env, binds, p, log)
            finally:
                await anyio.to_thread.run_sync(kubelet.stop)
                shutil.rmtree(root / "shim", ignore_errors=True)
