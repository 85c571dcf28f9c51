"""The real kube-scheduler with vgpud's extender, against kube-scheduler alone.

    python benchmarks/real_scheduler.py             # 1,000 nodes x 8 GPUs, 3,000 pods
    python benchmarks/real_scheduler.py --quick     # CI: 50 nodes, 200 pods

Real etcd, kube-apiserver and kube-scheduler v1.37.2, built from the official Go modules
(``tests/realkube/build.py``; the first run builds them, minutes). Node objects carry the
plugin's inventory annotation and ``nvidia.com/vgpu-number`` in allocatable (no kubelet).
The same pods (one vGPU of 4,000 MiB each, created before their scheduler starts) are
placed twice, each run on empty nodes:

- **baseline**: a stock kube-scheduler (default profile, no extender, the chart's flags:
  its ``--v=2`` logs every bind, which costs CPU too) placing them by the
  extended-resource count (``nvidia.com/vgpu-memory`` in its ``ignoredResources``), once
  with its default client (50 requests/s, burst 100: that limit, not scheduling, caps its
  binds) and once with a client as fast as vgpud's (1,000/s), the comparison that counts;
- **vgpud**: kube-scheduler as the chart configures it, calling ``vgpud scheduler``'s
  filter, prioritize and bind (every pod gets its GPUs and its assignment annotation).

Prints each run's pods per second (first bind to last, from a watch: the schedulers'
start-up is not counted), the ratio vgpud / fast baseline (target >= 0.7), and the extender's
filter / prioritize / bind latency (p50 and p99 upper bounds from its own histogram).
Figures only, never pass/fail on time.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extender_latency import served

from tests.realkube import build
from tests.realkube.api import Api, wait_for
from tests.realkube.cluster import inventory
from tests.realkube.controlplane import ControlPlane, Proc, free_port
from tests.realkube.release import Release
from vgpud.core.codec import ASSIGNMENT, NODE_DEVICES

GPUS, MEMORY, SPLIT = 8, 81920, 10
POD_MEMORY = 4000
BASELINE = "baseline-scheduler"
KUBE_QPS = 1000  # vgpud's own client rate (kubeQPS), for the unthrottled baseline


def add_nodes(cp: ControlPlane, n: int) -> list[str]:
    names = [f"bench-{i:05d}" for i in range(n)]

    def one(name: str) -> None:
        cp.add_node(name, annotations={NODE_DEVICES: inventory(name, GPUS, MEMORY, split=SPLIT)},
                    allocatable={"nvidia.com/vgpu-number": str(GPUS * SPLIT)})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))
    return names


def pod(ns: str, i: int, scheduler: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p-{i:05d}", "namespace": ns},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                                     "resources": {"limits": {
                                         "nvidia.com/vgpu-number": "1",
                                         "nvidia.com/vgpu-memory": str(POD_MEMORY)}}}]}}


def create_pods(api: Api, ns: str, n: int, scheduler: str) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: api.create(pod(ns, i, scheduler)), range(n)))


class Cpu:
    """The machine's CPU times and each component's, at one moment."""

    def __init__(self, procs: dict[str, Proc]) -> None:
        self.machine = psutil.cpu_times()
        self.procs: dict[str, float] = {}
        for name, p in procs.items():
            try:
                t = psutil.Process(p.pid).cpu_times()
            except (psutil.Error, AssertionError):
                continue
            self.procs[name] = t.user + t.system + t.children_user + t.children_system

    @staticmethod
    def busy(first: Cpu, last: Cpu) -> float:
        """The share of the machine's CPU time busy between two moments."""
        a, b = first.machine, last.machine
        total = sum(b) - sum(a)
        idle = (b.idle + b.iowait) - (a.idle + a.iowait)
        return 1 - idle / total if total > 0 else 0.0

    @staticmethod
    def per_pod(first: Cpu, last: Cpu, pods: int) -> dict[str, float]:
        """CPU milliseconds per pod of each component that ran throughout."""
        return {name: (last.procs[name] - first.procs[name]) / pods * 1000
                for name in first.procs if name in last.procs}


