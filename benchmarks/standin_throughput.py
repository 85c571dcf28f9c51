"""Throughput of the API stand-in + vgpud.kube: list into a cache, bind rate.

    python benchmarks/standin_throughput.py            # 5,000 nodes, 50,000 pods
    python benchmarks/standin_throughput.py --quick    # 500 nodes, 5,000 pods (CI)

The stand-in runs as its own process (``--inprocess`` to share the loop instead),
seeded through its bulk endpoint. Figures printed:

- list: seconds to list the nodes (raw dicts kept) and the pods (kept as a small
  projection) into ``Informer`` caches, and the memory the pods cache retains
  (tracemalloc, measured in a second, traced pass);
- writes (client budget ``--qps``/``--burst``, default vgpud's 500/1000, which caps
  a long run at 250 pods/s; raise it to see the stack's own limit):
  ``--writers`` concurrent tasks each doing the scheduler's one write per pod (the
  Binding, carrying the assignment annotation); pods/s and requests/s, and how long
  the pod informer took to see every binding.

Numbers depend on the machine; nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import anyio
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.standin import ApiServer  # noqa: E402
from vgpud.kube.cache import Informer, Modified  # noqa: E402
from vgpud.kube.client import Json, KubeClient  # noqa: E402
from vgpud.kube.resources import NODES, PODS  # noqa: E402
from vgpud.kube.writes import PodBinder  # noqa: E402


class PodSummary(NamedTuple):
    uid: str
    node: str
    phase: str
    assignment: str | None


def summarize(pod: Json) -> PodSummary:
    meta = pod["metadata"]
    return PodSummary(
        meta.get("uid", ""),
        pod.get("spec", {}).get("nodeName", ""),
        pod.get("status", {}).get("phase", ""),
        (meta.get("annotations") or {}).get("vgpud.io/assignment"),
    )


def node_obj(i: int) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"gpu-node-{i}",
            "labels": {"nvidia.com/gpu.present": "true"},
            "annotations": {"vgpud.io/node-devices": json.dumps({"v": 1, "devices": []})},
        },
        "status": {"allocatable": {"nvidia.com/vgpu-number": "80"}},
    }


def pod_obj(i: int, namespace: str = "bench") -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{i}", "namespace": namespace, "labels": {"app": f"a{i % 50}"}},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {
                        "limits": {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "3000"}
                    },
                }
            ],
        },
    }


async def seed(url: str, items: list[Json]) -> None:
    async with aiohttp.ClientSession(url) as http:
        for start in range(0, len(items), 5000):
            chunk = {"items": items[start : start + 5000]}
            async with http.post("/_standin/objects", json=chunk) as resp:
                resp.raise_for_status()


async def measure_lists(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    async with KubeClient.for_url(url) as kube:
        nodes: Informer[Json] = Informer(kube, NODES)
        pods: Informer[PodSummary] = Informer(kube, PODS, project=summarize)
        async with anyio.create_task_group() as tg:
            t0 = time.perf_counter()
            await tg.start(nodes.run)
            out["nodes"] = len(nodes)
            out["list_nodes_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            await tg.start(pods.run)
            out["pods"] = len(pods)
            out["list_pods_s"] = time.perf_counter() - t0
            tg.cancel_scope.cancel()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        traced: Informer[PodSummary] = Informer(kube, PODS, project=summarize)
        async with anyio.create_task_group() as tg:
            await tg.start(traced.run)
            tg.cancel_scope.cancel()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["pods_cache_mib"] = (current - before) / 2**20
        out["pods_list_peak_mib"] = (peak - before) / 2**20
        del traced
    return out


async def measure_writes(
    url: str, count: int, writers: int, qps: float, burst: int
) -> dict[str, float]:
    await seed(url, [pod_obj(i, "writes") for i in range(count)])
    out: dict[str, float] = {}
    async with KubeClient.for_url(url, qps=qps, burst=burst) as kube:
        writer = PodBinder(kube)
        watched: Informer[PodSummary] = Informer(kube, PODS, project=summarize, name="bench-writes")
        bound = 0
        all_bound = anyio.Event()

        def on_event(event: object) -> None:
            nonlocal bound
            if isinstance(event, Modified) and event.new.node and not event.old.node:
                bound += 1
                if bound == count:
                    all_bound.set()

        watched.subscribe(on_event)
        send, receive = anyio.create_memory_object_stream[tuple[str, str, str]](count)
        async with anyio.create_task_group() as tg:
            await tg.start(watched.run)
            for key in list(watched.keys()):
                ns, name = key.split("/")
                if ns == "writes":
                    pod = watched.get(key)
                    assert pod is not None
                    send.send_nowait((name, pod.uid, ""))
            send.close()

            async def work(n: int) -> None:
                async for name, uid, _ in receive.clone():
                    await writer.bind("writes", name, f"gpu-node-{n}", uid=uid, annotations={
                        "vgpud.io/assignment": '{"v":1,"node":"gpu-node-1","containers":[]}'})

            t0 = time.perf_counter()
            async with anyio.create_task_group() as workers:
                for n in range(writers):
                    workers.start_soon(work, n)
            receive.close()
            elapsed = time.perf_counter() - t0
            with anyio.fail_after(120):
                await all_bound.wait()
            seen = time.perf_counter() - t0
            tg.cancel_scope.cancel()
    out["pods_written"] = count
    out["write_s"] = elapsed
    out["pods_per_s"] = count / elapsed
    out["requests_per_s"] = count / elapsed
    out["informer_saw_all_bindings_s"] = seen
    return out


async def start_process(history: int) -> tuple[Any, str]:
    command = [sys.executable, "-m", "tests.standin", "--port", "0", "--history-size", str(history)]
    proc = await anyio.open_process(command, cwd=ROOT, stderr=None)
    assert proc.stdout is not None
    line = await BufferedByteReceiveStream(proc.stdout).receive_until(b"\n", 200)
    return proc, line.decode().split()[-1]


async def main(args: argparse.Namespace) -> None:
    n_nodes, n_pods, n_writes = (
        (500, 5000, 300) if args.quick else (args.nodes, args.pods, args.writes)
    )
    history = 2 * (n_nodes + n_pods + 3 * n_writes)
    server: ApiServer | None = None
    proc = None
    if args.inprocess:
        server = ApiServer(history_size=history)
        await server.start()
        url = server.url
    else:
        proc, url = await start_process(history)
    try:
        t0 = time.perf_counter()
        await seed(url, [node_obj(i) for i in range(n_nodes)])
        await seed(url, [pod_obj(i) for i in range(n_pods)])
        seed_s = time.perf_counter() - t0
        lists = await measure_lists(url)
        writes = await measure_writes(url, n_writes, args.writers, args.qps, args.burst)
    finally:
        if server is not None:
            await server.stop()
        if proc is not None:
            proc.terminate()
            await proc.wait()
    mode = "in-process" if args.inprocess else "separate process"
    print(f"stand-in ({mode}); seeded {n_nodes} nodes + {n_pods} pods in {seed_s:.2f} s")
    print(f"list {int(lists['nodes'])} nodes into an informer: {lists['list_nodes_s']:.2f} s")
    print(
        f"list {int(lists['pods'])} pods into an informer (projected): "
        f"{lists['list_pods_s']:.2f} s; cache retains {lists['pods_cache_mib']:.1f} MiB "
        f"(peak during list {lists['pods_list_peak_mib']:.1f} MiB)"
    )
    print(
        f"bind (one Binding each, carrying the assignment) {int(writes['pods_written'])} pods "
        f"with {args.writers} writers "
        f"(budget {args.qps:g} QPS, burst {args.burst}): "
        f"{writes['write_s']:.2f} s = {writes['pods_per_s']:.0f} pods/s "
        f"({writes['requests_per_s']:.0f} requests/s); informer saw all bindings after "
        f"{writes['informer_saw_all_bindings_s']:.2f} s"
    )


if __name__ == "__main__":
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--writes", type=int, default=3000, help="pods to patch and bind")
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--inprocess", action="store_true")
    parser.add_argument("--qps", type=float, default=500.0, help="client budget (default: ours)")
    parser.add_argument("--burst", type=int, default=1000)
    anyio.run(main, parser.parse_args())
