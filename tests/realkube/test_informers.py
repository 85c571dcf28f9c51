"""The scheduler's informers on the real kube-apiserver 1.37.2: how they sync, what they do
when the stream is too old or the server goes away, and what the status page and
``vgpud inspect`` show from them.

What the real server showed (and ``vgpud/kube/cache.py`` relies on):

- with WatchList on (1.37's default) the informers sync by streaming list, and the first
  bookmark of such a stream is the end-of-initial-events one;
- a proxy that drops ``sendInitialEvents``/``resourceVersionMatch`` is harmless in front of
  it: kube-apiserver defaults a watch from ``""`` without them back into a streaming list;
- with WatchList off (1.33's default) it refuses the parameter (422), and behind such a
  proxy it serves a plain watch: initial ADDEDs, then a bookmark without the end mark a
  minute later at the earliest, and only once the resource has changed since (61 s with
  the node's status reported every 5 s; 121 s in a run where nothing moved). That is the
  server the informer must find out at once (the first plain bookmark, or an old
  ``/version``) instead of waiting for the watch's 300 s timeout four times over (nodes,
  pods, PodDisruptionBudgets, ResourceQuotas one after the other);
- after a restart (and after etcd's compaction) a watch from the old resourceVersion gets
  410: the new watch cache starts at the current revision. The restarted server also
  answers 403 to ServiceAccounts for a moment, before its RBAC caches are filled: the
  informers back off and reconnect (``restart_kube_apiserver`` forgives only those).

The second control plane (``feature_off``) runs kube-apiserver with
``--feature-gates=WatchList=false``; its scheduler processes reach it through
:class:`tests.realkube.proxy.ApiProxy`, which records what they asked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.kube.test_standin import FEATURE_OFF
from tests.realkube.api import Obj, wait_for
from tests.realkube.cluster import TEST_LABEL, Scenario, assignment, inventory
from tests.realkube.conftest import VGPUD_USERS, refused
from tests.realkube.controlplane import ControlPlane, Proc, free_port, kubeconfig
from tests.realkube.proxy import ApiProxy
from tests.realkube.release import APPLIED, NAMESPACE, ROOT, Release, _args_of, lease_released
from vgpud.core.codec import NODE_DEVICES

MIB = 1 << 20
MEMORY = "nvidia.com/vgpu-memory"
CORES = "nvidia.com/vgpu-cores"
INFORMERS = ("nodes", "pods", "poddisruptionbudgets", "resourcequotas")
PATHS = {"nodes": "/api/v1/nodes", "pods": "/api/v1/pods",
         "poddisruptionbudgets": "/apis/policy/v1/poddisruptionbudgets",
         "resourcequotas": "/api/v1/resourcequotas"}
VGPUD_AGENT = "OpenAPI-Generator/"  # kubernetes_asyncio's User-Agent: vgpud's own requests
SCHEDULER_USER = f"system:serviceaccount:{NAMESPACE}:vgpud-scheduler"
# A plain watch's first bookmark comes a minute after it opens (defaultBookmarkFrequency);
# the watch itself ends after 300 s. Ready well before that is ready "at once".
AFTER_THE_FIRST_BOOKMARK = 150.0
AT_ONCE = 45.0  # a Python process's start, four small syncs, on a busy 2-core machine

SYNCS = re.compile(r'^vgpud_scheduler_informer_syncs_total\{informer="([^"]+)",'
                   r'mode="([^"]+)"\} (\S+)$', re.M)


def _get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        raw = r.read().decode()
    return json.loads(raw) if raw[:1] in "{[" else raw


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def syncs(metrics: str) -> dict[tuple[str, str], float]:
    """``vgpud_scheduler_informer_syncs_total`` by (informer, mode)."""
    return {(m[1], m[2]): float(m[3]) for m in SYNCS.finditer(metrics)}


def synced(metrics: Callable[[], str]) -> dict[tuple[str, str], float]:
    """:func:`syncs` once every informer has synced. Readiness waits for the nodes,
    pods and quotas only: the budgets informer may still be listing (seen on a loaded
    machine)."""
    def done() -> bool:
        counts = syncs(metrics())
        return all(counts.get((i, "list"), 0) + counts.get((i, "watch-list"), 0) >= 1
                   for i in INFORMERS)

    wait_for("every informer to have synced", done, timeout=AT_ONCE, every=0.2)
    return syncs(metrics())


def watch_lists_served(cp: ControlPlane) -> dict[str, float]:
    """kube-apiserver's own count of streaming lists it finished (the initial-events-end
    bookmark sent: ``apiserver_watch_list_duration_seconds``), by resource."""
    out: dict[str, float] = {}
    for line in str(cp.admin.request("GET", "/metrics")).splitlines():
        if line.startswith("apiserver_watch_list_duration_seconds_count{"):
            resource = line.split('resource="', 1)[1].split('"', 1)[0]
            out[resource] = out.get(resource, 0.0) + float(line.rpartition(" ")[2])
    return out


def status(release: Release, what: str, **params: str) -> list[Obj]:
    """The scheduler's JSON API (the status page's data), every row asked for."""
    query = urlencode({**params, "limit": "5000"})
    doc = _get(f"http://127.0.0.1:{release.extender_ops}/api/v1/{what}?{query}")
    items: list[Obj] = doc["items"]
    return items


def gpus_of(release: Release, s: Scenario) -> dict[str, Obj]:
    """The scheduler's GPU rows of this scenario's nodes, by uuid."""
    return {g["uuid"]: g for g in status(release, "gpus", q=s.id) if g["node"] in s.nodes}


def log_count(proc: Proc, event: str, informer: str) -> int:
    try:
        text = proc.log_path.read_text(errors="replace")
    except OSError:
        return 0
    return sum(1 for line in text.splitlines()
               if event in line and f"informer={informer}" in line)


def kube_scheduler_up(cp: ControlPlane, release: Release) -> None:
    """kube-scheduler leads with a 10 s renewDeadline: a kube-apiserver down longer than
    that makes it exit ("leaderelection lost"), and its Deployment would start it again.
    Wait until it has renewed its Lease on the restarted server, or start it again."""
    p = release.kube_scheduler
    assert p is not None
    lease = release.scheduler_configuration()["leaderElection"]
    since = datetime.now(UTC)

    def settled() -> str | None:
        if not p.alive():
            return "exited"
        got = cp.admin.find("Lease", lease["resourceName"], lease["resourceNamespace"])
        renewed = ((got or {}).get("spec") or {}).get("renewTime")
        if renewed and datetime.fromisoformat(renewed.replace("Z", "+00:00")) > since:
            return "renewed"
        return None
    if wait_for("kube-scheduler to renew its Lease or exit", settled, timeout=60,
                detail=lambda: p.tail()) == "exited":
        p.stop()
        lease_released(cp, lease["resourceName"])
        release.start_kube_scheduler()


def restart_kube_apiserver(cp: ControlPlane) -> None:
    """``cp.restart_apiserver()``, forgiving only the refusals of the restart itself.

    The new kube-apiserver serves requests before its RBAC informers have synced and
    refuses whatever no built-in role allows ("RBAC: clusterrole ... not found"); a client
    that reconnects at once (the webhook's informer) gets a 403, backs off and is served.
    Refusals before the restart still fail the test (checked here), and so do any after
    the new server is ready (the autouse check, from here on)."""
    events, start = cp.audit(cp.audit_checked)
    assert refused(events) == [], "a vgpud role was refused before the restart"
    cp.restart_apiserver()
    ready = datetime.now(UTC)
    events, _ = cp.audit(start)
    late = [e for e in events if e["user"]["username"].startswith(VGPUD_USERS)
            and (e.get("responseStatus") or {}).get("code") == 403
            and datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00")) > ready]
    assert late == [], late
    print("refused while kube-apiserver started:", *refused(events), sep="\n  ")
    cp.audit_forget(start)


def gpu_pod_probe(s: Scenario, name: str) -> Obj:
    """A GPU pod as the webhook leaves it, for a direct call to the extender's filter."""
    return {"metadata": {"name": name, "namespace": s.ns, "uid": f"{s.id}-{name}"},
            "spec": {"schedulerName": "vgpu-scheduler", "containers": [{
                "name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/vgpu-number": "1", MEMORY: "1000"}}}]}}