class BindWatch:
    """Counts the pods of a namespace as they are bound, with the time of each bind, and
    samples CPU times (:class:`Cpu`, of ``procs``) at the first bind and the last."""

    def __init__(self, api: Api, ns: str, expect: int,
                 procs: Callable[[], dict[str, Proc]]) -> None:
        self.api, self.ns, self.expect, self.procs = api, ns, expect, procs
        self.bound: dict[str, float] = {}
        self.error: Exception | None = None
        self.cpu: list[Cpu] = []
        self.done = threading.Event()
        listing = api.request("GET", f"/api/v1/namespaces/{ns}/pods")
        self.rv = listing["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception as e:  # the waiting side reports it
            self.error = e
            self.done.set()

    def _watch(self) -> None:
        while True:  # the server may end a watch early: go on from the last version seen
            for event in self.api.watch(f"/api/v1/namespaces/{self.ns}/pods",
                                        {"resourceVersion": self.rv}):
                obj = event["object"]
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch of {self.ns}: {obj.get('message')}")
                self.rv = obj["metadata"]["resourceVersion"]
                if event["type"] == "MODIFIED" and obj["spec"].get("nodeName"):
                    if not self.bound:
                        self.cpu = [Cpu(self.procs())]
                    self.bound.setdefault(obj["metadata"]["name"], time.monotonic())
                    if len(self.bound) >= self.expect:
                        self.cpu.append(Cpu(self.procs()))
                        self.done.set()
                        return

    def rate(self, timeout: float) -> tuple[float, float]:
        """(pods per second from the first bind to the last, seconds that took)."""
        if not self.done.wait(timeout):
            raise SystemExit(f"only {len(self.bound)} of {self.expect} pods bound in "
                             f"{timeout:.0f} s")
        if self.error is not None:
            raise SystemExit(f"watching the binds failed: {self.error}")
        times = sorted(self.bound.values())
        span = times[-1] - times[0]
        return (len(times) - 1) / span if span > 0 else float("inf"), span


def baseline_scheduler(cp: ControlPlane, work: Path, flags: list[str],
                       qps: int | None = None, name: str = BASELINE) -> Proc:
    """A stock kube-scheduler with the chart's ``flags`` (its log level included), as the
    scheduler ``name``; ``qps`` raises its client's rate limit (default 50/s, burst 100),
    which otherwise caps its binds."""
    kc = cp.kubeconfig_for_cert("baseline-scheduler", "system:kube-scheduler")
    cfg = work / f"{name}-config-{qps}.yaml"
    client: dict[str, Any] = {"kubeconfig": str(kc)}
    if qps:
        client |= {"qps": qps, "burst": 2 * qps}
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": client,
        "profiles": [{"schedulerName": name, "pluginConfig": [{
            "name": "NodeResourcesFit",
            "args": {"ignoredResources": ["nvidia.com/vgpu-memory"]}}]}]}))
    return Proc(f"{name}-kube-scheduler-{qps or 'default'}", [
        str(cp.bin_dir / "kube-scheduler"), *flags, f"--config={cfg}",
        f"--secure-port={free_port()}",
        "--bind-address=127.0.0.1", f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}"], work)


@dataclass(frozen=True)
class Result:
    rate: float  # pods per second, first bind to last
    span: float  # seconds from the first bind to the last
    busy: float  # the machine's CPU busy share meanwhile
    per_pod: dict[str, float]  # each component's CPU milliseconds a pod

    def __str__(self) -> str:
        where = ", ".join(f"{n} {ms:.1f}" for n, ms in
                          sorted(self.per_pod.items(), key=lambda x: -x[1]))
        return (f"{self.rate:7.1f} pods/s ({self.span:.1f} s, CPU {self.busy:.0%} busy; "
                f"CPU ms a pod: {where})")


def run(cp: ControlPlane, ns: str, pods: int, scheduler: str, start: Callable[[], Any],
        procs: Callable[[], dict[str, Proc]], timeout: float,
        create: Callable[[], Any] | None = None) -> Result:
    """Place ``pods`` new pods with the scheduler that ``start()`` starts; ``procs()``
    names the components whose CPU is counted (asked at the first bind and the last).
    ``create()`` makes the pods (default: ``pods`` of 1 vGPU for ``scheduler``)."""
    cp.namespace(ns)
    if create is None:
        create_pods(cp.admin, ns, pods, scheduler)
    else:
        create()
    watch = BindWatch(cp.admin, ns, pods, procs)
    start()
    rate, span = watch.rate(timeout)
    first, last = watch.cpu
    return Result(rate, span, Cpu.busy(first, last), Cpu.per_pod(first, last, pods))


def empty(cp: ControlPlane, ns: str) -> None:
    cp.admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods",
                     query={"gracePeriodSeconds": "0"}, timeout=600)
    wait_for(f"the pods of {ns} to go", lambda: not cp.admin.list("Pod", ns, limit="1"),
             timeout=300)


