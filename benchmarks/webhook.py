"""Admission latency of ``vgpud webhook``, run as its own process (the real command).

    python benchmarks/webhook.py            # 2,000 reviews, 200 at a time, 5,000 nodes known
    python benchmarks/webhook.py --quick    # 400 reviews, 200 at a time, 500 nodes (CI)

The API stand-in (in this process) holds ``--nodes`` GPU nodes of three shapes, so
/validate judges every pod against a real catalogue. Reviews alternate between
/mutate and /validate over a mix of pods (native and HAMi names, memory-only,
nodeName, bad values). Three rounds: *one at a time* (the
unloaded latency), *keep-alive* (a pool of ``--connections``
connections, as the API server keeps them) and *new connections* (a TLS handshake
per review, the worst case). Printed: p50/p99/max client-observed latency, reviews/s,
and the ratio of each to the baseline below (the first measurement of this script,
2-core development machine, 2026-11-23). Nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import trustme
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.standin import ApiServer  # noqa: E402
from vgpud.core.codec import NODE_DEVICES, encode_node_devices  # noqa: E402
from vgpud.core.model import Gpu, NodeInventory  # noqa: E402

# milliseconds: one review at a time (p50); 200 at a time over the keep-alive pool (p50,
# p99: mostly queueing, by Little's law); 200 at a time, a handshake each (p50)
BASELINE = {"alone_p50": 0.54, "keepalive_p50": 36.2, "keepalive_p99": 60.2, "fresh_p50": 262.0}

SHAPES = [(8, 24576), (4, 81920), (2, 16384)]


def pods() -> list[dict[str, Any]]:
    def pod(limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "job-"},
                "spec": {"containers": [{"name": "main", "image": "cuda",
                                         "resources": {"limits": limits}}], **spec}}

    return [pod({"nvidia.com/vgpu-memory": "3000"}),
            pod({"nvidia.com/vgpu-number": 2, "nvidia.com/vgpu-cores": 30}),
            pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}),
            pod({"nvidia.com/vgpu-memory": 2000}, nodeName="gpu-3"),
            pod({"nvidia.com/vgpu-cores": 130}),
            pod({"cpu": "1"})]


def review(obj: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": str(uuid.uuid4()),
                                   "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "namespace": "team", "operation": "CREATE",
                                   "object": obj}}).encode()


async def round_(url: str, ctx: ssl.SSLContext, n: int, concurrency: int,
                 keepalive: bool, connections: int) -> tuple[list[float], float]:
    bodies = [review(copy.deepcopy(p)) for p in pods()]
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=connections if keepalive else 0,
                                force_close=not keepalive, ssl=ctx)
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one(i: int) -> None:
            path = "/mutate" if i % 2 else "/validate"
            async with sem:
                t0 = time.perf_counter()
                async with s.post(url + path, data=bodies[i % len(bodies)],
                                  headers={"Content-Type": "application/json"}) as r:
                    doc = await r.json()
                lat.append(time.perf_counter() - t0)
            assert r.status == 200 and "response" in doc, doc

        if keepalive:  # open the pool first, as a long-running API server has it
            await asyncio.gather(*(one(i) for i in range(connections)))
            lat.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return lat, time.perf_counter() - t0


def figures(name: str, lat: list[float], wall: float) -> dict[str, float]:
    q = statistics.quantiles(lat, n=100)
    out = {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "max_ms": max(lat) * 1e3,
           "per_s": len(lat) / wall}
    print(f"{name:>16}: p50 {out['p50_ms']:.2f} ms  p99 {out['p99_ms']:.2f} ms  "
          f"max {out['max_ms']:.1f} ms  {out['per_s']:.0f} reviews/s")
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="vgpud-bench-webhook-"))
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "tls.crt"))
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    async with ApiServer() as api:
        for i in range(args.nodes):
            n, mem = SHAPES[i % len(SHAPES)]
            inv = NodeInventory(tuple(Gpu(f"GPU-{i}-{j}", j, "A100", mem) for j in range(n)))
            api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": f"gpu-{i}", "annotations": {NODE_DEVICES: encode_node_devices(inv)}}})
        (tmp / "kubeconfig").write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "s",
            "clusters": [{"name": "s", "cluster": {"server": api.url}}],
            "users": [{"name": "s", "user": {"token": "t"}}],
            "contexts": [{"name": "s", "context": {"cluster": "s", "user": "s"}}]}))
        (tmp / "settings.yaml").write_text("compatPresets: [hami]\n")
        port, ops = args.port, args.port + 1
        proc = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is timed
            [sys.executable, "-m", "vgpud", "webhook", "--listen", f"127.0.0.1:{port}",
             "--metrics-listen", f"127.0.0.1:{ops}", "--tls-cert", str(tmp / "tls.crt"),
             "--tls-key", str(tmp / "tls.key"), "--kubeconfig", str(tmp / "kubeconfig"),
             "--config", str(tmp / "settings.yaml")],
            env={**os.environ, "VGPUD_LOG_LEVEL": "warning"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(300):
                    try:
                        async with s.get(f"http://127.0.0.1:{ops}/metrics") as r:
                            if f"vgpud_webhook_gpu_nodes {float(args.nodes)}" in await r.text():
                                break
                    except aiohttp.ClientError:
                        pass
                    if proc.poll() is not None:
                        err = proc.stderr.read().decode() if proc.stderr else ""
                        raise SystemExit(f"vgpud webhook exited: {err}")
                    await asyncio.sleep(0.1)
                else:
                    raise SystemExit("vgpud webhook did not learn the nodes in 30 s")
            url = f"https://127.0.0.1:{port}"
            print(f"vgpud webhook (own process), {args.nodes} GPU nodes known, "
                  f"{args.reviews} reviews, {args.concurrency} at a time")
            alone = figures("one at a time", *await round_(url, ctx, args.reviews // 4, 1,
                                                           True, 1))
            warm = figures("keep-alive", *await round_(url, ctx, args.reviews, args.concurrency,
                                                       True, args.connections))
            fresh = figures("new connections", *await round_(
                url, ctx, args.reviews // 2, args.concurrency, False, 0))
        finally:
            proc.terminate()
            proc.wait(10)
    ratios = {"alone_p50": alone["p50_ms"] / BASELINE["alone_p50"],
              "keepalive_p50": warm["p50_ms"] / BASELINE["keepalive_p50"],
              "keepalive_p99": warm["p99_ms"] / BASELINE["keepalive_p99"],
              "fresh_p50": fresh["p50_ms"] / BASELINE["fresh_p50"]}
    print("ratio to baseline: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    return {"alone": alone, "keepalive": warm, "fresh": fresh, "ratios": ratios}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--reviews", type=int)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--port", type=int, default=19443)
    a = ap.parse_args()
    a.nodes = a.nodes or (500 if a.quick else 5000)
    a.reviews = a.reviews or (400 if a.quick else 2000)
    asyncio.run(main(a))
