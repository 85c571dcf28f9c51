"""The real kube-scheduler allocating vgpud's ResourceSlices (DRA, consumable capacity),
beside the extender path and kube-scheduler alone, in one run.

    python benchmarks/dra_scheduler.py             # 500 nodes x 8 GPUs, 2,000 pods
    python benchmarks/dra_scheduler.py --quick     # CI: 20 nodes, 100 pods

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler v1.37.2
(``tests/realkube/build.py``). Every node is a Node object (no kubelet) carrying both what
the device plugin would advertise (the extender path) and vgpud's ResourceSlice, built by
``vgpud.core.slices`` (the publisher's objects: 8 GPUs of 80 GiB, split 10). The same
number of pods (one vGPU of 4,000 MiB each) is placed three times on empty nodes:

- **baseline**: a stock kube-scheduler placing them by the extended-resource count (client
  1,000/s), as in ``real_scheduler.py``;
- **vgpud extender**: kube-scheduler as the chart configures it, with ``vgpud scheduler``;
- **DRA**: a stock kube-scheduler (client 1,000/s) allocating one claim per pod from a
  ResourceClaimTemplate (``capacity.requests.memory: 4000Mi`` of the chart's
  ``vgpu.vgpud.io`` class); the claims are made by kube-controller-manager before the
  scheduler starts, so only scheduling is timed.

Prints each run's pods per second (first bind to last), and the DRA rate's ratio to the
baseline and to the extender. Figures only, never pass/fail on time. Upstream's
scheduler_perf figures for DRA are about 40-80 pods/s at 500 nodes (shared/reference/dra.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_scheduler import (
    GPUS,
    KUBE_QPS,
    MEMORY,
    POD_MEMORY,
    SPLIT,
    add_nodes,
    baseline_run,
    baseline_scheduler,
    empty,
    extender_run,
    run,
)

from tests.realkube import build
from tests.realkube.api import wait_for
from tests.realkube.controlplane import ControlPlane, Proc
from tests.realkube.release import Release, render
from vgpud.core.model import Gpu, NodeInventory
from vgpud.core.slices import devices, pool

DRA = "dra-scheduler"
TEMPLATE = "vgpu-4000"


def publish_slices(cp: ControlPlane, nodes: list[str]) -> None:
    """Each node's pool as the publisher would write it (owned by the Node)."""
    def one(name: str) -> None:
        node = cp.admin.get("Node", name)
        inv = NodeInventory(tuple(Gpu(f"GPU-{name}-{i}", i, "NVIDIA A100-SXM4-80GB", MEMORY,
                                      SPLIT, i % 2) for i in range(GPUS)))
        for s in pool(name, devices(inv), 1):
            cp.admin.create(s.manifest(node["metadata"]["uid"]))

    with ThreadPoolExecutor(8) as workers:
        list(workers.map(one, nodes))


def dra_pods(cp: ControlPlane, ns: str, pods: int) -> None:
    """``pods`` pods of one claim each (from one template), and their claims made."""
    cp.namespace(ns)
    cp.admin.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
            "deviceClassName": "vgpu.vgpud.io",
            "capacity": {"requests": {"memory": f"{POD_MEMORY}Mi"}}}}]}}}})

    def pod(i: int) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"p-{i:05d}", "namespace": ns},
                "spec": {"schedulerName": DRA, "terminationGracePeriodSeconds": 0,
                         "resourceClaims": [{"name": "gpu",
                                             "resourceClaimTemplateName": TEMPLATE}],
                         "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                                         "resources": {"claims": [{"name": "gpu"}]}}]}}

    with ThreadPoolExecutor(8) as workers:
        list(workers.map(lambda i: cp.admin.create(pod(i)), range(pods)))

    def claims_made() -> bool:
        n = len(cp.admin.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/"
                                        "resourceclaims")["items"])
        return n >= pods
    wait_for(f"{pods} claims made by kube-controller-manager", claims_made, timeout=600,
             every=1.0)


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="CI: 20 nodes, 100 pods")
    args = ap.parse_args()
    nodes, pods = (20, 100) if args.quick else (args.nodes, args.pods)
    try:
        bins = build.ensure()
    except build.Unavailable as e:
        print(f"skipped: the real Kubernetes components cannot be built here: {e}")
        return 0
    with tempfile.TemporaryDirectory(prefix="vgpud-drasched-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(bins, work / "cp", audited=False)
        cp.start()
        release = Release(cp, work / "release")
        try:
            t0 = time.monotonic()
            names = add_nodes(cp, nodes)
            for doc in render(("dra.enabled=true",)).of_kind("DeviceClass"):
                cp.admin.apply(doc, manager="helm")
            publish_slices(cp, names)
            cp.start_controller_manager("resourceclaim-controller")
            print(f"{nodes} nodes x {GPUS} GPUs (annotation, allocatable and ResourceSlice) "
                  f"in {time.monotonic() - t0:.1f} s; {pods} pods of 1 vGPU / {POD_MEMORY} MiB "
                  "per run")
            control = {"etcd": cp.etcd, "kube-apiserver": cp.apiserver}
            base = baseline_run(cp, work, release, pods, KUBE_QPS, None, control)
            print(f"kube-scheduler alone (client {KUBE_QPS}/s):      {base}")

            dra = baseline_scheduler(cp, work, release.kube_scheduler_flags(), KUBE_QPS,
                                     name=DRA)
            cp.procs.append(dra)
            ours: dict[str, Proc] = {**control, "kube-scheduler": dra}
            got_dra = run(cp, "bench-dra", pods, DRA, dra.start, procs=lambda: ours,
                          timeout=900, create=lambda: dra_pods(cp, "bench-dra", pods))
            dra.stop()
            print(f"kube-scheduler with DRA (vgpud's slices):  {got_dra}")
            empty(cp, "bench-dra")

            ext = extender_run(cp, release, pods, None, control)
            print(f"kube-scheduler + vgpud extender:           {ext}")
            print(f"ratio DRA / kube-scheduler alone: {got_dra.rate / base.rate:.2f}; "
                  f"DRA / vgpud extender: {got_dra.rate / ext.rate:.2f}")
        finally:
            release.stop()
            cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
