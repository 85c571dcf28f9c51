"""A real kubelet on the real control plane, with a recording fake container runtime, and
``vgpud plugin`` beside it as the chart's DaemonSet runs it.

:class:`Kubelet` runs ``vgpud-fake-cri`` (k8s.io/cri-client's fake: sandboxes and
containers are bookkeeping, nothing runs; every CreateContainer request is appended to a
file) and the kubelet binary, with a KubeletConfiguration for this host and a client
certificate of ``system:node:<name>`` (group ``system:nodes``), so the Node authorizer and
NodeRestriction judge it as a real node.

What the host asks of a kubelet, and how it is met without touching the host:

- **The device-plugin directory is fixed**: ``/var/lib/kubelet/device-plugins/kubelet.sock``
  whatever ``--root-dir`` says (``pluginapi.KubeletSocket``, used by
  ``devicemanager.NewManagerImpl``), and container logs go to ``/var/log/containers``
  (``kubelet.ContainerLogsDir``, not configurable). The kubelet therefore runs in a mount
  namespace of its own (``unshare --mount``) where the kubelet's private ``var/lib`` and
  ``var/log`` directories are bind-mounted over ``/var/lib`` and ``/var/log``;
  ``--root-dir`` is the private ``var/lib/kubelet``, so inside the namespace
  ``/var/lib/kubelet`` and ``--root-dir`` are one directory and every path the kubelet
  hands out (sockets, pod directories) is valid outside it too. Nothing is written to the
  host's ``/var/lib/kubelet`` (checked after every test).
- **Kernel tunables**: the container manager sets ``vm.overcommit_memory=1``,
  ``kernel.panic=10``, ``kernel.panic_on_oops=1``... (``setupKernelTunables``) unless
  ``protectKernelDefaults``, with which it refuses to start where they differ (they do
  here). Inside its namespace each of those ``/proc/sys`` files is a bind mount of a
  private file holding the value the kubelet wants: it reads its own value and writes
  nothing to the host's kernel.
- **cgroup v1** (this host): ``failCgroupV1: false`` and ``cgroupDriver: cgroupfs`` (no
  systemd); ``cgroupsPerQOS: false`` with ``enforceNodeAllocatable: []`` so the kubelet
  creates no ``kubepods`` cgroups on the host (nothing runs in them with a fake runtime).
- kind's settings for a kubelet that must not evict or collect images: eviction thresholds
  at 0 %, image GC at 100 %; ``failSwapOn: false``; no iptables chains; loopback-only
  serving on free ports, no anonymous access.

The node is registered by the kubelet itself. Its ``node.kubernetes.io/not-ready`` taint
(added by the TaintNodesByCondition admission plugin when the Node is created) is removed
once the kubelet reports Ready, as kube-controller-manager's node lifecycle controller
does; that controller does not run here.

:class:`NodePlugin` is ``vgpud plugin`` with the DaemonSet's arguments, the chart's
settings, the ``vgpud-plugin`` ServiceAccount's token, ``--fake-devices`` and the kubelet's
directories. :func:`recorded_container` turns one recorded CreateContainer request into a
real runc container (:mod:`tests.oci`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.oci.kubelet import Bind
from tests.oci.runtime import Container, Node
from tests.realkube.api import ApiError, Obj, wait_for
from tests.realkube.controlplane import ControlPlane, Proc, free_port
from tests.realkube.release import NAMESPACE, Release
from vgpud.core.codec import NODE_DEVICES

ROOT = Path(__file__).resolve().parents[2]
VGPU = "nvidia.com/vgpu-number"
NOT_READY = "node.kubernetes.io/not-ready"
# the values kubelet's setupKernelTunables insists on (k8s.io/component-helpers sysctl)
KERNEL_TUNABLES = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10,
                   "kernel/panic_on_oops": 1, "kernel/keys/root_maxkeys": 1000000,
                   "kernel/keys/root_maxbytes": 25000000}
# run in the kubelet's own mount namespace: $1 the private var/lib, $2 var/log, $3 the
# directory of tunables; then the kubelet's argv
NAMESPACE_SETUP = """set -e
mount --bind "$1" /var/lib
mount --bind "$2" /var/log
for t in {tunables}; do mount --bind "$3/$(echo "$t" | tr / .)" "/proc/sys/$t"; done
shift 3
exec "$@"
"""


def fake_gpu_uuid(i: int) -> str:
    """GPU ``i`` of the fake CUDA driver (tests/fakes/CONTRACT.md), so the limits file the
    plugin writes names the GPUs the shim finds under the fake driver."""
    return f"GPU-fa4ecda0-0000-4000-8000-{i:012x}"


def fake_devices(n: int, memory: int, unhealthy: Sequence[int] = ()) -> dict[str, Any]:
    """A ``--fake-devices`` document of ``n`` GPUs of ``memory`` MiB."""
    return {"devices": [{"uuid": fake_gpu_uuid(i), "index": i, "model": "NVIDIA Fake 24GB",
                         "memory": memory, "numa": 0, "links": [],
                         "healthy": i not in unhealthy, "mig": False} for i in range(n)]}


@dataclass
class Kubelet:
    """A kubelet and its fake runtime, registering Node ``name`` with ``labels``."""

    cp: ControlPlane
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    dir: Path = field(init=False)
    cri: Proc = field(init=False)
    proc: Proc = field(init=False)

    def __post_init__(self) -> None:
        # short: unix socket paths below it (plugin sockets, registration) must fit 108 bytes
        self.dir = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))
        self.root_dir.mkdir(parents=True)
        (self.dir / "var" / "log").mkdir(parents=True)
        tunables = self.dir / "tunables"
        tunables.mkdir()
        for name, value in KERNEL_TUNABLES.items():
            (tunables / name.replace("/", ".")).write_text(f"{value}\n")
        self.record = self.dir / "create-container.jsonl"
        self.record.touch()
        self.port, self.healthz_port = free_port(), free_port()
        bins = self.cp.bin_dir
        self.cri = Proc(f"fake-cri-{self.name}", [
            str(bins / "vgpud-fake-cri"), f"--listen=unix://{self.cri_socket}",
            f"--record={self.record}"], self.dir)
        config = self.dir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self.configuration()))
        kc = self.cp.kubeconfig_for_cert(f"kubelet-{self.name}", f"system:node:{self.name}",
                                         "system:nodes")
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        script = NAMESPACE_SETUP.format(tunables=" ".join(KERNEL_TUNABLES))
        self.proc = Proc(f"kubelet-{self.name}", [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "kubelet-ns",
            str(self.dir / "var" / "lib"), str(self.dir / "var" / "log"), str(tunables),
            str(bins / "kubelet"), f"--config={config}", f"--kubeconfig={kc}",
            f"--root-dir={self.root_dir}", f"--hostname-override={self.name}",
            *([f"--node-labels={labels}"] if labels else []),
            "--v=4"], self.dir)

    # -- where things are -----------------------------------------------------------------

    @property
    def root_dir(self) -> Path:
        return self.dir / "var" / "lib" / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        """``/var/lib/kubelet/device-plugins`` in the kubelet's mount namespace."""
        return self.root_dir / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def cri_socket(self) -> Path:
        return self.dir / "cri.sock"

    def configuration(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.cri_socket}",
            "address": "127.0.0.1", "port": self.port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "failCgroupV1": False, "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failSwapOn": False, "makeIPTablesUtilChains": False, "resolvConf": "",
            "evictionHard": {"memory.available": "0%", "nodefs.available": "0%",
                             "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            # allocatable and conditions reach the API within a second or two
            "nodeStatusUpdateFrequency": "1s", "nodeStatusReportFrequency": "1m",
            "syncFrequency": "10s",
        }

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> Kubelet:
        if not self.cri.alive():
            self.cri.start()

            def serving() -> bool:
                self.cri.check_alive()
                return self.cri_socket.exists()
            wait_for("the fake CRI socket", serving, timeout=30, detail=self.tails)
        self.proc.start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120) -> Obj:
        """Until the kubelet's Node is Ready (then without the not-ready taint)."""
        def ready() -> Obj | None:
            self.proc.check_alive()
            node = self.cp.admin.find("Node", self.name)
            if node is None:
                return None
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            return node if conditions.get("Ready") == "True" else None
        node: Obj = wait_for(f"node {self.name} to be Ready", ready, timeout=timeout,
                             detail=self.tails)
        taints = node["spec"].get("taints") or []
        kept = [t for t in taints if t["key"] != NOT_READY]
        if kept != taints:  # the node lifecycle controller's part
            node = self.cp.admin.patch("Node", self.name, {"spec": {"taints": kept or None}})
        return node

    def stop(self) -> None:
        self.proc.stop()

    def restart(self) -> None:
        self.proc.stop()
        self.proc.start()
        self.wait_ready()

    def close(self) -> None:
        """Stop both processes and remove the Node, its Lease and the directory."""
        self.proc.stop()
        self.cri.stop()
        self.cp.admin.delete("Node", self.name)
        self.cp.admin.delete("Lease", self.name, "kube-node-lease")
        with contextlib.suppress(ApiError):  # the kubelet's CSINode
            self.cp.admin.request("DELETE", f"/apis/storage.k8s.io/v1/csinodes/{self.name}")
        shutil.rmtree(self.dir, ignore_errors=True)

    def tails(self) -> str:
        return "\n".join(p.tail(40) for p in (self.proc, self.cri))

    # -- what it did -----------------------------------------------------------------------

    def node(self) -> Obj:
        return self.cp.admin.get("Node", self.name)

    def allocatable(self, resource: str = VGPU) -> str | None:
        got: str | None = self.node()["status"].get("allocatable", {}).get(resource)
        return got

    def capacity(self, resource: str = VGPU) -> str | None:
        got: str | None = self.node()["status"].get("capacity", {}).get(resource)
        return got

    def wait_allocatable(self, value: str, resource: str = VGPU, timeout: float = 60,
                         detail: Any = None) -> Obj:
        def reached() -> Obj | None:
            self.proc.check_alive()
            node = self.node()
            return node if node["status"].get("allocatable", {}).get(resource) == value \
                else None
        got: Obj = wait_for(f"node {self.name} allocatable {resource} = {value}", reached,
                            timeout=timeout, detail=detail or self.tails)
        return got

    def created(self) -> list[Obj]:
        """Every CreateContainer request the runtime received, oldest first."""
        return [json.loads(line) for line in self.record.read_text().splitlines()
                if line.strip()]

    def created_for(self, pod_uid: str, container: str) -> list[Obj]:
        return [r for r in self.created()
                if r["sandbox_config"]["metadata"]["uid"] == pod_uid
                and r["config"]["metadata"]["name"] == container]

    def log(self) -> str:
        return self.proc.log_path.read_text(errors="replace")

    def end_container(self, request: Obj) -> None:
        """The container of a recorded CreateContainer request exits with status 0: the
        fake runtime's ``StopContainer`` marks it exited (exit code 0), and kubelet's PLEG
        sees it at its next relist (a regular init container has then completed)."""
        import grpc

        sandbox, config = request["sandbox_config"]["metadata"], request["config"]["metadata"]
        # cri-api's fake names them (BuildSandboxName, BuildContainerName)
        sandbox_id = (f"{sandbox['name']}_{sandbox['namespace']}_{sandbox['uid']}_"
                      f"{sandbox.get('attempt', 0)}")
        container_id = f"{sandbox_id}_{config['name']}_{config.get('attempt', 0)}".encode()
        # runtime.v1.StopContainerRequest{container_id: 1}, by hand: no CRI stubs here
        message = b"\x0a" + _varint(len(container_id)) + container_id
        with grpc.insecure_channel(f"unix://{self.cri_socket}") as channel:
            channel.unary_unary("/runtime.v1.RuntimeService/StopContainer")(message, timeout=10)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


