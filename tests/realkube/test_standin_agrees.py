"""The API stand-in (``tests/standin``) against kube-apiserver 1.37.2: every behaviour of
the API that vgpud relies on and the stand-in imitates, checked the same way on both.

Each test runs twice, on the stand-in (as a process, ``python -m tests.standin``, with
streaming lists on as 1.37 has them and ``--no-kubelets``, as this control plane has
none) and on the real server, through vgpud's own client (``KubeClient`` from a
kubeconfig) and, where vgpud has one, vgpud's own code for the call (``list_pages``,
``open_watch``, ``PodWriter``, ``PodBinder``, ``EventRecorder``, ``LeaderElector``,
the webhook's ``Bootstrap``, the plugin's ``KubeCluster``, the rescheduler's
``replacement``). The expected values are what kube-apiserver 1.37.2 answered; where
the stand-in answered otherwise it was changed to agree, and what it still does not
copy is listed, with the reason, in ``tests/standin/apiserver.py`` and ``objects.py``.

Not here: streaming lists, a plain watch's bookmarks and a server that ignores
``sendInitialEvents`` (``test_informers.py`` and ``vgpud/kube/cache.py``); RBAC
(``test_rbac.py``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.kube.clocks import JumpClock, ManualClock
from tests.realkube.api import ApiError, wait_for
from tests.realkube.cluster import Scenario
from tests.realkube.controlplane import ControlPlane
from vgpud.core.model import Defaults
from vgpud.core.requests import parse_pod, parse_quantity
from vgpud.kube import errors
from vgpud.kube.client import KubeClient
from vgpud.kube.lease import LeaderElector
from vgpud.kube.resources import EVENTS, NODES, PODS
from vgpud.kube.watch import Selector, WatchEvent, list_pages, open_watch
from vgpud.kube.writes import EventRecorder, ObjectRef, PodBinder, PodWriter, RetryPolicy
from vgpud.node.cluster import KubeCluster
from vgpud.node.pods import NodePods
from vgpud.scheduling.projections import project_pod
from vgpud.scheduling.reschedule import Copy, replacement
from vgpud.webhook.bootstrap import Bootstrap, issue_ca

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
REJECTED = "the server rejected our request due to an error in our request"
MODIFIED_MESSAGE = ("the object has been modified; please apply your changes to the latest "
                    "version and try again")
SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
             "characters, '-' or '.', and must start and end with an alphanumeric character "
             "(e.g. 'example.com', regex used for validation is "
             "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
GPU = {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "3000",
       "nvidia.com/vgpu-cores": "30", "cpu": "1000m", "memory": "1024Mi"}
_ids = itertools.count()


# -- the two servers ---------------------------------------------------------------------------


@dataclass
class StandinProcess:
    url: str
    kubeconfig: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def standin_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinProcess]:
    """``python -m tests.standin`` as kube-apiserver 1.37 runs here: streaming lists on,
    no kubelets."""
    home = tmp_path_factory.mktemp("standin")
    port_file, log = home / "port", home / "standin.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.standin", "--port", "0", "--port-file", str(port_file),
             "--watch-list", "--no-kubelets", "--version", "v1.37.2-standin"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def port() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"the stand-in exited ({proc.returncode}):\n"
                                 + log.read_text(errors="replace"))
        return port_file.read_text().strip() or None if port_file.exists() else None

    try:
        url = f"http://127.0.0.1:{wait_for('the stand-in', port, timeout=60)}"
        config = home / "kubeconfig"
        config.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": url}}],
            "users": [{"name": "standin", "user": {}}],
            "contexts": [{"name": "standin",
                          "context": {"cluster": "standin", "user": "standin"}}]}))
        yield StandinProcess(url, config, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)


@dataclass
class Server:
    """One server under test, with this test's namespace on it."""

    name: str  # "standin" | "real"
    kubeconfig: Path
    ns: str
    cp: ControlPlane | None = None
    standin: StandinProcess | None = None
    scenario: Scenario | None = None
    nodes: list[str] = field(default_factory=list)

    def node_name(self, suffix: str) -> str:
        node = f"{self.ns}-{suffix}"
        self.nodes.append(node)
        return node

    def forget(self, kind: str, name: str) -> None:
        """Delete this cluster-scoped object when the test ends (the real server's
        objects outlive the test; the stand-in's go with its process)."""
        if self.scenario is not None:
            self.scenario.cluster_objects.append((kind, name))

    def control(self, path: str, body: Any = None) -> Any:
        """The stand-in's control API."""
        assert self.standin is not None
        req = urllib.request.Request(self.standin.url + path,
                                     data=json.dumps(body or {}).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def make_everything_too_old(self) -> None:
        """Every resourceVersion (and continue token) handed out so far is too old:
        on kube-apiserver, etcd compacted and the server restarted (its new watch cache
        starts at the current revision; a continue token's revision is gone from etcd);
        on the stand-in, its histories and paging snapshots forgotten."""
        if self.cp is not None:
            self.cp.compact_etcd()
            self.cp.restart_apiserver()
        else:
            self.control("/_standin/compact")


_admin_configs: dict[int, Path] = {}


@pytest.fixture(params=["standin", "real"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    name = request.node.originalname.removeprefix("test_").replace("_", "-").lower()
    if request.param == "real":
        cp: ControlPlane = request.getfixturevalue("control_plane")
        if id(cp) not in _admin_configs:
            _admin_configs[id(cp)] = cp.kubeconfig_for_cert(
                "standin-agrees", "standin-agrees-admin", "system:masters")
        scenario = Scenario(cp, name)
        s = Server("real", _admin_configs[id(cp)], scenario.ns, cp=cp, scenario=scenario)
        try:
            yield s
        finally:
            scenario.nodes += s.nodes
            scenario.close()
        return
    standin: StandinProcess = request.getfixturevalue("standin_process")
    ns = f"{name[:40].rstrip('-')}-{next(_ids)}"
    s = Server("standin", standin.kubeconfig, ns, standin=standin)
    req = urllib.request.Request(
        standin.url + "/api/v1/namespaces", method="POST",
        data=json.dumps({"metadata": {"name": ns}}).encode(),
        headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()
    yield s


@pytest.fixture
async def kube(server: Server) -> AsyncIterator[KubeClient]:
    async with KubeClient.connect(server.kubeconfig) as client:
        yield client


# -- helpers -----------------------------------------------------------------------------------


def pod(name: str, *, limits: dict[str, Any] | None = None, node: str | None = None,
        labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/cuda:12"}
    if limits is not None:
        container["resources"] = {"limits": limits}
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "labels": labels or {}},
                            "spec": {"containers": [container], **spec}}
    if node:
        body["spec"]["nodeName"] = node
    return body


async def create(kube: KubeClient, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    return await kube.request("POST", PODS.collection_path(ns), body=body)


async def get(kube: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return await kube.request("GET", PODS.object_path(name, ns))


async def refusal(call: Any) -> errors.ApiError:
    """The ApiError that awaiting ``call`` raises (vgpud's mapping of the answer)."""
    try:
        await call
    except errors.ApiError as e:
        return e
    raise AssertionError("the server accepted it")


async def raw(kube: KubeClient, method: str, path: str, body: Any = None,
              content_type: str | None = None) -> tuple[int, dict[str, Any]]:
    """Status and body as the server wrote them (no error mapping)."""
    response = await kube._raw(method, path, query=None, body=body,
                               content_type=content_type, limit=30)
    try:
        data = await response.read()
    finally:
        response.release()
    return response.status, json.loads(data) if data else {}


async def watch_until(kube: KubeClient, resource_version: str, selector: Selector,
                      last: str, *, resource: Any = PODS, within: float = 30) -> list[WatchEvent]:
    """The events of a watch from ``resource_version``, bookmarks left out, up to and
    including the first about the object named ``last`` (a marker written after
    everything the test looks for: what comes before it has all arrived)."""
    seen: list[WatchEvent] = []
    with anyio.fail_after(within):
        async with open_watch(kube, resource, resource_version, selector,
                              timeout_seconds=int(within) + 5) as stream:
            async for event in stream:
                if event.type == "BOOKMARK":
                    continue
                seen.append(event)
                if event.object["metadata"]["name"] == last:
                    return seen
    raise AssertionError(f"the watch ended before {last}: {[(e.type, e.object) for e in seen]}")


def brief(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.type, e.object["metadata"]["name"]) for e in events]


# -- create: what the server fills in ----------------------------------------------------------


async def test_a_created_pod_carries_the_servers_defaults(server: Server,
                                                          kube: KubeClient) -> None:
    manifest = pod("gpu", limits=dict(GPU))
    got = await create(kube, server.ns, manifest)
    meta, spec = got["metadata"], got["spec"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert re.fullmatch(r"[0-9]+", meta["resourceVersion"])
    assert got["status"]["phase"] == "Pending"
    assert {k: spec[k] for k in ("restartPolicy", "terminationGracePeriodSeconds", "dnsPolicy",
                                 "schedulerName", "securityContext", "enableServiceLinks")} == {
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
        "securityContext": {}, "enableServiceLinks": True}
    (c,) = spec["containers"]
    assert (c["imagePullPolicy"], c["terminationMessagePath"], c["terminationMessagePolicy"]) == (
        "IfNotPresent", "/dev/termination-log", "File")
    # requests copied from limits, every quantity in canonical form
    canonical = {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "3k",
                 "nvidia.com/vgpu-cores": "30", "cpu": "1", "memory": "1Gi"}
    assert c["resources"] == {"limits": canonical, "requests": canonical}
    # vgpud reads the stored pod as it read the manifest
    stored, asked = parse_pod(got, Defaults()), parse_pod(manifest, Defaults())
    assert stored.containers == asked.containers and stored.containers[0].memory == 3000
    assert await get(kube, server.ns, "gpu") == got


@pytest.mark.parametrize(("written", "stored"), [
    ("3000", "3k"), ("1000m", "1"), ("1024Mi", "1Gi"), ("1536Mi", "1536Mi"), ("0.5", "500m"),
    ("1.5", "1500m"), ("100", "100"), ("0", "0"), ("5e3", "5e3"), ("1E3", "1E3"),
    ("2000Ki", "2000Ki"), ("0.5Gi", "512Mi"), ("1.0Gi", "1Gi"), ("0.0001", "1m"),
    ("1500u", "2m"), ("1000000", "1M"), ("64000m", "64"), ("1048576Ki", "1Gi"),
    ("3000e-3", "3"), ("+5", "+5"), ("05", "05"), ("0.000001Mi", "1049m"), ("1000E", "1"),
    (4000, "4k"), (0.5, "500m"), (1e-05, "1e-3"), (3000.0, "3k"),
])
async def test_quantities_are_stored_in_canonical_form(server: Server, kube: KubeClient,
                                                       written: Any, stored: str) -> None:
    got = await create(kube, server.ns, pod("q", limits={"cpu": written, "memory": written}))
    resources = got["spec"]["containers"][0]["resources"]
    assert resources["limits"] == resources["requests"] == {"cpu": stored, "memory": stored}


@pytest.mark.parametrize(("limits", "status", "message"), ids=[
    "not-a-quantity", "no-such-suffix", "extended-not-whole"], argvalues=[
    ({"cpu": "abc"}, 400, 'Pod in version "v1" cannot be handled as a Pod: quantities must '
     "match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
    ({"cpu": "1e"}, 400, 'Pod in version "v1" cannot be handled as a Pod: unable to parse '
     "quantity's suffix"),
    ({"nvidia.com/vgpu-number": "1.5"}, 422, 'Pod "bad" is invalid: ['
     'spec.containers[0].resources.limits[nvidia.com/vgpu-number]: Invalid value: "1500m": '
     "must be an integer, spec.containers[0].resources.requests[nvidia.com/vgpu-number]: "
     'Invalid value: "1500m": must be an integer]'),
])
async def test_a_quantity_the_server_cannot_store_is_refused(
        server: Server, kube: KubeClient, limits: dict[str, str], status: int,
        message: str) -> None:
    e = await refusal(create(kube, server.ns, pod("bad", limits=limits)))
    assert (e.status, e.message) == (status, message)


async def test_extended_resources_need_a_limit_equal_to_the_request(
        server: Server, kube: KubeClient) -> None:
    only_request = pod("a")
    only_request["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/vgpu-number": "1"}}
    e = await refusal(create(kube, server.ns, only_request))
    assert (e.status, e.reason, e.message) == (
        422, "Invalid", 'Pod "a" is invalid: spec.containers[0].resources.limits: Required '
        "value: Limit must be set for non overcommitable resources")
    unequal = pod("b")
    unequal["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/vgpu-number": "1"}, "limits": {"nvidia.com/vgpu-number": "2"}}
    e = await refusal(create(kube, server.ns, unequal))
    assert e.message == ('Pod "b" is invalid: spec.containers[0].resources.requests: Invalid '
                         'value: "1": must be equal to nvidia.com/vgpu-number limit of 2')
    assert e.details["causes"] == [{"reason": "FieldValueInvalid",
                                    "message": 'Invalid value: "1": must be equal to '
                                               "nvidia.com/vgpu-number limit of 2",
                                    "field": "spec.containers[0].resources.requests"}]


async def test_names_generate_name_and_already_exists(server: Server, kube: KubeClient) -> None:
    made = await create(kube, server.ns, {**pod(""), "metadata": {"generateName": "gpu-"}})
    assert re.fullmatch(r"gpu-[bcdfghjklmnpqrstvwxz2456789]{5}", made["metadata"]["name"])
    assert made["metadata"]["generateName"] == "gpu-"
    long = await create(kube, server.ns, {**pod(""), "metadata": {"generateName": "a" * 70}})
    assert re.fullmatch("a" * 58 + "[bcdfghjklmnpqrstvwxz2456789]{5}", long["metadata"]["name"])
    await create(kube, server.ns, pod("twice"))
    e = await refusal(create(kube, server.ns, pod("twice")))
    assert isinstance(e, errors.AlreadyExists)
    assert (e.status, e.reason, e.message, dict(e.details)) == (
        409, "AlreadyExists", 'pods "twice" already exists', {"name": "twice", "kind": "pods"})
    e = await refusal(create(kube, server.ns, pod("Not_A_Name")))
    assert (e.status, e.reason, e.message) == (
        422, "Invalid", f'Pod "Not_A_Name" is invalid: metadata.name: Invalid value: '
        f'"Not_A_Name": {SUBDOMAIN}')
    e = await refusal(create(kube, server.ns, {**pod(""), "metadata": {}}))
    assert e.message == ('Pod "" is invalid: metadata.name: Required value: name or '
                         "generateName is required")
    e = await refusal(create(kube, server.ns, {**pod("none"), "spec": {}}))
    assert e.message == 'Pod "none" is invalid: spec.containers: Required value'


# -- nodes: what the device plugin writes -------------------------------------------------------


async def test_node_annotation_and_capacity_as_the_plugin_writes_them(
        server: Server, kube: KubeClient) -> None:
    node = server.node_name("n1")
    await kube.request("POST", NODES.collection_path(), body={
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    cluster = KubeCluster(kube)
    await cluster.set_node_annotation(node, "vgpud.io/node-devices", "inventory")
    assert await cluster.node_annotation(node, "vgpud.io/node-devices") == "inventory"
    await cluster.set_node_resources(node, {"nvidia.com/vgpu-memory": "32000",
                                            "nvidia.com/vgpu-cores": "200"})
    status = (await kube.request("GET", NODES.object_path(node)))["status"]
    # canonical, and allocatable defaulted to capacity where the node had none
    assert status["capacity"] == {"nvidia.com/vgpu-cores": "200",
                                  "nvidia.com/vgpu-memory": "32k"}
    assert status["allocatable"] == status["capacity"]
    # ... only then: once allocatable exists, it is the kubelet's to change
    await cluster.set_node_resources(node, {"nvidia.com/vgpu-memory": "65020"})
    status = (await kube.request("GET", NODES.object_path(node)))["status"]
    assert status["capacity"]["nvidia.com/vgpu-memory"] == "65020"
    assert status["allocatable"]["nvidia.com/vgpu-memory"] == "32k"
    assert parse_quantity(status["allocatable"]["nvidia.com/vgpu-memory"], "x") == 32000
    # the main resource ignores status; the status subresource takes metadata too
    patched = await kube.request("PATCH", NODES.object_path(node), body={
        "metadata": {"labels": {"a": "b"}}, "status": {"capacity": {"x.io/y": "1"}}},
        content_type=MERGE)
    assert patched["metadata"]["labels"]["a"] == "b" and "x.io/y" not in patched["status"][
        "capacity"]
    patched = await kube.request("PATCH", NODES.object_path(node) + "/status", body={
        "metadata": {"labels": {"c": "d"}}, "spec": {"unschedulable": True}}, content_type=MERGE)
    assert patched["metadata"]["labels"] == {"a": "b", "c": "d"}
    assert not patched.get("spec", {}).get("unschedulable")
    e = await refusal(cluster.set_node_resources(node, {"nvidia.com/vgpu-memory": "0.5"}))
    assert (e.status, e.message) == (422, f'Node "{node}" is invalid: '
                                     'status.capacity.nvidia.com/vgpu-memory: Invalid value: '
                                     '"500m": must be an integer')


# -- lists --------------------------------------------------------------------------------------


async def test_paged_lists_are_one_consistent_snapshot_in_key_order(
        server: Server, kube: KubeClient) -> None:
    for name in ("p3", "p1", "p6", "p0", "p5", "p2", "p4"):
        await create(kube, server.ns, pod(name))
    pages, first = [], True
    async for page in list_pages(kube, PODS, Selector(server.ns), page_size=3):
        pages.append(page)
        if first:  # not part of the snapshot being paged
            await create(kube, server.ns, pod("p9"))
            first = False
    assert [[p["metadata"]["name"] for p in page.items] for page in pages] == [
        ["p0", "p1", "p2"], ["p3", "p4", "p5"], ["p6"]]
    assert len({page.resource_version for page in pages}) == 1
    assert int(pages[0].resource_version) >= max(
        int(p["metadata"]["resourceVersion"]) for page in pages for p in page.items)
    body = await kube.request("GET", PODS.collection_path(server.ns), query={"limit": "3"})
    assert body["kind"] == "PodList" and body["metadata"]["remainingItemCount"] == 5
    assert body["metadata"]["continue"]
    whole = await kube.request("GET", PODS.collection_path(server.ns))
    assert "continue" not in whole["metadata"] and len(whole["items"]) == 8
    e = await refusal(kube.request("GET", PODS.collection_path(server.ns),
                                   query={"limit": "3", "continue": "garbage"}))
    assert (e.status, e.reason) == (400, "BadRequest") and e.message.startswith(
        "invalid continue token")


SELECTIONS: list[tuple[dict[str, str], list[str] | str]] = [
    ({"fieldSelector": "spec.nodeName="}, ["free", "running"]),
    ({"fieldSelector": "spec.nodeName={node}"}, ["bound"]),
    ({"fieldSelector": "spec.nodeName!={node}"}, ["free", "running"]),
    ({"fieldSelector": "status.phase=Running"}, ["running"]),
    ({"fieldSelector": "metadata.name=free,status.phase=Pending"}, ["free"]),
    ({"fieldSelector": "spec.schedulerName=vgpu-scheduler"}, ["bound"]),
    ({"fieldSelector": "spec.hostNetwork=false"}, ["bound", "free", "running"]),
    ({"fieldSelector": "spec.restartPolicy=Always"}, ["bound", "free", "running"]),
    ({"labelSelector": "tier in (gpu)"}, ["bound", "running"]),
    ({"labelSelector": "tier notin (gpu),tier"}, ["free"]),
    ({"labelSelector": "!tier"}, []),
    ({"labelSelector": "rank>1"}, ["running"]),
    ({"labelSelector": "rank<2,tier=gpu"}, ["bound"]),
    ({"fieldSelector": "spec.bogus=x"}, "field label not supported: spec.bogus"),
    ({"fieldSelector": "spec.nodeName"},
     "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"),
]


@pytest.mark.parametrize(("query", "expected"), SELECTIONS,
                         ids=[next(iter(q.values())) for q, _ in SELECTIONS])
async def test_pod_field_and_label_selectors(server: Server, kube: KubeClient,
                                             query: dict[str, str],
                                             expected: list[str] | str) -> None:
    node = server.node_name("n1")
    await create(kube, server.ns, pod("bound", node=node, schedulerName="vgpu-scheduler",
                                      labels={"tier": "gpu", "rank": "1"}))
    await create(kube, server.ns, pod("free", labels={"tier": "cpu"}))
    await create(kube, server.ns, pod("running", labels={"tier": "gpu", "rank": "2"}))
    await kube.request("PATCH", PODS.object_path("running", server.ns) + "/status",
                       body={"status": {"phase": "Running"}}, content_type=MERGE)
    query = {k: v.format(node=node) for k, v in query.items()}
    listing = kube.request("GET", PODS.collection_path(server.ns), query=query)
    if isinstance(expected, str):
        e = await refusal(listing)
        assert (e.status, e.reason, e.message) == (400, "BadRequest", expected)
        return
    assert [p["metadata"]["name"] for p in (await listing)["items"]] == expected


async def test_the_plugins_pods_on_node_and_node_and_event_selectors(
        server: Server, kube: KubeClient) -> None:
    node, other = server.node_name("n1"), server.node_name("n2")
    await create(kube, server.ns, pod("here", node=node))
    await create(kube, server.ns, pod("there", node=other))
    views = await KubeCluster(kube).pods_on_node(node)
    assert [(v.namespace, v.name, v.node_name) for v in views] == [(server.ns, "here", node)]
    # the plugin's watch of its node's pods (vgpud/node/pods.py) holds what that LIST returns
    watched = NodePods.of(KubeCluster(kube), node)
    async with anyio.create_task_group() as tg:
        await tg.start(watched.run)
        assert list(watched.all()) == [(v.namespace, v.name) for v in views]
        tg.cancel_scope.cancel()
    await kube.request("POST", NODES.collection_path(), body={"metadata": {"name": node}})
    nodes = await kube.request("GET", NODES.collection_path(), query={
        "fieldSelector": f"metadata.name={node},spec.unschedulable=false"})
    assert [n["metadata"]["name"] for n in nodes["items"]] == [node]
    e = await refusal(kube.request("GET", NODES.collection_path(),
                                   query={"fieldSelector": "metadata.namespace="}))
    assert e.message == "field label not supported: metadata.namespace"
    here = await get(kube, server.ns, "here")
    recorder = EventRecorder(kube, component="vgpud-scheduler")
    await recorder.record(ObjectRef.of(here), "Bound", "bound here")
    await recorder.record(ObjectRef(kind="Node", name=node), "Inventory", "published")
    assert recorder.created == 2 and recorder.failed == 0
    for selector, names in [
            (f"involvedObject.name=here,involvedObject.uid={here['metadata']['uid']}", ["here"]),
            ("involvedObject.kind=Pod,reason=Bound,type=Normal", ["here"]),
            ("source=vgpud-scheduler,reportingComponent=vgpud-scheduler", ["here"])]:
        got = await kube.request("GET", EVENTS.collection_path(server.ns),
                                 query={"fieldSelector": selector})
        assert [e["involvedObject"]["name"] for e in got["items"]] == names, selector
    # an Event about a cluster-scoped object goes to "default", without a namespace
    got = await kube.request("GET", EVENTS.collection_path("default"),
                             query={"fieldSelector": f"involvedObject.name={node}"})
    assert [(e["involvedObject"].get("namespace"), e["reason"]) for e in got["items"]] == [
        (None, "Inventory")]
    e = await refusal(kube.request("GET", EVENTS.collection_path(server.ns),
                                   query={"fieldSelector": "count=1"}))
    assert e.message == "field label not supported: count"


# -- watches ------------------------------------------------------------------------------------


async def test_a_watch_from_a_lists_resource_version_sees_each_change_in_order(
        server: Server, kube: KubeClient) -> None:
    node = server.node_name("n1")
    await create(kube, server.ns, pod("old", labels={"watched": "yes"}))
    rv = (await kube.request("GET", PODS.collection_path(server.ns)))["metadata"][
        "resourceVersion"]
    await create(kube, server.ns, pod("new", labels={"watched": "yes"}))
    await kube.request("PATCH", PODS.object_path("old", server.ns), body={
        "metadata": {"labels": {"watched": "no"}}}, content_type=MERGE)
    await PodBinder(kube).bind(server.ns, "new", node)
    await kube.request("DELETE", PODS.object_path("old", server.ns))  # unbound: at once
    await create(kube, server.ns, pod("marker", node=node, labels={"watched": "yes"}))
    everything = await watch_until(kube, rv, Selector(server.ns), "marker")
    assert brief(everything) == [("ADDED", "new"), ("MODIFIED", "old"), ("MODIFIED", "new"),
                                 ("MODIFIED", "old"), ("DELETED", "old"), ("ADDED", "marker")]
    versions = [int(e.resource_version) for e in everything]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert int(versions[0]) > int(rv)
    deleting, deleted = everything[3].object, everything[4].object
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 0
    assert deleted["metadata"]["deletionTimestamp"] == deleting["metadata"]["deletionTimestamp"]
    # a selected watch: an object that stops matching is DELETED, one that starts, ADDED
    labelled = await watch_until(kube, rv, Selector(server.ns, labels="watched=yes"), "marker")
    assert brief(labelled) == [("ADDED", "new"), ("DELETED", "old"), ("MODIFIED", "new"),
                               ("ADDED", "marker")]
    on_node = await watch_until(kube, rv, Selector(server.ns, fields=f"spec.nodeName={node}"),
                                "marker")
    assert brief(on_node) == [("ADDED", "new"), ("ADDED", "marker")]


async def test_a_watch_or_a_continue_from_too_long_ago_is_gone(server: Server,
                                                               kube: KubeClient) -> None:
    for name in ("a", "b", "c"):
        await create(kube, server.ns, pod(name))
    listed = await kube.request("GET", PODS.collection_path(server.ns), query={"limit": "1"})
    rv, token = listed["metadata"]["resourceVersion"], listed["metadata"]["continue"]
    await kube.request("PATCH", PODS.object_path("a", server.ns),
                       body={"metadata": {"labels": {"x": "1"}}}, content_type=MERGE)
    server.make_everything_too_old()
    # the watch: 200, and a single ERROR event carrying the 410
    query = {"resourceVersion": rv, "watch": "true", "timeoutSeconds": "10",
             "allowWatchBookmarks": "true"}
    async with kube.watch_lines(PODS.collection_path(server.ns), query=query,
                                max_seconds=30) as lines:
        got = [json.loads(line) async for line in lines]
    assert [e["type"] for e in got] == ["ERROR"]
    status = got[0]["object"]
    assert {k: status[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
        "code": 410}
    assert re.fullmatch(rf"too old resource version: {rv} \([0-9]+\)", status["message"])
    with pytest.raises(errors.Gone):  # vgpud: re-list
        async with open_watch(kube, PODS, rv, Selector(server.ns), timeout_seconds=10) as s:
            async for _ in s:
                pass
    if server.standin is not None:
        # An HTTP 410 to the watch request itself (kube-apiserver answers as above; a
        # proxy or an older server may not) is the same Gone to vgpud. Only a fault rule
        # makes one here.
        server.control("/_standin/faults", {"verb": "watch", "resource": "pods",
                                            "status": 410, "times": 1})
        with pytest.raises(errors.Gone):
            async with open_watch(kube, PODS, rv, Selector(server.ns), timeout_seconds=10):
                pass
    # the continue token: an HTTP 410
    e = await refusal(kube.request("GET", PODS.collection_path(server.ns),
                                   query={"limit": "1", "continue": token}))
    assert isinstance(e, errors.Gone)
    assert (e.status, e.reason) == (410, "Expired")
    assert e.message.startswith(
        "The provided continue parameter is too old to display a consistent list result. You "
        "can start a new list without the continue parameter")


# -- writes -------------------------------------------------------------------------------------


async def test_pod_patches_with_a_resource_version_precondition(
        server: Server, kube: KubeClient) -> None:
    created = await create(kube, server.ns, pod("p"))
    stale = created["metadata"]["resourceVersion"]
    await kube.request("PATCH", PODS.object_path("p", server.ns),
                       body={"metadata": {"labels": {"touched": "yes"}}}, content_type=MERGE)
    path = PODS.object_path("p", server.ns)
    for body, ctype in [
            ({"metadata": {"resourceVersion": stale, "annotations": {"a": "b"}}}, MERGE),
            ({"metadata": {"resourceVersion": stale, "annotations": {"a": "b"}}}, STRATEGIC),
            ([{"op": "replace", "path": "/metadata/resourceVersion", "value": stale},
              {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}], JSON_PATCH)]:
        e = await refusal(kube.request("PATCH", path, body=body, content_type=ctype))
        assert isinstance(e, errors.Conflict) and not isinstance(e, errors.AlreadyExists)
        assert (e.reason, e.message, dict(e.details)) == (
            "Conflict", f'Operation cannot be fulfilled on pods "p": {MODIFIED_MESSAGE}',
            {"name": "p", "kind": "pods"}), ctype
    current = await get(kube, server.ns, "p")
    current["metadata"]["resourceVersion"] = stale
    e = await refusal(kube.request("PUT", path, body=current))
    assert isinstance(e, errors.Conflict) and e.message.endswith(MODIFIED_MESSAGE)
    # a JSON patch whose test fails: 422, and the reason is lost on the way
    e = await refusal(kube.request("PATCH", path, body=[
        {"op": "test", "path": "/metadata/name", "value": "other"}], content_type=JSON_PATCH))
    assert isinstance(e, errors.Invalid)
    assert (e.status, e.reason, e.message, dict(e.details)) == (422, "Invalid", REJECTED, {})
    status, body = await raw(kube, "PATCH", path, [{"op": "remove", "path": "/nothing/x"}],
                             JSON_PATCH)
    assert (status, body) == (422, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Failure", "message": REJECTED,
                                    "reason": "Invalid", "details": {}, "code": 422})
    # the main resource ignores status; the status subresource takes metadata, not spec
    patched = await kube.request("PATCH", path, body={"status": {"phase": "Running"}},
                                 content_type=MERGE)
    assert patched["status"]["phase"] == "Pending"
    patched = await kube.request("PATCH", path + "/status", body={
        "status": {"phase": "Running"}, "metadata": {"labels": {"via": "status"}},
        "spec": {"schedulerName": "other"}}, content_type=MERGE)
    assert patched["status"]["phase"] == "Running" and patched["metadata"]["labels"] == {
        "touched": "yes", "via": "status"}
    assert patched["spec"]["schedulerName"] == "default-scheduler"


async def test_the_device_plugins_annotation_patch(server: Server, kube: KubeClient) -> None:
    """``PodWriter.patch_annotations``: a merge patch preconditioned on the
    resourceVersion; on 409 it re-reads and writes again while the pod still fits."""
    created = await create(kube, server.ns, pod("p"))
    stale = created["metadata"]["resourceVersion"]
    await kube.request("PATCH", PODS.object_path("p", server.ns),
                       body={"metadata": {"labels": {"touched": "yes"}}}, content_type=MERGE)
    writer = PodWriter(kube, retry=RetryPolicy(attempts=2, jitter=0))
    got = await writer.patch_annotations(server.ns, "p", {"vgpud.io/assignment": "v1"},
                                         resource_version=stale,
                                         uid=created["metadata"]["uid"])
    assert got["metadata"]["annotations"] == {"vgpud.io/assignment": "v1"}
    assert got["metadata"]["labels"] == {"touched": "yes"}
    removed = await writer.patch_annotations(server.ns, "p", {"vgpud.io/assignment": None},
                                             resource_version=got["metadata"]["resourceVersion"])
    assert not removed["metadata"].get("annotations")
    e = await refusal(writer.patch_annotations(server.ns, "p", {"a": "b"},
                                               resource_version=stale, uid="another-uid"))
    assert isinstance(e, errors.Conflict) and "was replaced" in e.message
    e = await refusal(writer.patch_annotations(server.ns, "gone", {"a": "b"},
                                               resource_version="1"))
    assert isinstance(e, errors.NotFound) and e.message == 'pods "gone" not found'


async def test_binding(server: Server, kube: KubeClient) -> None:
    node = server.node_name("n1")
    created = await create(kube, server.ns, {
        **pod("p"), "metadata": {"name": "p", "annotations": {"keep": "me", "over": "old"}}})
    rv = created["metadata"]["resourceVersion"]
    await PodBinder(kube).bind(server.ns, "p", node, uid=created["metadata"]["uid"],
                               annotations={"over": "new", "vgpud.io/assignment": "a"})
    await create(kube, server.ns, pod("marker"))
    events = await watch_until(kube, rv, Selector(server.ns), "marker")
    assert brief(events) == [("MODIFIED", "p"), ("ADDED", "marker")]  # one update
    bound = events[0].object
    assert bound["spec"]["nodeName"] == node
    assert bound["metadata"]["annotations"] == {"keep": "me", "over": "new",
                                                "vgpud.io/assignment": "a"}
    (scheduled,) = bound["status"]["conditions"]
    assert {k: scheduled[k] for k in ("type", "status", "lastProbeTime")} == {
        "type": "PodScheduled", "status": "True", "lastProbeTime": None}

    def binding(name: str, target: str | None = node, **meta: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Binding",
                                "metadata": {"name": name, **meta}}
        if target is not None:
            body["target"] = {"apiVersion": "v1", "kind": "Node", "name": target}
        return body

    path = PODS.collection_path(server.ns) + "/{}/binding"
    await create(kube, server.ns, pod("q"))
    status, body = await raw(kube, "POST", path.format("q"), binding("q"))
    assert (status, body) == (201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "code": 201})
    # already bound, to that node or another: 409 on pods/binding
    for target in (node, "elsewhere"):
        e = await refusal(kube.request("POST", path.format("q"), body=binding("q", target)))
        assert isinstance(e, errors.Conflict)
        assert (e.message, dict(e.details)) == (
            f'Operation cannot be fulfilled on pods/binding "q": pod q is already assigned '
            f'to node "{node}"', {"name": "q", "kind": "pods/binding"})
    e = await refusal(kube.request("POST", path.format("missing"), body=binding("missing")))
    assert isinstance(e, errors.NotFound) and e.message == 'pods "missing" not found'
    await create(kube, server.ns, pod("r"))
    for wrong in (binding("s"), binding(""), {"target": {"name": node}}):
        e = await refusal(kube.request("POST", path.format("r"), body=wrong))
        assert (e.status, e.reason, e.message) == (
            400, "BadRequest", "name in URL does not match name in Binding object")
    e = await refusal(kube.request("POST", path.format("r"), body=binding("r", uid="other")))
    assert isinstance(e, errors.Conflict) and e.message.startswith(
        'Operation cannot be fulfilled on pods "r": StorageError: invalid object, Code: 4, '
        f"Key: /registry/pods/{server.ns}/r, ResourceVersion: 0, AdditionalErrorMsg: "
        "Precondition failed: UID in precondition: other, UID in object meta: ")
    e = await refusal(kube.request("POST", path.format("r"), body=binding("r", target=None)))
    assert (e.status, e.reason, e.message) == (500, "", "target.name: Required value")
    assert isinstance(e, errors.ServerError)  # vgpud would retry it: it never sends one
    assert "nodeName" not in (await get(kube, server.ns, "r"))["spec"]
    # a pod being deleted (a finalizer keeps the unbound pod) is not bound
    await create(kube, server.ns, {**pod("held"), "metadata": {
        "name": "held", "finalizers": ["example.com/hold"]}})
    await kube.request("DELETE", PODS.object_path("held", server.ns))
    e = await refusal(PodBinder(kube).bind(server.ns, "held", node))
    assert isinstance(e, errors.Conflict) and e.message == (
        'Operation cannot be fulfilled on pods/binding "held": pod held is being deleted, '
        "cannot be assigned to a host")
    await kube.request("PATCH", PODS.object_path("held", server.ns),
                       body={"metadata": {"finalizers": None}}, content_type=MERGE)
    assert isinstance(await refusal(get(kube, server.ns, "held")), errors.NotFound)


async def test_events_are_created_and_their_count_patched(server: Server,
                                                          kube: KubeClient) -> None:
    target = await create(kube, server.ns, pod("p"))
    clock = JumpClock(wall=dt.datetime(2026, 1, 2, 3, 3, 45, tzinfo=dt.UTC))  # +20 s: 03:04:05
    recorder = EventRecorder(kube, clock=clock, min_interval=10)
    ref = ObjectRef.of(target)
    await recorder.record(ref, "Rescheduled", "first", type="Warning")
    clock.advance(20)
    await recorder.record(ref, "Rescheduled", "first", type="Warning")  # 20 s on: written
    assert (recorder.created, recorder.updated, recorder.failed) == (1, 1, 0)
    (event,) = (await kube.request("GET", EVENTS.collection_path(server.ns)))["items"]
    assert event["count"] == 2 and event["lastTimestamp"] == "2026-01-02T03:04:05Z"
    assert event["involvedObject"] == {"kind": "Pod", "namespace": server.ns, "name": "p",
                                       "uid": target["metadata"]["uid"], "apiVersion": "v1"}
    assert event["source"] == {"component": "vgpud"} and event["type"] == "Warning"
    # the Event expired on the server: the next count patch finds it gone
    await kube.request("DELETE", EVENTS.object_path(event["metadata"]["name"], server.ns))
    clock.advance(20)
    await recorder.record(ref, "Rescheduled", "first", type="Warning")
    assert (recorder.updated, recorder.failed) == (1, 0)
    clock.advance(20)
    await recorder.record(ref, "Rescheduled", "first", type="Warning")  # a new one
    assert recorder.created == 2
    # an Event's namespace must be its object's
    wrong = {**event, "metadata": {"name": "wrong"},
             "involvedObject": {**event["involvedObject"], "namespace": "default"}}
    e = await refusal(kube.request("POST", EVENTS.collection_path(server.ns), body=wrong))
    assert (e.status, e.message) == (422, 'Event "wrong" is invalid: involvedObject.namespace: '
                                     'Invalid value: "default": does not match event.namespace')


async def test_deletion_of_bound_and_unbound_pods(server: Server, kube: KubeClient) -> None:
    """No kubelet here: a bound pod deleted with a grace period stays, being deleted."""
    node = server.node_name("n1")
    start = (await create(kube, server.ns, pod("unbound")))["metadata"]["resourceVersion"]
    gone = await kube.request("DELETE", PODS.object_path("unbound", server.ns))
    assert gone["kind"] == "Pod" and gone["metadata"]["deletionGracePeriodSeconds"] == 0
    assert isinstance(await refusal(get(kube, server.ns, "unbound")), errors.NotFound)
    bound = await create(kube, server.ns, pod("bound", node=node))
    # the rescheduler's delete: DeleteOptions with a uid precondition
    options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "other"}}
    e = await refusal(kube.request("DELETE", PODS.object_path("bound", server.ns),
                                   body=options))
    assert isinstance(e, errors.Conflict)
    assert (e.message, dict(e.details)) == (
        'Operation cannot be fulfilled on Pod "bound": the UID in the precondition (other) '
        f"does not match the UID in record ({bound['metadata']['uid']}). The object might "
        "have been deleted and then recreated", {"name": "bound", "kind": "Pod"})
    options["preconditions"] = {"uid": bound["metadata"]["uid"]}
    deleting = await kube.request("DELETE", PODS.object_path("bound", server.ns), body=options)
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 30
    assert await get(kube, server.ns, "bound") == deleting  # it stays, being deleted
    assert project_pod(deleting).deleting
    again = await kube.request("DELETE", PODS.object_path("bound", server.ns))
    assert again == deleting  # no sooner: nothing changes
    sooner = await kube.request("DELETE", PODS.object_path("bound", server.ns),
                                body={"gracePeriodSeconds": 5})
    assert sooner["metadata"]["deletionGracePeriodSeconds"] == 5
    await kube.request("DELETE", PODS.object_path("bound", server.ns),
                       body={"gracePeriodSeconds": 0})
    assert isinstance(await refusal(get(kube, server.ns, "bound")), errors.NotFound)
    # a pod done running goes at once
    await create(kube, server.ns, pod("done", node=node))
    await kube.request("PATCH", PODS.object_path("done", server.ns) + "/status",
                       body={"status": {"phase": "Succeeded"}}, content_type=MERGE)
    await kube.request("DELETE", PODS.object_path("done", server.ns))
    await create(kube, server.ns, pod("marker"))
    events = await watch_until(kube, start, Selector(server.ns), "marker")
    assert brief(events) == [
        ("MODIFIED", "unbound"), ("DELETED", "unbound"), ("ADDED", "bound"),
        ("MODIFIED", "bound"), ("MODIFIED", "bound"), ("MODIFIED", "bound"),
        ("DELETED", "bound"), ("ADDED", "done"), ("MODIFIED", "done"), ("MODIFIED", "done"),
        ("DELETED", "done"), ("ADDED", "marker")]
    # other kinds answer a Status
    status, body = await raw(kube, "DELETE", EVENTS.object_path("nothing", server.ns))
    assert status == 404
    lease = await kube.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{server.ns}"
                               "/leases", body={"metadata": {"name": "l"}, "spec": {}})
    status, body = await raw(kube, "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/"
                             f"{server.ns}/leases/l")
    assert (status, body) == (200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success", "details": {
                                        "name": "l", "group": "coordination.k8s.io",
                                        "kind": "leases", "uid": lease["metadata"]["uid"]}})


