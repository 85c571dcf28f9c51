"""``vgpud inspect`` as a user runs it (a process, a kubeconfig) against the API
stand-in, after a real ``vgpud scheduler`` placed the pods: nodes, GPUs, a bound pod,
a Pending pod with its reasons, every output format, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.builders import gpu_node, gpu_pod
from tests.e2e.cluster import ROOT, Driver, Scheduler, running

pytestmark = [pytest.mark.anyio]


class Cluster:
    def __init__(self, d: Driver, sched: Scheduler) -> None:
        self.d = d
        self.sched = sched

    def inspect(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "vgpud", "inspect", *args,
                            "--kubeconfig", str(self.sched.kubeconfig)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        if ok:
            assert p.returncode == 0, p.stderr
        return p


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running(tmp_path) as (d, sched):
        await d.create([gpu_node("big", 2, 32768), gpu_node("small", 1, 8192)])
        pods: list[dict[str, Any]] = [
            gpu_pod("train", {"nvidia.com/vgpu-memory": 20000, "nvidia.com/vgpu-cores": 60},
                    annotations={"nvidia.com/vgpu-priority": "5"}),
            gpu_pod("notebook", {"nvidia.com/vgpu-memory": 4000}, namespace="team-a"),
            gpu_pod("huge", {"nvidia.com/vgpu-memory": 30000, "nvidia.com/vgpu-number": 2}),
        ]
        await d.create(pods)
        names = ["big", "small"]
        assert (await d.schedule(pods[0], names)).node == "big"
        assert (await d.schedule(pods[1], names)).node is not None
        assert (await d.schedule(pods[2], names)).node is None  # 2 x 30000 on one node: no
        yield Cluster(d, sched)


async def _run(c: Cluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: c.inspect(*args, ok=ok))


async def test_nodes_and_gpus_tables_and_json(cluster: Cluster) -> None:
    out = (await _run(cluster, "nodes")).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "GPUS", "HEALTHY", "MEMORY", "MiB", "CORES", "%",
                                "VGPUS", "PODS"]
    big = next(x for x in lines if x.startswith("big")).split()
    assert big[1:3] == ["2", "2"] and big[-1] in ("1", "2")
    doc = json.loads((await _run(cluster, "nodes", "-o", "json")).stdout)
    assert [n["node"] for n in doc] == ["big", "small"]
    held = sum(g["memoryAllocated"] for n in doc for g in n["gpus"])
    assert held == (20000 + 4000) << 20  # bytes, as the metrics and the JSON API

    gpus = json.loads((await _run(cluster, "gpus", "--node", "big", "-o", "json")).stdout)
    assert [g["index"] for g in gpus] == [0, 1]
    train = [s for g in gpus for s in g["slices"] if s["pod"] == "train"]
    assert train == [{"namespace": "default", "pod": "train", "container": "main",
                      "memory": 20000 << 20, "cores": 60, "priority": 5,
                      "state": "confirmed"}]
    wide = (await _run(cluster, "gpus", "-o", "wide")).stdout
    assert "default/train/main:20000MiB,60%,p5" in wide and "GPU-big-0" in wide
    assert yaml.safe_load((await _run(cluster, "gpus", "-o", "yaml")).stdout) == json.loads(
        (await _run(cluster, "gpus", "-o", "json")).stdout)


async def test_a_bound_pod_and_a_pending_one(cluster: Cluster) -> None:
    out = (await _run(cluster, "pod", "default/train")).stdout
    assert "Node:      big" in out and "Priority:  5" in out
    assert "main" in out and "20000" in out and "GPU-big-" in out
    doc = json.loads((await _run(cluster, "pod", "default/train", "-o", "json")).stdout)
    assert doc["assignment"]["state"] == "confirmed"
    assert doc["assignment"]["grants"][0]["memory"] == 20000 << 20

    pending = json.loads((await _run(cluster, "pod", "default/huge", "-o", "json")).stdout)
    assert pending["node"] is None and "assignment" not in pending
    reasons = {r["reason"]: r for r in pending["pending"]}
    # one line per class of nodes: the 2-GPU node lacks room, the 1-GPU one ever will
    assert sum(r["nodes"] for r in reasons.values()) == 2
    assert any(not r["resolvable"] for r in reasons.values())
    text = (await _run(cluster, "pod", "default/huge")).stdout
    assert "Pending:   no node fits:" in text and "node(s):" in text


async def test_bad_input_is_a_clear_error(cluster: Cluster) -> None:
    p = await _run(cluster, "pod", "default/ghost", ok=False)
    assert p.returncode == 1 and "pod default/ghost not found" in p.stderr
    p = await _run(cluster, "gpus", "-o", "xml", ok=False)
    assert p.returncode == 2 and "choose text, wide, json or yaml" in p.stderr
    p = await _run(cluster, "pod", "a/b/c", ok=False)
    assert p.returncode == 2 and "NAMESPACE/NAME" in p.stderr


def test_no_cluster_is_a_clear_error() -> None:
    p = subprocess.run([sys.executable, "-m", "vgpud", "inspect", "nodes", "--kubeconfig",
                        "/nonexistent"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 1 and "no such file" in p.stderr
    p = subprocess.run([sys.executable, "-m", "vgpud", "inspect", "nodes", "--scheduler",
                        "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert p.returncode == 1 and "cannot reach the scheduler" in p.stderr


async def test_the_scheduler_json_api_gives_the_same_rows(cluster: Cluster) -> None:
    """``--scheduler``: the running scheduler's own ledger, through its JSON API, agrees
    with the one rebuilt from the API server; a refused pod carries filter's reason."""
    url = cluster.sched.ops_url
    from_api = json.loads((await _run(cluster, "gpus", "-o", "json")).stdout)
    from_sched = json.loads((await _run(cluster, "gpus", "-o", "json", "--scheduler", url)
                             ).stdout)
    assert from_sched == from_api
    nodes = (await _run(cluster, "nodes", "--scheduler", url)).stdout
    assert nodes == (await _run(cluster, "nodes")).stdout
    doc = json.loads((await _run(cluster, "pod", "default/huge", "-o", "json",
                                 "--scheduler", url)).stdout)
    (why,) = doc["pending"]
    assert why["reason"].startswith("0/2 nodes fit")
    bound = json.loads((await _run(cluster, "pod", "team-a/notebook", "-o", "json",
                                   "--scheduler", url)).stdout)
    assert bound["assignment"]["grants"][0]["memory"] == 4000 << 20


