"""End-to-end harness: the API stand-in and ``vgpud scheduler`` as real processes,
and a driver that plays kube-scheduler over the extender's wire JSON.

The driver does what kube-scheduler does for each pod: POST /filter with the
candidate node names, POST /prioritize with the feasible ones, pick the highest
score (ties: the first), POST /bind; a pod whose bind fails goes back to the queue
and is tried again, up to ``retries`` times.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import yaml

from tests.builders import gpu_pod
from vgpud.core.codec import (
    ASSIGNMENT,
    NODE_DEVICES,
    decode_assignment,
    decode_node_devices,
)
from vgpud.core.model import ContainerGrant, DeviceGrant, Placement

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def standin(tmp: Path) -> Iterator[tuple[str, Path]]:
    """The API stand-in as a process; yields its URL and a kubeconfig for it."""
    log = (tmp / "standin.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "tests.standin", "--port", "0",
                             "--history-size", "200000"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), f"stand-in did not start: {line!r}"
        url = line.split()[-1]
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": url}}],
            "users": [{"name": "standin", "user": {"token": "standin-token"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin",
                                                         "user": "standin"}}]}))
        yield url, kubeconfig
    finally:
        stop_process(proc)
        log.close()


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


@dataclass
class Scheduler:
    """``vgpud scheduler`` as a process that can be killed and started again."""

    kubeconfig: Path
    tmp: Path
    config: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    ops_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ops_url(self) -> str:
        """Health, readiness and metrics (the same port unless ``ops_port`` is set)."""
        return f"http://127.0.0.1:{self.ops_port or self.port}"

    def start(self) -> None:
        cfg = self.tmp / "vgpud.yaml"
        cfg.write_text(yaml.safe_dump(self.config))
        self.starts += 1
        log = (self.tmp / f"scheduler-{self.starts}.log").open("wb")
        env = {**os.environ, "VGPUD_LOG_LEVEL": "warning"}
        prefix = os.environ.get("VGPUD_SCHEDULER_PREFIX", "").split()
        self.proc = subprocess.Popen(
            [sys.executable, *prefix, "-m", "vgpud", "scheduler",
             "--kubeconfig", str(self.kubeconfig),
             "--listen", f"127.0.0.1:{self.port}", "--config", str(cfg),
             *(["--metrics-listen", f"127.0.0.1:{self.ops_port}"] if self.ops_port else [])],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def log(self) -> str:
        return "\n".join((self.tmp / f"scheduler-{i}.log").read_text(errors="replace")
                         for i in range(1, self.starts + 1))

    async def wait_ready(self, within: float = 60.0) -> float:
        """Seconds until /readyz said yes."""
        start = time.monotonic()
        async with aiohttp.ClientSession() as s:
            while True:
                assert self.proc is not None and self.proc.poll() is None, self.log()
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(f"{self.ops_url}/readyz") as r:
                        if r.status == 200:
                            return time.monotonic() - start
                if time.monotonic() - start > within:
                    raise AssertionError(f"scheduler not ready after {within}s\n{self.log()}")
                await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(tmp: Path, config: dict[str, Any] | None = None,
                  ) -> AsyncIterator[tuple[Driver, Scheduler]]:
    """The stand-in and a ready ``vgpud scheduler`` with ``config``, and a driver."""
    with standin(tmp) as (url, kubeconfig):
        sched = Scheduler(kubeconfig, tmp, config=config or {})
        sched.start()
        try:
            async with aiohttp.ClientSession() as s:
                await sched.wait_ready()
                yield Driver(s, url, sched.url), sched
        finally:
            sched.stop()


def bound_pods(n_nodes: int, n_pods: int, rng: random.Random, gpus: int = 8,
               ) -> list[dict[str, Any]]:
    """Running pods with their assignments, spread over every node's ``gpus`` GPUs
    (nodes named ``node-00000``…): what a restarted scheduler rebuilds its ledger from.
    For benchmarks that seed a large cluster."""
    out = []
    for i in range(n_pods):
        node = f"node-{i % n_nodes:05d}"
        gpu = (i // n_nodes) % gpus
        a = Placement(node, (ContainerGrant("main", False, (
            DeviceGrant(f"GPU-{node}-{gpu}", rng.choice([2000, 4000, 8000]), 10),)),),
            time="2026-11-21T00:00:00Z")
        out.append(gpu_pod(f"running-{i:06d}", {"nvidia.com/vgpu-number": 1,
                                                "nvidia.com/vgpu-memory": 4000,
                                                "nvidia.com/vgpu-cores": 10},
                           assignment=a, node=node, phase="Running"))
    return out


@dataclass
class Outcome:
    pod: str
    node: str | None
    reason: str
    attempts: int


class Driver:
    """kube-scheduler's side of the extender protocol, plus the API reads a test needs."""

    def __init__(self, session: aiohttp.ClientSession, api: str, ext: str) -> None:
        self.s = session
        self.api = api
        self.ext = ext
        self.latency: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}

    async def _post(self, url: str, body: Any) -> Any:
        async with self.s.post(url, json=body) as r:
            text = await r.text()
            assert r.status == 200, f"{url}: {r.status} {text}"
            return json.loads(text)

    async def _post_status(self, url: str, body: Any) -> int:
        """POST and return the status, whatever it is (the API's 201s included)."""
        async with self.s.post(url, json=body) as r:
            await r.read()
            assert r.status < 300, f"{url}: {r.status}"
            return r.status

    async def _verb(self, verb: str, body: Any) -> Any:
        t0 = time.perf_counter()
        doc = await self._post(f"{self.ext}/{verb}", body)
        self.latency[verb].append(time.perf_counter() - t0)
        return doc

    async def create(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        doc = await self._post(f"{self.api}/_standin/objects", {"items": items})
        assert doc["created"] == len(items)
        return await self.pods()

    async def pods(self) -> list[dict[str, Any]]:
        async with self.s.get(f"{self.api}/api/v1/pods") as r:
            return list((await r.json())["items"])

    async def nodes(self) -> list[dict[str, Any]]:
        async with self.s.get(f"{self.api}/api/v1/nodes") as r:
            return list((await r.json())["items"])

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        async with self.s.get(f"{self.api}/api/v1/namespaces/{namespace}/pods/{name}") as r:
            return dict(await r.json())

    async def fault(self, **rule: Any) -> None:
        await self._post(f"{self.api}/_standin/faults", rule)

    async def peak(self, verb: str, resource: str) -> int:
        """The most ``verb resource`` requests the API stand-in has answered at once."""
        async with self.s.get(f"{self.api}/_standin/counts") as r:
            return int((await r.json())["peaks"].get(f"{verb} {resource}", 0))

    async def clear_faults(self) -> None:
        async with self.s.delete(f"{self.api}/_standin/faults"):
            pass

    async def schedule(self, pod: dict[str, Any], nodes: list[str], *,
                       retries: int = 0) -> Outcome:
        meta = pod["metadata"]
        reason = ""
        for attempt in range(1, retries + 2):
            current = await self.pod(meta["namespace"], meta["name"])  # the queue's copy
            if current["spec"].get("nodeName"):
                return Outcome(meta["name"], current["spec"]["nodeName"], "", attempt)
            f = await self._verb("filter", {"Pod": current, "NodeNames": nodes})
            if f["Error"]:
                reason = f["Error"]
                continue
            feasible = f["NodeNames"]
            if not feasible:
                reasons = {**f["FailedNodes"], **f["FailedAndUnresolvableNodes"]}
                return Outcome(meta["name"], None, "; ".join(sorted(set(reasons.values()))),
                               attempt)
            scores = await self._verb("prioritize", {"Pod": current, "NodeNames": feasible})
            best = max(scores, key=lambda h: h["Score"])["Host"] if scores else feasible[0]
            b = await self._verb("bind", {"PodName": meta["name"],
                                          "PodNamespace": meta["namespace"],
                                          "PodUID": current["metadata"]["uid"], "Node": best})
            if not b["Error"]:
                return Outcome(meta["name"], best, "", attempt)
            reason = b["Error"]
        return Outcome(meta["name"], None, reason, retries + 1)


def held_by_annotations(pods: list[dict[str, Any]]) -> dict[tuple[str, str], list[int]]:
    """Per (node, GPU): [memory, cores, vGPUs] held by bound pods, from their annotations."""
    held: dict[tuple[str, str], list[int]] = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        raw = (p["metadata"].get("annotations") or {}).get(ASSIGNMENT)
        if not node or raw is None:
            continue
        a = decode_assignment(raw)
        assert a.node == node, f"{p['metadata']['name']} bound to {node}, assigned {a.node}"
        for c in a.containers:
            for d in c.devices:
                h = held.setdefault((node, d.uuid), [0, 0, 0])
                h[0] += d.memory
                h[1] += d.cores
                h[2] += 1
    return held


def capacities(nodes: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int, int]]:
    out = {}
    for n in nodes:
        inv = decode_node_devices(n["metadata"]["annotations"][NODE_DEVICES])
        for g in inv.devices:
            out[(n["metadata"]["name"], g.uuid)] = (int(g.memory * inv.memory_scaling),
                                                    round(100 * inv.core_scaling), g.split)
    return out


def overcommitted(pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> list[str]:
    caps = capacities(nodes)
    bad = []
    for key, (mem, cores, vgpus) in held_by_annotations(pods).items():
        cap = caps[key]
        if mem > cap[0] or cores > cap[1] or vgpus > cap[2]:
            bad.append(f"{key}: holds {mem} MiB/{cores}%/{vgpus} of {cap}")
    return bad


async def ledger_from_metrics(session: aiohttp.ClientSession, ext: str,
                              ) -> dict[tuple[str, str], int]:
    """Per (node, GPU) memory (MiB) the scheduler holds, read from its /metrics (bytes)."""
    async with session.get(f"{ext}/metrics") as r:  # the ops URL
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("vgpud_scheduler_gpu_memory_allocated_bytes{"):
            labels, value = line.rsplit(" ", 1)
            parts = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1:-1].split(","))
            held, rest = divmod(int(float(value)), 1 << 20)
            assert not rest, f"{line}: not whole MiB"
            out[(parts["node"].strip('"'), parts["uuid"].strip('"'))] = held
    return out