async def test_the_rescheduler_recreates_a_pod_from_the_servers_copy(
        server: Server, kube: KubeClient) -> None:
    node = server.node_name("n1")
    await create(kube, server.ns, pod("bare", limits=dict(GPU), node=node))
    served = await get(kube, server.ns, "bare")
    plan = replacement(served, project_pod(served), "a GPU went away", max_attempts=3)
    assert isinstance(plan, Copy)
    copy = await create(kube, server.ns, plan.body)
    assert copy["metadata"]["name"] == "bare-r1" and not copy["spec"].get("nodeName")
    assert parse_pod(copy, Defaults()).containers == parse_pod(served, Defaults()).containers


async def test_error_bodies(server: Server, kube: KubeClient) -> None:
    status, body = await raw(kube, "GET", PODS.object_path("missing", server.ns))
    assert (status, body) == (404, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'pods "missing" not found', "reason": "NotFound",
        "details": {"name": "missing", "kind": "pods"}, "code": 404})
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{server.ns}/leases"
    e = await refusal(kube.request("GET", leases + "/missing"))
    assert isinstance(e, errors.NotFound)
    assert (e.message, dict(e.details)) == (
        'leases.coordination.k8s.io "missing" not found',
        {"name": "missing", "group": "coordination.k8s.io", "kind": "leases"})
    await kube.request("POST", leases, body={"metadata": {"name": "l"}, "spec": {}})
    e = await refusal(kube.request("POST", leases, body={"metadata": {"name": "l"}, "spec": {}}))
    assert isinstance(e, errors.AlreadyExists)
    assert e.message == 'leases.coordination.k8s.io "l" already exists'
    status, body = await raw(kube, "POST", PODS.collection_path(server.ns),
                             {"metadata": {"name": "c"}, "spec": {}})
    assert status == 422 and body["details"] == {
        "name": "c", "kind": "Pod", "causes": [{"reason": "FieldValueRequired",
                                               "message": "Required value",
                                               "field": "spec.containers"}]}
    # 403: a ServiceAccount without RBAC on the real server, a fault rule on the stand-in
    path = PODS.object_path("p", server.ns)
    if server.cp is not None:
        assert server.scenario is not None
        forbidden = server.cp.as_service_account(server.ns, "default")
        with pytest.raises(ApiError) as refused:
            forbidden.request("GET", path)
        code = refused.value.code
        assert isinstance(refused.value.body, dict)
        body = refused.value.body
        expected = (f'pods "p" is forbidden: User "system:serviceaccount:{server.ns}:default" '
                    f'cannot get resource "pods" in API group "" in the namespace '
                    f'"{server.ns}"')
    else:
        server.control("/_standin/faults", {"verb": "get", "resource": "pods", "status": 403,
                                            "times": 1, "message": "refused by a rule"})
        code, body = await raw(kube, "GET", path)
        expected = "refused by a rule"
    assert (code, body) == (403, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Failure", "message": expected,
                                  "reason": "Forbidden", "details": {"name": "p", "kind": "pods"},
                                  "code": 403})
    mapped = errors.error_for_status(code, body)
    assert isinstance(mapped, errors.Forbidden) and mapped.message == expected