def extender_filter(release: Release, pod: Obj, nodes: list[str]) -> Obj:
    req = urllib.request.Request(f"http://127.0.0.1:{release.extender_port}/filter",
                                 json.dumps({"Pod": pod, "NodeNames": nodes}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        out: Obj = json.loads(r.read())
    return out


# -- a vgpud scheduler reaching its API server another way ---------------------------------


@dataclass
class Scheduler:
    """A ``vgpud scheduler`` process (the chart's arguments, its ServiceAccount's token)
    whose kubeconfig names ``server``, with its ops port; its start time on the monotonic
    clock."""

    proc: Proc
    ops: int
    started: float

    def ready(self) -> bool:
        self.proc.check_alive()
        return _ok(f"http://127.0.0.1:{self.ops}/readyz")

    def metrics(self) -> str:
        return str(_get(f"http://127.0.0.1:{self.ops}/metrics"))

    def gpus(self) -> list[Obj]:
        items: list[Obj] = _get(f"http://127.0.0.1:{self.ops}/api/v1/gpus?limit=5000")["items"]
        return items


def start_scheduler(release: Release, server: str, name: str) -> Scheduler:
    cp = release.cp
    p = release._vgpud(name, _args_of(release.manifests, "vgpud-scheduler", "extender"),
                       "vgpud-scheduler")
    kc = kubeconfig(release.dir / f"{name}.kubeconfig", server, cp.pki.ca,
                    token=cp.token(NAMESPACE, "vgpud-scheduler"), user=SCHEDULER_USER)
    ops = free_port()
    p.argv = [a for a in p.argv if not a.startswith("--kubeconfig=")] + [
        f"--kubeconfig={kc}", f"--listen=127.0.0.1:{free_port()}",
        f"--metrics-listen=127.0.0.1:{ops}"]
    p.start()
    return Scheduler(p, ops, time.monotonic())


@pytest.fixture
def proxies() -> Iterator[list[ApiProxy]]:
    started: list[ApiProxy] = []
    yield started
    for proxy in started:
        proxy.stop()


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    started: list[Scheduler] = []
    yield started
    for s in started:
        s.proc.stop()


def proxy_to(cp: ControlPlane, proxies: list[ApiProxy], name: str, **options: Any) -> ApiProxy:
    proxy = ApiProxy(cp.server, cp.pki.ca, cp.pki.serving(name), **options).start()
    proxies.append(proxy)
    return proxy


# -- on kube-apiserver 1.37 as it ships (WatchList on) ----------------------------------------


def test_the_schedulers_informers_sync_by_streaming_list(control_plane: ControlPlane,
                                                         release: Release) -> None:
    """A fresh ``vgpud scheduler`` fills its four caches by streaming list: its own
    count says so, kube-apiserver counts four more streaming lists finished, and the
    audit log shows no list request from it."""
    assert release.extender is not None
    release.extender.stop()
    served = watch_lists_served(control_plane)
    _, start = control_plane.audit()
    release.start_extender()
    counts = synced(release.extender_metrics)
    for informer in INFORMERS:
        assert counts[(informer, "watch-list")] == 1, counts
        assert counts[(informer, "list")] == 0, counts
    now = watch_lists_served(control_plane)
    for informer in INFORMERS:  # (nothing else re-lists while only the extender restarts)
        assert now.get(informer, 0) >= served.get(informer, 0) + 1, (informer, served, now)
    events, _ = control_plane.audit(start)
    mine = [e for e in events if e["user"]["username"] == SCHEDULER_USER
            and str(e.get("userAgent", "")).startswith(VGPUD_AGENT)]
    assert mine, "the audit log shows nothing from the extender"
    assert [e["requestURI"] for e in mine if e["verb"] == "list"] == []


def test_a_proxy_that_drops_the_parameters_is_harmless_in_front_of_1_37(
        control_plane: ControlPlane, release: Release, proxies: list[ApiProxy],
        schedulers: list[Scheduler]) -> None:
    """kube-apiserver 1.34+ defaults a watch from "" with neither ``sendInitialEvents`` nor
    ``resourceVersionMatch`` to a streaming list (``SetListOptionsDefaults``): the request
    the proxy stripped is still answered with the initial-events-end bookmark."""
    proxy = proxy_to(control_plane, proxies, "proxy-harmless", strip_watch_list=True)
    s = start_scheduler(release, proxy.url, "vgpud-scheduler-harmless")
    schedulers.append(s)
    wait_for("the scheduler behind the proxy to be ready", s.ready, timeout=AT_ONCE,
             every=0.3, detail=lambda: s.proc.tail())
    counts = synced(s.metrics)
    assert {i: counts[(i, "watch-list")] for i in INFORMERS} == dict.fromkeys(INFORMERS, 1.0)
    asked = proxy.requests(VGPUD_AGENT)
    assert sorted(r.path for r in asked if r.streaming_list) == sorted(PATHS.values())
    assert [r.path for r in asked if r.method == "GET" and not r.watch
            and r.path != "/version"] == []  # no list


def test_a_watch_too_old_after_compaction_resyncs_and_the_view_follows(
        control_plane: ControlPlane, release: Release, scenario: Scenario) -> None:
    """The scheduler is frozen while a node goes, a node comes and a GPU pod is deleted;
    etcd is compacted and kube-apiserver restarted (its watch cache starts again at the
    new revision). Thawed, its watches resume from a resourceVersion too old: 410, a
    re-sync, and its view — status page and filter — follows the cluster."""
    s = scenario
    assert release.extender is not None
    a, b = s.gpu_node("a"), s.gpu_node("b")
    s.apply(s.pod("held", {MEMORY: "3000"}, node_name=b))
    held = assignment(s.wait_bound("held", detail=lambda: s.describe("held") + "\n"
                                   + release.tails()))
    assert held.node == b
    wait_for("the status page to show the held pod", lambda: [
        p for p in status(release, "pods", namespace=s.ns)
        if p["name"] == "held" and p["state"] == "confirmed"])
    assert {g["node"] for g in gpus_of(release, s).values()} == {a, b}
    before = syncs(release.extender_metrics())
    expired = {i: log_count(release.extender, "informer_watch_expired", i)
               for i in ("nodes", "pods")}

    release.extender.freeze()
    try:
        s.admin.delete("Pod", "held", s.ns, grace=0)
        s.admin.delete("Node", b)
        c = s.gpu_node("c")
        control_plane.compact_etcd()
        restart_kube_apiserver(control_plane)
    finally:
        release.extender.thaw()
    kube_scheduler_up(control_plane, release)

    def followed() -> bool:
        nodes = {g["node"] for g in gpus_of(release, s).values()}
        pods = [p["name"] for p in status(release, "pods", namespace=s.ns)]
        # and both informers resynced: the view can drop the held pod with its node
        # before the pods informer's own resync is counted (seen in a full run)
        now = syncs(release.extender_metrics())
        resynced = all(now.get((i, "watch-list"), 0) > before[(i, "watch-list")]
                       for i in ("nodes", "pods"))
        return nodes == {a, c} and pods == [] and resynced
    wait_for("the scheduler's view to drop b and the held pod, and to add c", followed,
             timeout=90, detail=lambda: release.tails())
    after = syncs(release.extender_metrics())
    for informer in ("nodes", "pods"):
        assert log_count(release.extender, "informer_watch_expired", informer) > (
            expired[informer]), release.extender.tail()
        assert after[(informer, "watch-list")] > before[(informer, "watch-list")], (
            informer, before, after)
        assert after[(informer, "list")] == before[(informer, "list")]
    # Its filter knows c, and knows b no more.
    got = extender_filter(release, gpu_pod_probe(s, "probe"), [a, b, c])
    assert sorted(got["NodeNames"]) == sorted([a, c]), got
    assert "no vgpud GPU inventory" in got["FailedAndUnresolvableNodes"][b], got
    # ... and places a pod there as before (c only: a node the scheduler learnt on re-sync).
    s.apply(s.pod("next", {MEMORY: "3000"}, node_name=c))
    assert assignment(s.wait_bound("next", timeout=120)).node == c


def test_the_scheduler_rides_out_a_kube_apiserver_restart(
        control_plane: ControlPlane, release: Release, scenario: Scenario) -> None:
    """kube-apiserver restarts under a running scheduler: the same process reconnects, sees
    a node added afterwards, and binds a pod there with its assignment."""
    s = scenario
    assert release.extender is not None and release.extender.proc is not None
    pid = release.extender.proc.pid
    s.gpu_node("a")
    s.apply(s.pod("before", {MEMORY: "2000"}))
    s.wait_bound("before")
    restart_kube_apiserver(control_plane)
    kube_scheduler_up(control_plane, release)
    c = s.gpu_node("c")  # only a live watch (or a re-sync) shows it to the scheduler
    wait_for("the scheduler to see the node added after the restart", lambda: any(
        g["node"] == c for g in gpus_of(release, s).values()), timeout=90,
        detail=lambda: release.tails())
    s.apply(s.pod("after", {MEMORY: "2000", CORES: "20"}, node_name=c))
    pod = s.wait_bound("after", timeout=120,
                       detail=lambda: s.describe("after") + "\n" + release.tails())
    placed = assignment(pod)
    assert placed.node == c
    (grant,) = placed.containers
    (device,) = grant.devices
    assert (device.memory, device.cores) == (2000, 20)
    wait_for("the status page to confirm both pods", lambda: sorted(
        (p["name"], p["state"]) for p in status(release, "pods", namespace=s.ns)) == [
        ("after", "confirmed"), ("before", "confirmed")], timeout=60)
    assert release.extender.proc is not None and release.extender.proc.pid == pid
    assert release.extender.alive() and _ok(f"http://127.0.0.1:{release.extender_ops}/readyz")


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpud", "inspect", *args], cwd=ROOT,
                          env={**_env(), "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120, check=False)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}


def _reader(cp: ControlPlane, s: Scenario, user: str, role: str | None) -> Path:
    """A person's kubeconfig (a client certificate) bound to ``role``, or to a ClusterRole
    with exactly what ``vgpud inspect`` reads when ``role`` is None."""
    name = f"{s.id}-{user}"
    if role is None:
        role = name
        cp.admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                         "metadata": {"name": role}, "rules": [
                             {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
                             {"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list"]},
                             {"apiGroups": ["resource.k8s.io"],
                              "resources": ["resourceslices", "resourceclaims"],
                              "verbs": ["list"]}]})
        s.cluster_objects.append(("ClusterRole", role))
    cp.admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": {"name": name},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                 "name": role},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                   "name": name}]})
    s.cluster_objects.append(("ClusterRoleBinding", name))
    return cp.kubeconfig_for_cert(name, name)


def test_the_status_page_and_inspect_show_the_gpus_and_the_assignment(
        control_plane: ControlPlane, release: Release, scenario: Scenario) -> None:
    """The scheduler's status page and ``vgpud inspect`` (from the API server, as a person
    with a role of ``list nodes``, ``get, list pods``; and from the scheduler) agree with the
    pod's assignment on the real server. The built-in ``view`` role is not enough for
    ``inspect``: it grants no nodes, which are cluster-scoped."""
    s = scenario
    a = s.gpu_node("a", gpus=2, memory=16384)
    b = s.gpu_node("b", gpus=1, memory=32768)
    s.apply(s.pod("infer", {MEMORY: "3000", CORES: "30"}))
    placed = assignment(s.wait_bound("infer", detail=lambda: s.describe("infer") + "\n"
                                     + release.tails()))
    (grant,) = placed.containers
    (device,) = grant.devices
    uuids = {f"GPU-{a}-0", f"GPU-{a}-1", f"GPU-{b}-0"}

    # The status page's data: the scheduler's own ledger.
    def sliced() -> dict[str, Obj] | None:
        rows = gpus_of(release, s)
        return rows if any(g["slices"] for g in rows.values()) else None
    page = wait_for("the status page to show the pod's slice", sliced)
    assert set(page) == uuids
    held = page[device.uuid]
    assert (held["memoryAllocated"], held["coresAllocated"], held["vgpusAllocated"]) == (
        3000 * MIB, 30, 1)
    assert [(x["namespace"], x["pod"], x["container"], x["memory"], x["cores"], x["state"])
            for x in held["slices"]] == [(s.ns, "infer", "main", 3000 * MIB, 30, "confirmed")]
    assert all(not g["slices"] for u, g in page.items() if u != device.uuid)
    assert page[f"GPU-{b}-0"]["memoryCapacity"] == 32768 * MIB
    (row,) = status(release, "pods", namespace=s.ns)
    assert (row["name"], row["node"], row["state"]) == ("infer", placed.node, "confirmed")
    assert [(g["uuid"], g["memory"], g["cores"]) for g in row["grants"]] == [
        (device.uuid, 3000 * MIB, 30)]
    html = str(_get(f"http://127.0.0.1:{release.extender_ops}/?{urlencode({'q': s.id})}"))
    assert "infer" in html and device.uuid in html and b in html

    # vgpud inspect against the API server, as a person who may read nodes and pods.
    kc = str(_reader(control_plane, s, "inspector", None))
    settings = str(release.dir / "vgpud.yaml")
    _, audit_from = control_plane.audit()
    out = _inspect("gpus", "--kubeconfig", kc, "--config", settings, "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = {g["uuid"]: g for g in json.loads(out.stdout) if g["node"] in (a, b)}
    fields = ("node", "memoryCapacity", "memoryAllocated", "coresAllocated", "vgpusAllocated",
              "vgpusCapacity")
    assert {u: [g[f] for f in fields] for u, g in rows.items()} == {
        u: [g[f] for f in fields] for u, g in page.items()}
    assert rows[device.uuid]["slices"][0]["pod"] == "infer"
    out = _inspect("nodes", "--kubeconfig", kc, "--config", settings, "-o", "json")
    assert out.returncode == 0, out.stderr
    nodes = {n["node"]: n["gpus"] for n in json.loads(out.stdout) if n["node"] in (a, b)}
    assert {n: len(g) for n, g in nodes.items()} == {a: 2, b: 1}
    out = _inspect("pod", f"{s.ns}/infer", "--kubeconfig", kc, "--config", settings,
                   "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["node"] == placed.node and doc["asks"][0]["memory"] == 3000
    assert [(g["uuid"], g["memory"], g["cores"]) for g in doc["assignment"]["grants"]] == [
        (device.uuid, 3000 * MIB, 30)]
    out = _inspect("pod", f"{s.ns}/infer", "--kubeconfig", kc, "--config", settings)
    assert out.returncode == 0, out.stderr
    assert f"Node:      {placed.node}" in out.stdout and device.uuid in out.stdout
    events, _ = control_plane.audit(audit_from)
    user = f"{s.id}-inspector"
    assert [e["requestURI"] for e in events if e["user"]["username"] == user
            and e["responseStatus"]["code"] == 403] == []

    # ... and against the running scheduler: the same assignment.
    out = _inspect("pod", f"{s.ns}/infer", "--scheduler",
                   f"http://127.0.0.1:{release.extender_ops}", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert [(g["uuid"], g["memory"]) for g in json.loads(out.stdout)["assignment"]["grants"]] \
        == [(device.uuid, 3000 * MIB)]

    # The built-in view role reads pods but no nodes: inspect says so and fails.
    viewer = str(_reader(control_plane, s, "viewer", "view"))
    out = _inspect("nodes", "--kubeconfig", viewer, "--config", settings)
    assert out.returncode == 1
    assert 'cannot list resource "nodes"' in out.stderr, out.stderr


# -- on kube-apiserver 1.37 with WatchList off, behind a proxy ----------------------------------


@pytest.fixture(scope="module")
def feature_off(components: Path, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver 1.37.2 with ``--feature-gates=WatchList=false``, the chart's
    RBAC applied, and one GPU node."""
    cp = ControlPlane(components, tmp_path_factory.mktemp("watchlist-off"),
                      apiserver_flags=("--feature-gates=WatchList=false",))
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def off_release(feature_off: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Release:
    rel = Release(feature_off, tmp_path_factory.mktemp("watchlist-off-release"))
    for doc in rel.manifests.docs:
        if doc["kind"] in APPLIED:
            feature_off.admin.apply(doc, manager="helm")
    if feature_off.admin.find("Node", "old-gpu") is None:
        feature_off.add_node("old-gpu", annotations={NODE_DEVICES: inventory("old-gpu", 2, 16384)},
                             labels={TEST_LABEL: "watchlist-off"},
                             allocatable={"nvidia.com/vgpu-number": "20"})
    return rel


def _no_role_refused(cp: ControlPlane) -> None:
    events, _ = cp.audit()
    assert refused(events) == []


def _heartbeat(cp: ControlPlane) -> None:
    """The node's status, reported again as its kubelet would every few seconds."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cp.admin.patch("Node", "old-gpu", {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "no kubelet: a test's node", "lastHeartbeatTime": now,
        "lastTransitionTime": now}]}}, sub="status")


