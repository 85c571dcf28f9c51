"""Allocate + PreStartContainer latency, and the plugin's RSS and idle CPU, 8 fake GPUs.

    python benchmarks/plugin_latency.py [--pods 200] [--idle 20]

Runs ``vgpud plugin`` as its own process (``--fake-devices``, 8 GPUs × split 10)
against the API stand-in (its own process, as an API server is, seeded with the node
and every pod, assignments written; ``--api-inline``: in this process, each pod created
just before its admission) and the fake kubelet (this process). The fake kubelet admits
each pod (GetPreferredAllocation + Allocate) and starts it (PreStartContainer). Prints
one line with the total's p50 and p99 (admission + PreStartContainer, the figure
issue 25 sets at most 20 ms p99 for), then JSON: latency percentiles in ms, and the
plugin process's RSS (MiB) and CPU (% of one core) while idle. The pods stay in the
API (only kubelet forgets them), so the node's pods number ``--pods``: what a LIST per
call paid for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakekubelet import FakeKubelet, FakePod  # noqa: E402
from tests.plugin.harness import NODE, placement, pod_manifest, write_devices  # noqa: E402
from tests.standin import ApiServer  # noqa: E402
from vgpud.core.codec import encode_assignment  # noqa: E402

PLUGIN = """
import sys
from vgpud.plugin.command import plugin
plugin(node_name=sys.argv[1], kubeconfig=sys.argv[2], config=sys.argv[7],
       device_plugin_dir=sys.argv[3],
       pod_resources_socket=sys.argv[4], state_dir=sys.argv[5], fake_devices=sys.argv[6],
       listen="127.0.0.1:0")