async def test_leader_election_lease(server: Server, kube: KubeClient) -> None:
    clock = ManualClock(wall=dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC))
    elector = LeaderElector(kube, name="vgpu-scheduler", namespace=server.ns, identity="a",
                            clock=clock)
    assert await elector.try_acquire_or_renew()  # created
    assert await elector.try_acquire_or_renew()  # renewed: a PUT with the resourceVersion
    path = f"/apis/coordination.k8s.io/v1/namespaces/{server.ns}/leases/vgpu-scheduler"
    lease = await kube.request("GET", path)
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["renewTime"] == "2026-01-02T03:04:05.678901Z"
    stale = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "1"}}
    e = await refusal(kube.request("PUT", path, body=stale))
    assert isinstance(e, errors.Conflict) and (e.message, dict(e.details)) == (
        f'Operation cannot be fulfilled on leases.coordination.k8s.io "vgpu-scheduler": '
        f"{MODIFIED_MESSAGE}",
        {"name": "vgpu-scheduler", "group": "coordination.k8s.io", "kind": "leases"})
    unconditional = {**lease, "metadata": {"name": "vgpu-scheduler"}}
    e = await refusal(kube.request("PUT", path, body=unconditional))
    assert (e.status, e.message) == (
        422, 'leases.coordination.k8s.io "vgpu-scheduler" is invalid: metadata.resourceVersion: '
        "Invalid value: 0: must be specified for an update")
    seconds = {**lease, "spec": {**lease["spec"], "renewTime": "2026-01-02T03:04:05Z"}}
    e = await refusal(kube.request("PUT", path, body=seconds))
    assert (e.status, e.reason) == (400, "BadRequest") and e.message.startswith(
        'Lease in version "v1" cannot be handled as a Lease: parsing time '
        '"2026-01-02T03:04:05Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse ')