def _ready_with_the_node(s: Scheduler, within: float, *,
                         kubelet: ControlPlane | None = None) -> float:
    """Wait until ``s`` is ready; how long it took from its start. Its view has the node.
    With ``kubelet``, the node's status is reported every 5 s meanwhile (a live cluster:
    kube-apiserver sends a plain watch a bookmark only once its resource has moved on)."""
    beat = -1.0

    def ready() -> bool:
        nonlocal beat
        if kubelet is not None and time.monotonic() - beat >= 5:
            _heartbeat(kubelet)
            beat = time.monotonic()
        return s.ready()
    wait_for(f"the scheduler to be ready within {within:.0f} s", ready, timeout=within,
             every=0.3, detail=lambda: s.proc.tail())
    took = time.monotonic() - s.started
    assert {g["node"] for g in s.gpus()} == {"old-gpu"}
    return took


def test_a_server_that_ignores_send_initial_events_is_found_out_at_its_first_bookmark(
        feature_off: ControlPlane, off_release: Release, proxies: list[ApiProxy],
        schedulers: list[Scheduler]) -> None:
    """The proxy drops ``sendInitialEvents``/``resourceVersionMatch``: the server with the
    feature off serves a plain watch and its first bookmark, a minute later (the node's
    status reported meanwhile, as kubelets do), has no end mark. The nodes informer falls
    back to listing there; the pods, budgets and quotas informers share its client and
    list at once. Before, each waited for the watch to time out (300 s, each in turn)."""
    proxy = proxy_to(feature_off, proxies, "proxy-strip", strip_watch_list=True)
    s = start_scheduler(off_release, proxy.url, "vgpud-scheduler-stripped")
    schedulers.append(s)
    took = _ready_with_the_node(s, AFTER_THE_FIRST_BOOKMARK, kubelet=feature_off)
    print(f"ready {took:.1f} s after start, behind a proxy dropping sendInitialEvents")
    counts = synced(s.metrics)
    asked = proxy.requests(VGPUD_AGENT)
    streamed = [r for r in asked if r.streaming_list]
    assert [(r.path, r.status) for r in streamed] == [(PATHS["nodes"], 200)]
    listed = {r.path for r in asked if r.method == "GET" and not r.watch and "limit" in r.query}
    assert listed == set(PATHS.values())
    by_mode = {i: (counts[(i, "watch-list")], counts[(i, "list")]) for i in INFORMERS}
    assert by_mode == dict.fromkeys(INFORMERS, (0.0, 1.0))
    assert "a bookmark without the initial-events-end mark" in s.proc.log_path.read_text()
    _no_role_refused(feature_off)