def baseline_run(cp: ControlPlane, work: Path, release: Release, pods: int, qps: int | None,
                 cpus: str | None, control: dict[str, Proc]) -> Result:
    """``pods`` placed by a stock kube-scheduler (the chart's flags, client ``qps``) by the
    extended-resource count; the namespace is emptied after."""
    baseline = baseline_scheduler(cp, work, release.kube_scheduler_flags(), qps)
    baseline.cpus = cpus
    cp.procs.append(baseline)
    ns = f"bench-baseline-{qps or 'default'}"
    got = run(cp, ns, pods, BASELINE, baseline.start, timeout=900,
              procs=functools.partial(dict, control, **{"kube-scheduler": baseline}))
    baseline.stop()
    empty(cp, ns)
    return got


def extender_run(cp: ControlPlane, release: Release, pods: int, cpus: str | None,
                 control: dict[str, Proc]) -> Result:
    """``pods`` placed by kube-scheduler and ``vgpud scheduler`` as the chart runs them (in
    the namespace bench-vgpud, left as it is)."""
    release.apply_objects(webhooks=False)  # pods are made as admitted
    release.cpus = cpus
    extender = release.start_extender()

    def ours() -> dict[str, Proc]:
        ks = release.kube_scheduler
        return {**control, **({"kube-scheduler": ks} if ks else {}),
                "vgpud scheduler": extender}
    return run(cp, "bench-vgpud", pods, "vgpu-scheduler", release.start_kube_scheduler,
               procs=ours, timeout=900)


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="CI: 50 nodes, 200 pods")
    ap.add_argument("--pin", action="store_true",
                    help="the control plane (and this driver) on CPU 0, the schedulers on "
                         "the others: as on a cluster, where the scheduler's pod does not "
                         "share its CPUs with kube-apiserver and etcd")
    args = ap.parse_args()
    nodes, pods = (50, 200) if args.quick else (args.nodes, args.pods)
    try:
        bins = build.ensure()
    except build.Unavailable as e:
        print(f"skipped: the real Kubernetes components cannot be built here: {e}")
        return 0
    with tempfile.TemporaryDirectory(prefix="vgpud-realsched-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(bins, work / "cp", audited=False)
        schedulers: str | None = None
        if args.pin:
            if (os.cpu_count() or 1) < 2:
                raise SystemExit("--pin needs two CPUs or more")
            schedulers = f"1-{(os.cpu_count() or 2) - 1}"
            os.sched_setaffinity(0, {0})
            cp.etcd.cpus = cp.apiserver.cpus = "0"
            print(f"pinned: etcd, kube-apiserver and this driver on CPU 0; the schedulers "
                  f"on CPU {schedulers}")
        cp.start()
        release = Release(cp, work / "release")
        try:
            t0 = time.monotonic()
            add_nodes(cp, nodes)
            print(f"{nodes} nodes x {GPUS} GPUs created in {time.monotonic() - t0:.1f} s; "
                  f"{pods} pods of 1 vGPU / {POD_MEMORY} MiB per run")
            control = {"etcd": cp.etcd, "kube-apiserver": cp.apiserver}
            rates = {}
            for qps in (None, KUBE_QPS):
                got = baseline_run(cp, work, release, pods, qps, schedulers, control)
                rates[qps] = got.rate
                client = f"client {qps}/s" if qps else "default client 50/s"
                print(f"kube-scheduler alone ({client + '):':<21} {got}")
            got = extender_run(cp, release, pods, schedulers, control)
            ours_rate = got.rate
            print(f"kube-scheduler + vgpud (as the chart):      {got}")
            placed = sum(1 for p in cp.admin.list("Pod", "bench-vgpud")
                         if ASSIGNMENT in (p["metadata"].get("annotations") or {}))
            print(f"pods bound with their assignment: {placed} of {pods}")
            print(f"ratio vgpud / kube-scheduler alone: {ours_rate / rates[KUBE_QPS]:.2f} "
                  f"against a client of {KUBE_QPS}/s (target >= 0.7), "
                  f"{ours_rate / rates[None]:.2f} against the default client")
            metrics = release.extender_metrics()
            calls = {}
            for line in metrics.splitlines():
                if line.startswith("vgpud_extender_requests_total{"):
                    labels, _, value = line.rpartition(" ")
                    verb = labels.split('verb="')[1].split('"')[0]
                    outcome = labels.split('outcome="')[1].split('"')[0]
                    calls[f"{verb} {outcome}"] = int(float(value))
            print("extender calls:", ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
            for verb, (p50, p99) in sorted(served(metrics).items()):
                print(f"extender {verb:<11} served in p50 <= {p50:6.1f} ms, "
                      f"p99 <= {p99:6.1f} ms")
        finally:
            release.stop()
            cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