@dataclass
class NodePlugin:
    """``vgpud plugin`` for ``kubelet``'s node, as the chart's DaemonSet runs it."""

    release: Release
    kubelet: Kubelet
    gpus: int = 2
    memory: int = 24576
    settings: Mapping[str, Any] = field(default_factory=dict)  # over the chart's plugin: ...
    config: Mapping[str, Any] = field(default_factory=dict)  # over the chart's top level
    proc: Proc = field(init=False)

    def __post_init__(self) -> None:
        d = self.kubelet.dir / "vgpud"
        d.mkdir()
        self.state_dir = d / "state"
        self.devices_file = d / "devices.json"
        self.write_devices()
        chart = {**self.release.settings(), **self.config}
        chart["plugin"] = {**chart["plugin"], "shimHostDir": str(d / "shim"),
                           **self.settings}
        chart["logLevel"] = "debug"  # the answers to GetPreferredAllocation are logged
        config = d / "vgpud.yaml"
        config.write_text(yaml.safe_dump(chart))
        self.metrics_port = free_port()
        spec = self.release.manifests.pod_spec("DaemonSet", "vgpud-plugin")
        (container,) = [c for c in spec["containers"] if c["name"] == "plugin"]
        args = [a for a in container["args"] if not a.startswith((
            "--config=", "--device-plugin-dir=", "--pod-resources-socket=", "--state-dir="))]
        assert args[0] == "plugin", args
        kc = self.release.cp.kubeconfig_for_service_account(NAMESPACE, spec["serviceAccountName"])
        libs = sorted((ROOT / "csrc" / "build").glob("libvgpu.so.*.*"))
        assert libs, "the shim is not built (make -C csrc)"
        self.proc = Proc(f"vgpud-plugin-{self.kubelet.name}", [
            sys.executable, "-m", "vgpud", *args, f"--config={config}", f"--kubeconfig={kc}",
            f"--device-plugin-dir={self.kubelet.device_plugin_dir}",
            f"--pod-resources-socket={self.kubelet.pod_resources_socket}",
            f"--state-dir={self.state_dir}", f"--fake-devices={self.devices_file}",
            f"--listen=127.0.0.1:{self.metrics_port}"], d,
            # NODE_NAME: the DaemonSet's fieldRef spec.nodeName
            env={"PYTHONPATH": str(ROOT), "VGPUD_LOG_FORMAT": "console",
                 "NODE_NAME": self.kubelet.name, "VGPUD_SHIM_LIBRARY": str(libs[-1])})

    def write_devices(self, unhealthy: Sequence[int] = ()) -> None:
        tmp = self.devices_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(fake_devices(self.gpus, self.memory, unhealthy)))
        tmp.replace(self.devices_file)

    def start(self, timeout: float = 90) -> NodePlugin:
        """Start, and wait until kubelet advertises every healthy vGPU and the node carries
        the inventory."""
        self.proc.start()
        self.wait_registered(timeout)
        return self

    def wait_registered(self, timeout: float = 90) -> Obj:
        split = int({**self.release.settings(), **self.config}["deviceSplitCount"])
        node = self.kubelet.wait_allocatable(str(self.gpus * split), timeout=timeout,
                                             detail=self.tails)
        wait_for(f"the inventory on node {self.kubelet.name}",
                 lambda: NODE_DEVICES in (self.kubelet.node()["metadata"].get("annotations")
                                          or {}), timeout=timeout, detail=self.tails)
        return node

    def stop(self) -> None:
        self.proc.stop()

    def log(self) -> str:
        return self.proc.log_path.read_text(errors="replace")

    def tails(self) -> str:
        return self.proc.tail(60) + "\n" + self.kubelet.tails()