"""


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]


def the_pod(i: int) -> dict[str, object]:
    """Pod ``i``: one vGPU on GPU ``i % 8``, asking what its assignment grants (the plugin
    believes no more)."""
    asks = {"main": {"nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 1000,
                     "nvidia.com/vgpu-cores": 5}}
    return pod_manifest(f"p{i}", asks, encode_assignment(placement({"main": [(i % 8, 1000, 5)]})))


@asynccontextmanager
async def api_process(root: Path, pods: int) -> AsyncIterator[Path]:
    """The API stand-in in its own process, as an API server is, seeded with the node and
    every pod (so the node's pods number ``pods`` from the first admission); yields the
    kubeconfig."""
    state = root / "state.json"
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
    state.write_text(json.dumps([node, *(the_pod(i) for i in range(pods))]))
    port_file = root / "api.port"
    proc = subprocess.Popen(  # noqa: ASYNC220 - one start
        [sys.executable, "-m", "tests.standin", "--port", "0", "--port-file", str(port_file),
         "--state", str(state), "--token", "bench"], cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        with anyio.fail_after(30):
            while not port_file.exists() or not port_file.read_text():
                if proc.poll() is not None:
                    raise RuntimeError(f"the API stand-in exited ({proc.returncode})")
                await anyio.sleep(0.05)
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "s",
            "clusters": [{"name": "s", "cluster": {
                "server": f"http://127.0.0.1:{port_file.read_text().strip()}"}}],
            "users": [{"name": "s", "user": {"token": "bench"}}],
            "contexts": [{"name": "s", "context": {"cluster": "s", "user": "s"}}]}))
        yield kubeconfig
    finally:
        proc.terminate()
        proc.wait(10)


async def main(pods: int, idle: float, separate: bool) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="vgb"))
    devices = write_devices(root / "devices.json", 8, memory=81920)
    async with AsyncExitStack() as stack:
        if separate:
            kubeconfig = await stack.enter_async_context(api_process(root, pods))
            api = None
        else:
            api = await stack.enter_async_context(ApiServer())
            api.create("nodes", {"apiVersion": "v1", "kind": "Node",
                                 "metadata": {"name": NODE}})
            kubeconfig = api.write_kubeconfig(root / "kubeconfig")
        kubelet = FakeKubelet(root)
        kubelet.start_servers()
        config = root / "plugin.yaml"  # the shim under root, not the host's /usr/local/vgpud
        config.write_text(json.dumps({"plugin": {"shimHostDir": str(root / "shim")}}))
        env = {**os.environ, "VGPUD_LOG_LEVEL": "warning"}
        proc = subprocess.Popen(  # noqa: ASYNC220 - one start, measured separately
            [sys.executable, "-c", PLUGIN, NODE, str(kubeconfig), str(kubelet.plugin_dir),
             str(kubelet.podres_socket), str(root / "state"), str(devices), str(config)],
            cwd=ROOT, env=env)
        try:
            await anyio.to_thread.run_sync(lambda: kubelet.wait_registered(1, 60))
            ps = psutil.Process(proc.pid)
            allocate: list[float] = []
            prestart: list[float] = []
            busy0 = ps.cpu_times()
            for i in range(pods):
                if api is not None:
                    api.create("pods", the_pod(i), "default")
                pod = FakePod("default", f"p{i}", [("main", 1)])
                t0 = time.perf_counter()
                a = await anyio.to_thread.run_sync(kubelet.admit, pod)
                t1 = time.perf_counter()
                await anyio.to_thread.run_sync(kubelet.start, a)
                t2 = time.perf_counter()
                allocate.append((t1 - t0) * 1e3)
                prestart.append((t2 - t1) * 1e3)
                if i % 8 == 7:  # keep the node from filling: free the replicas again
                    for j in range(i - 7, i + 1):
                        kubelet.remove("default", f"p{j}")
            busy1 = ps.cpu_times()
            # the baseline, in the same run: a round trip the plugin answers from memory
            # (GetDevicePluginOptions), same client, same processes, same moment
            ping: list[float] = []
            for _ in range(pods):
                t0 = time.perf_counter()
                await anyio.to_thread.run_sync(kubelet.options)
                ping.append((time.perf_counter() - t0) * 1e3)
            await anyio.sleep(2)
            cpu0 = ps.cpu_times()
            t0 = time.monotonic()
            await anyio.sleep(idle)
            cpu1 = ps.cpu_times()
            elapsed = time.monotonic() - t0
            busy = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            both = [a + p for a, p in zip(allocate, prestart, strict=True)]
            return {
                "gpus": 8, "split": 10, "pods": pods,
                "admit_ms(GetPreferredAllocation+Allocate)": {
                    "p50": round(statistics.median(allocate), 2),
                    "p99": round(pct(allocate, 0.99), 2)},
                "prestart_ms": {"p50": round(statistics.median(prestart), 2),
                                "p99": round(pct(prestart, 0.99), 2)},
                "total_ms": {"p50": round(statistics.median(both), 2),
                             "p99": round(pct(both, 0.99), 2)},
                "baseline_options_roundtrip_ms": {"p50": round(statistics.median(ping), 2),
                                                  "p99": round(pct(ping, 0.99), 2)},
                # the plugin's own CPU time (user + system) per pod admitted and started
                "plugin_cpu_ms_per_pod": round(1e3 * ((busy1.user - busy0.user) + (
                    busy1.system - busy0.system)) / pods, 2),
                "rss_mib": round(ps.memory_info().rss / 2**20, 1),
                "idle_cpu_percent": round(100 * busy / elapsed, 2),
                "idle_seconds": round(elapsed, 1),
            }
        finally:
            proc.terminate()
            proc.wait(10)
            kubelet.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="small run for CI (30 pods, 3 s idle)")
    ap.add_argument("--api-inline", action="store_true",
                    help="serve the API stand-in from this process (beside the fake kubelet, "
                         "sharing its interpreter) instead of its own")
    args = ap.parse_args()
    if args.quick:
        args.pods, args.idle = 30, 3.0
    result = anyio.run(main, args.pods, args.idle, not args.api_inline)
    total, base = result["total_ms"], result["baseline_options_roundtrip_ms"]
    assert isinstance(total, dict) and isinstance(base, dict)
    print(f"total (GetPreferredAllocation + Allocate + PreStartContainer), {args.pods} pods: "
          f"p50 {total['p50']} ms, p99 {total['p99']} ms | target p99 <= 20 ms: "
          f"{total['p99'] / 20:.2f} of it | baseline (one GetDevicePluginOptions round trip, "
          f"same run): p50 {base['p50']} ms, p99 {base['p99']} ms -> total "
          f"{total['p50'] / max(base['p50'], 1e-3):.1f}x at p50, "
          f"{total['p99'] / max(base['p99'], 1e-3):.1f}x at p99")
    print(json.dumps(result, indent=2))