async def test_scheduler_source_waits_out_the_ops_ports_rate_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops port answers a client past its rate 429 with Retry-After (vgpud/ops.py):
    ``--scheduler`` pages wait that long and go on, rather than failing."""
    import aiohttp
    from aiohttp import web

    from tests.builders import node
    from tests.kube.clocks import JumpClock
    from vgpud import inspection
    from vgpud.config import OpsSettings
    from vgpud.core.allocate import Allocator
    from vgpud.extender.metrics import Metrics
    from vgpud.extender.routes import Extender
    from vgpud.extender.server import make_app
    from vgpud.ops import Guard
    from vgpud.scheduling.state import SchedulerState

    monkeypatch.setattr(inspection, "PAGE", 2)
    alloc = Allocator()
    for name in ("a", "b", "c", "d"):
        alloc.set_node(node(name, 2, 16000))
    ext = Extender(SchedulerState(alloc), writer=None, events=None, metrics=Metrics(alloc))
    clock = JumpClock()  # the Guard's budget and the client's waits on one time line
    guard = Guard(OpsSettings(clientQPS=0.5, clientBurst=2), clock=clock)
    runner = web.AppRunner(make_app(ext, lambda: True, verbs=False, guard=guard))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as s:
            src = inspection.SchedulerSource(s, f"http://127.0.0.1:{port}", clock=clock)
            view = await src.view()
    finally:
        await runner.cleanup()
    assert len(view.gpus) == 8  # four pages of two, then the pods' (empty) page
    assert clock.sleeps == [2.0, 2.0, 2.0]  # a token every 2 s once the burst of 2 was spent
    assert guard.refused["rate"] == 3


async def test_quotas_show_use_against_the_limit_from_both_sources(cluster: Cluster) -> None:
    """team-a's notebook takes 4,000 MiB of a 5,000 MiB vGPU memory quota; a value that
    is not a quantity is shown as an error, not a crash."""
    await cluster.d.create([
        {"apiVersion": "v1", "kind": "ResourceQuota",
         "metadata": {"name": "gpu", "namespace": "team-a"},
         "spec": {"hard": {"requests.nvidia.com/vgpu-memory": "5000", "pods": "10"}}},
        {"apiVersion": "v1", "kind": "ResourceQuota",
         "metadata": {"name": "typo", "namespace": "team-a"},
         "spec": {"hard": {"nvidia.com/vgpu-cores": "many"}}}])
    want = [{"namespace": "team-a", "quota": "gpu", "key": "requests.nvidia.com/vgpu-memory",
             "resource": "memory", "unit": "MiB", "hard": 5000, "used": 4000},
            {"namespace": "team-a", "quota": "typo", "error": (
                "ResourceQuota team-a/typo: spec.hard[nvidia.com/vgpu-cores]: 'many' is not "
                "a quantity (this limit is not enforced)")}]
    assert json.loads((await _run(cluster, "quotas", "-o", "json")).stdout) == want
    text = (await _run(cluster, "quotas")).stdout.splitlines()
    assert text[0].split() == ["NAMESPACE", "QUOTA", "LIMIT", "USED", "HARD", "UNIT"]
    assert text[1].split() == ["team-a", "gpu", "requests.nvidia.com/vgpu-memory", "4000",
                               "5000", "MiB"]
    assert "ERROR: ResourceQuota team-a/typo" in text[2]
    url = cluster.sched.ops_url


    async def from_scheduler() -> Any:
        return json.loads((await _run(cluster, "quotas", "-o", "json", "--scheduler", url)
                           ).stdout)

    with anyio.fail_after(20):
        while await from_scheduler() != want:  # noqa: ASYNC110 (the informer catches up)
            await anyio.sleep(0.1)