# -- the recorded request, applied ------------------------------------------------------------


def cri_envs(request: Obj) -> dict[str, str]:
    """The envs of a recorded CreateContainer request. CRI 1.37's ``KeyValue.value`` is
    ``bytes`` (it was ``string``), which protojson writes in base64."""
    return {e["key"]: base64.b64decode(e.get("value", "")).decode()
            for e in request["config"].get("envs", [])}


def allocate_response_of(request: Obj) -> Any:
    """The container part of a recorded CreateContainer request (envs, mounts, devices, CDI
    names, annotations) as one ``ContainerAllocateResponse``: what kubelet composed from
    the plugin's response and the pod, already merged, for :meth:`tests.oci.Node.container`
    to apply as containerd would."""
    from vgpud.plugin._pb import v1beta1 as pb

    config = request["config"]
    r = pb.ContainerAllocateResponse()
    for k, v in cri_envs(request).items():
        r.envs[k] = v
    r.mounts.extend(pb.Mount(container_path=m["container_path"], host_path=m["host_path"],
                             read_only=bool(m.get("readonly"))) for m in config.get("mounts", []))
    r.devices.extend(pb.DeviceSpec(container_path=d["container_path"], host_path=d["host_path"],
                                   permissions=d.get("permissions", "rw"))
                     for d in config.get("devices", []))
    r.cdi_devices.extend(pb.CdiDevice(name=c["name"]) for c in config.get("CDI_devices", []))
    for k, v in (config.get("annotations") or {}).items():
        r.annotations[k] = v
    return r


def recorded_container(node: Node, request: Obj, args: Sequence[str], *, driver: Path,
                       extra_mounts: Sequence[Bind] = ()) -> Container:
    """A runc container from a recorded CreateContainer request: in the pod's cgroup (its
    UID from the sandbox config), with kubelet's envs, mounts, devices and CDI names, and
    the harness's stand-in for the NVIDIA container runtime: the fake driver at
    ``/opt/fakecuda`` and only the GPUs of ``NVIDIA_VISIBLE_DEVICES`` visible to it (as
    ``CUDA_VISIBLE_DEVICES``, which the fake driver honours)."""
    meta = request["sandbox_config"]["metadata"]
    resp = allocate_response_of(request)
    visible = resp.envs.get("NVIDIA_VISIBLE_DEVICES")
    image_env = {"CUDA_VISIBLE_DEVICES": visible} if visible and visible != "all" else {}
    return node.container(request["config"]["metadata"]["name"], args, allocate=resp,
                          pod_uid=meta["uid"], driver=driver, extra_mounts=extra_mounts,
                          image_env=image_env)