def test_a_server_older_than_1_27_is_listed_at_once(
        feature_off: ControlPlane, off_release: Release, proxies: list[ApiProxy],
        schedulers: list[Scheduler]) -> None:
    """The same proxy also answers ``/version`` as kube-apiserver 1.26 would: the scheduler
    asks it once and never sends a streaming list."""
    proxy = proxy_to(feature_off, proxies, "proxy-old", strip_watch_list=True,
                     version="v1.26.15")
    s = start_scheduler(off_release, proxy.url, "vgpud-scheduler-old")
    schedulers.append(s)
    took = _ready_with_the_node(s, AT_ONCE)
    print(f"ready {took:.1f} s after start, behind a proxy reporting v1.26.15")
    counts = synced(s.metrics)
    asked = proxy.requests(VGPUD_AGENT)
    assert [r for r in asked if r.streaming_list] == []
    assert [r.path for r in asked if r.path == "/version"] == ["/version"]
    assert all(counts[(i, "list")] == 1 and counts[(i, "watch-list")] == 0 for i in INFORMERS)
    _no_role_refused(feature_off)


def test_a_server_without_the_feature_refuses_and_each_informer_lists(
        feature_off: ControlPlane, off_release: Release, proxies: list[ApiProxy],
        schedulers: list[Scheduler]) -> None:
    """Straight through (the proxy only records): 422 with the message the API stand-in
    imitates, and each informer lists at once (a refusal is per informer: a 403 may be
    one resource's RBAC)."""
    proxy = proxy_to(feature_off, proxies, "proxy-record")
    s = start_scheduler(off_release, proxy.url, "vgpud-scheduler-refused")
    schedulers.append(s)
    _ready_with_the_node(s, AT_ONCE)
    counts = synced(s.metrics)  # every informer, the budgets' too, is past its request
    refusals = [r for r in proxy.requests(VGPUD_AGENT) if r.streaming_list]
    assert sorted((r.path, r.status) for r in refusals) == sorted(
        (p, 422) for p in PATHS.values())
    for r in refusals:
        body = json.loads(r.error)
        assert (body["reason"], body["message"]) == ("Invalid", FEATURE_OFF), body
    assert all(counts[(i, "list")] == 1 for i in INFORMERS)
    _no_role_refused(feature_off)