async def test_the_webhooks_secret_and_ca_bundle(server: Server, kube: KubeClient,
                                                 tmp_path: Path) -> None:
    """``Bootstrap``: the Secret created, then replaced with its resourceVersion once due;
    ``caBundle`` set by a JSON patch whose ``test`` guards the webhook's index."""
    conf = f"{server.ns}-hooks"
    server.forget("MutatingWebhookConfiguration", conf)
    server.forget("ValidatingWebhookConfiguration", conf)
    group = "/apis/admissionregistration.k8s.io/v1"
    hook = {"clientConfig": {"url": "https://127.0.0.1:1/x"}, "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore"}
    for plural, kind in (("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
                         ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration")):
        await kube.request("POST", f"{group}/{plural}", body={
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": conf},
            "webhooks": [{"name": "a.vgpud.io", **hook}, {"name": "b.vgpud.io", **hook}]})
    now = dt.datetime.now(dt.UTC)
    boot = Bootstrap(kube, server.ns, "vgpud-webhook-tls", ["vgpud-webhook.svc"],
                     tmp_path / "tls.crt", tmp_path / "tls.key", conf, clock=ManualClock(wall=now))
    ca, _serving = await boot.ensure_secret()  # created
    assert await boot.ensure_secret() == (ca, _serving)  # read back, still good
    later = Bootstrap(kube, server.ns, "vgpud-webhook-tls", ["vgpud-webhook.svc"],
                      tmp_path / "tls.crt", tmp_path / "tls.key", conf,
                      clock=ManualClock(wall=now + dt.timedelta(days=3000)))
    renewed_ca, renewed = await later.ensure_secret()  # replaced, resourceVersion and all
    assert renewed != _serving
    secret = await kube.request("GET", f"/api/v1/namespaces/{server.ns}/secrets/"
                                "vgpud-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert sorted(secret["data"]) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert await later.patch_ca_bundle(renewed_ca) == 4
    assert await later.patch_ca_bundle(renewed_ca) == 0
    got = await kube.request("GET", f"{group}/mutatingwebhookconfigurations/{conf}")
    assert {h["clientConfig"]["caBundle"] for h in got["webhooks"]} == {
        secret["data"]["ca.crt"]}
    # the guard: a webhook moved since the read fails the test op, and nothing changes
    e = await refusal(kube.request(
        "PATCH", f"{group}/mutatingwebhookconfigurations/{conf}", content_type=JSON_PATCH,
        body=[{"op": "test", "path": "/webhooks/0/name", "value": "b.vgpud.io"},
              {"op": "add", "path": "/webhooks/0/clientConfig/caBundle",
               "value": issue_ca(now).cert.hex()}]))
    assert isinstance(e, errors.Invalid) and e.message == REJECTED
