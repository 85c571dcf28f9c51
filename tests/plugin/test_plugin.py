"""The plugin end to end against the fake kubelet (grpcio) and the API stand-in."""

from __future__ import annotations

import json

import aiohttp
import anyio
import pytest

from tests.fakekubelet import AdmitError, FakePod
from tests.fakekubelet.kubelet import mount_of
from tests.plugin.harness import (
    NODE,
    VGPU,
    kubelet_picks_a_full_gpu,
    node_harness,
    placement,
    pod_manifest,
    uuid_of,
    wait_for,
    write_devices,
)
from vgpud.core.codec import (
    NODE_DEVICES,
    decode_assignment,
    decode_node_devices,
    encode_assignment,
)
from vgpud.core.limits import limits_for, render
from vgpud.core.model import ComputePolicy, DeviceGrant
from vgpud.node.allocations import AllocationStore

pytestmark = pytest.mark.anyio


def config_of(h, ids) -> str:  # type: ignore[no-untyped-def]
    return (AllocationStore(h.state_dir).path(ids) / "etc" / "config").read_text()


async def test_list_and_watch_replicas_topology_and_health_recovery() -> None:
    async with node_harness(4) as h:
        # the default preset: nvidia.com/vgpu-number alone, on the socket it always had
        assert h.kubelet.registered() == {"nvidia.com/vgpu-number"}
        assert [r.endpoint for r in h.kubelet.registrations] == ["vgpud-vgpu-number.sock"]
        devs = h.kubelet.devices()
        assert sorted(devs) == sorted(f"{uuid_of(g)}::{i}" for g in range(4) for i in range(10))
        assert set(devs.values()) == {"Healthy"}
        topo = h.kubelet.topology()
        assert topo[f"{uuid_of(3)}::7"] == [1] and topo[f"{uuid_of(2)}::0"] == [0]
        # GPU 2 fails, then recovers: kubelet sees both transitions
        write_devices(h.devices_file, 4, healthy={2: False})
        await wait_for(lambda: h.kubelet.devices()[f"{uuid_of(2)}::0"] == "Unhealthy")
        assert [d for d, s in h.kubelet.devices().items() if s == "Unhealthy"] == [
            f"{uuid_of(2)}::{i}" for i in range(10)]
        inv = await h.published_inventory()
        await wait_for(lambda: not decode_node_devices(
            h.api.get("nodes", NODE, "")["metadata"]["annotations"][NODE_DEVICES]
        ).devices[2].healthy)
        write_devices(h.devices_file, 4)
        await wait_for(lambda: set(h.kubelet.devices().values()) == {"Healthy"})
        assert inv.devices[0].split == 10


async def test_node_annotation_overrides_and_feature_gates() -> None:
    settings = {"nodeConfigs": [{"name": NODE, "deviceSplitCount": 4,
                                 "deviceMemoryScaling": 2.0}],
                "plugin": {"featureGates": {"CorePlugin": True, "MemoryPlugin": True}}}
    async with node_harness(2, settings=settings) as h:
        assert len(h.kubelet.devices()) == 8

        def node():  # type: ignore[no-untyped-def]
            return h.api.get("nodes", NODE, "")

        inv = await h.published_inventory()
        assert [g.split for g in inv.devices] == [4, 4] and inv.memory_scaling == 2.0
        assert [g.uuid for g in inv.devices] == [uuid_of(0), uuid_of(1)]
        await wait_for(lambda: "nvidia.com/vgpu-memory" in (node()["status"].get("capacity")
                                                             or {}))
        cap = node()["status"]["capacity"]
        assert cap["nvidia.com/vgpu-cores"] == "200"
        assert cap["nvidia.com/vgpu-memory"] == str(2 * 2 * 24576)
        # only written when it changes: a quiet period causes no further node patches
        patches = h.api.count("patch", "nodes")
        await anyio.sleep(0.3)
        assert h.api.count("patch", "nodes") == patches


async def test_the_gates_node_resources_follow_renamed_names() -> None:
    """resourceNames moves the vgpu-manager preset's names: the number the plugin
    registers and the memory and cores the gates publish as node capacity alike."""
    settings = {"resourceNames": {"vgpu-manager": {"domain": "corp.example"}},
                "plugin": {"featureGates": {"CorePlugin": True, "MemoryPlugin": True}}}
    async with node_harness(2, settings=settings, resources=["corp.example/vgpu-number"]) as h:
        assert h.kubelet.registered() == {"corp.example/vgpu-number"}
        await h.published_inventory()

        def capacity() -> dict[str, str]:
            return dict(h.api.get("nodes", NODE, "")["status"].get("capacity") or {})

        await wait_for(lambda: "corp.example/vgpu-memory" in capacity())
        cap = capacity()
        assert (cap["corp.example/vgpu-cores"], cap["corp.example/vgpu-memory"]) == (
            "200", str(2 * 24576))
        assert not {"nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory"} & set(cap)


async def test_allocate_and_prestart_write_the_assigned_limits() -> None:
    async with node_harness(4) as h:
        p = placement({"main": [(1, 3000, 30)]})
        h.add_pod("p1", {"main": 1}, p)
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]))
        ids = a.ids["main"]
        assert [i.split("::")[0] for i in ids] == [uuid_of(1)]  # steered by the preference
        r = a.responses["main"]
        assert r.envs["NVIDIA_VISIBLE_DEVICES"] == uuid_of(1)
        etc = mount_of(r, "/etc/vgpud")
        assert etc.read_only and etc.host_path.endswith("/etc")
        state = mount_of(r, "/var/run/vgpud")
        assert not state.read_only
        arbiter = mount_of(r, "/var/run/vgpud-arbiter")  # the node's priority records
        assert arbiter.read_only and arbiter.host_path.endswith("/arbiter")
        # no limit travels by env: the pod's own env would override it (kubelet applies
        # the pod's env after the plugin's); the shim reads /etc/vgpud only
        assert not [k for k in r.envs if k.startswith("VGPUD_")]
        inv = await h.published_inventory()
        want = render(limits_for(p.containers[0], inv, compute_policy=ComputePolicy.FIXED,
                                 priority=0, state_dir="/var/run/vgpud",
                                 register="/etc/vgpud/register.sock",
                                 arbiter_dir="/var/run/vgpud-arbiter"))
        assert config_of(h, ids) == want
        assert "device.0.memory_limit=3145728000" in want
        # idempotent: kubelet repeats both calls (a container restart) → same result
        await h.kubelet_call(h.kubelet.start, a)
        assert config_of(h, ids) == want


async def test_kubelet_choice_reconciled_when_the_gpu_has_room() -> None:
    async with node_harness(4) as h:
        h.add_pod("p1", {"main": 1}, placement({"main": [(0, 4000, 20)]}))

        def other_gpu(name, free, preferred, n):  # type: ignore[no-untyped-def]
            return [f"{uuid_of(3)}::5"]

        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]),
                                 other_gpu)
        got = decode_assignment(h.assignment("p1"))
        assert [d.uuid for d in got.containers[0].devices] == [uuid_of(3)]
        assert got.containers[0].devices[0].memory == 4000
        assert f"device.0.uuid={uuid_of(3)}" in config_of(h, a.ids["main"])
        events = [e for e in h.api.objects("events") if e["reason"] == "VgpuReassigned"]
        assert len(events) == 1


async def test_kubelet_choice_fails_clearly_when_the_gpu_is_full() -> None:
    async with node_harness(2) as h:
        refused = await kubelet_picks_a_full_gpu(h)
        assert refused.phase == "PreStartContainer"
        assert "FAILED_PRECONDITION" in str(refused.code)
        assert uuid_of(1) in refused.message and "MiB free" in refused.message
        assert decode_assignment(h.assignment("p1")).containers[0].devices[0].uuid == uuid_of(0)
        assert any(ev["reason"] == "VgpuAllocationFailed" for ev in h.api.objects("events"))


async def test_malformed_assignment_fails_only_that_container() -> None:
    async with node_harness(2) as h:
        h.add_pod("bad", {"main": 1}, '{"v": 1, "node": "gpu-node-1", "containers": [{"na')
        h.add_pod("good", {"main": 1}, placement({"main": [(0, 1000, 10)]}))
        with pytest.raises(AdmitError) as e:
            await h.kubelet_call(h.kubelet.run, FakePod("default", "bad", [("main", 1)]))
        assert "malformed assignment" in e.value.message and "default/bad" in e.value.message
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "good", [("main", 1)]))
        assert "device.0.memory_limit=1048576000" in config_of(h, a.ids["main"])
        h.add_pod("none", {"main": 1}, None)
        with pytest.raises(AdmitError, match=r"has no vgpud\.io/assignment"):
            await h.kubelet_call(h.kubelet.run, FakePod("default", "none", [("main", 1)]))


async def test_a_pod_that_bypassed_the_scheduler_gets_no_limits() -> None:
    """Issue 23, finding 1: a GPU pod naming another scheduler, bound by its own
    ``nodeName`` with its own assignment (1,024 MiB asked, the whole GPU written), was
    configured as the annotation said. It now gets no limits file, PreStartContainer
    fails with the reason, and an event says why; nor does what it claims count against
    the pods vgpud placed."""
    async with node_harness(2) as h:
        forged = placement({"main": [(0, 24000, 100)]})
        obj = h.add_pod("forged", {"main": 1}, forged)
        h.api.patch("pods", "forged", {"spec": {"schedulerName": "default-scheduler"}},
                    "default")
        assert obj
        with pytest.raises(AdmitError) as e:
            await h.kubelet_call(h.kubelet.run, FakePod("default", "forged", [("main", 1)]))
        assert e.value.phase == "PreStartContainer"
        assert "not vgpud's 'vgpu-scheduler'" in e.value.message, e.value.message
        assert not list(AllocationStore(h.state_dir).configured())
        events = [ev for ev in h.api.objects("events") if ev["reason"] == "VgpuAllocationFailed"]
        assert events and "default-scheduler" in events[0]["message"]
        # a pod vgpud placed, moved by kubelet onto the GPU the forged pod claims whole,
        # is reassigned there: the forged claim holds nothing
        h.add_pod("p1", {"main": 1}, placement({"main": [(1, 4000, 20)]}))

        def onto_claimed(name, free, preferred, n):  # type: ignore[no-untyped-def]
            return [f"{uuid_of(0)}::3"]

        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]),
                                 onto_claimed)
        assert a.ids["main"]
        assert decode_assignment(h.assignment("p1")).containers[0].devices[0].uuid == uuid_of(0)


async def test_a_grant_beyond_the_pods_request_is_not_believed() -> None:
    """Issue 23, finding 1: a pod of vgpud's scheduler asking 1,024 MiB and 10 % whose
    assignment grants 24,000 MiB and the whole GPU (forged where no admission policy
    guards the annotation) was configured as the annotation said. A grant beyond what
    the pod asks is refused, with the reason, and no limits file is written."""
    async with node_harness(2) as h:
        asks = {"main": {VGPU: 1, "nvidia.com/vgpu-memory": 1024, "nvidia.com/vgpu-cores": 10}}
        whole = encode_assignment(placement({"main": [(0, 24000, 100)]}))
        h.api.create("pods", pod_manifest("greedy", asks, whole), "default")
        with pytest.raises(AdmitError) as e:
            await h.kubelet_call(h.kubelet.run, FakePod("default", "greedy", [("main", 1)]))
        assert "asks for at most 1024 MiB" in e.value.message, e.value.message
        assert not list(AllocationStore(h.state_dir).configured())
        # within the request, it is configured
        fair = encode_assignment(placement({"main": [(1, 1024, 10)]}))
        h.api.create("pods", pod_manifest("fair", asks, fair), "default")
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "fair", [("main", 1)]))
        assert "device.0.memory_limit=1073741824" in config_of(h, a.ids["main"])


async def test_the_nodes_compute_policy_applies_to_pods_that_name_none() -> None:
    """Issue 24, item 3 (seed 000's "Compute Policy"): a node's
    nvidia.com/vgpu-compute-policy is the policy of its pods that name none; a pod's
    own wins."""
    async with node_harness(2) as h:
        h.api.patch("nodes", NODE, {"metadata": {"annotations": {
            "nvidia.com/vgpu-compute-policy": "balance"}}}, "")
        h.add_pod("plain", {"main": 1}, placement({"main": [(0, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "plain", [("main", 1)]))
        assert "device.0.core_policy=balance" in config_of(h, a.ids["main"])
        own = h.add_pod("own", {"main": 1}, placement({"main": [(1, 1000, 10)]}))
        h.api.patch("pods", "own", {"metadata": {"annotations": {
            "nvidia.com/vgpu-compute-policy": "fixed"}}}, "default")
        assert own
        b = await h.kubelet_call(h.kubelet.run, FakePod("default", "own", [("main", 1)]))
        assert "device.0.core_policy=fixed" in config_of(h, b.ids["main"])


async def test_gpu_topology_off_publishes_no_links() -> None:
    """Issue 24, item 3: with the GPUTopology gate off the node's NVLink pairs are not
    published (on, the default, they are)."""
    linked = [{"uuid": uuid_of(i), "index": i, "model": "NVIDIA Fake 24GB", "memory": 24576,
               "numa": 0, "links": [uuid_of(1 - i)], "healthy": True, "mig": False}
              for i in range(2)]
    async with node_harness(devices=linked) as h:
        assert [g.links for g in (await h.published_inventory()).devices] == [
            (uuid_of(1),), (uuid_of(0),)]
    async with node_harness(devices=linked, settings={
            "plugin": {"featureGates": {"GPUTopology": False}}}) as h:
        assert [g.links for g in (await h.published_inventory()).devices] == [(), ()]


async def test_kubelet_restart_reregisters() -> None:
    async with node_harness(2) as h:
        h.add_pod("p1", {"main": 1}, placement({"main": [(0, 1000, 10)]}))
        await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]))
        await h.kubelet_call(h.kubelet.restart)
        await h.kubelet_call(h.kubelet.wait_registered, 2)
        assert len(h.kubelet.registrations) == 2
        assert len(h.kubelet.devices()) == 20
        h.add_pod("p2", {"main": 1}, placement({"main": [(1, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p2", [("main", 1)]))
        assert f"device.0.uuid={uuid_of(1)}" in config_of(h, a.ids["main"])


async def test_a_plugin_serving_its_socket_anew_ends_the_old_stream_first() -> None:
    """Its socket deleted under the same kubelet, the plugin serves it anew and registers
    again. kubelet 1.37 refuses a registration on a socket it still has connected
    ("device plugin already connected"), and grpclib's ``Server.close()`` alone left
    kubelet's ListAndWatch stream open: the plugin failed with RegistrationError (and
    the real kubelet, having refused, would never notice the old connection end)."""
    async with node_harness(2) as h:
        assert h.running is not None
        sock = h.running.socket
        assert h.kubelet.plugin_socket() == str(sock)
        sock.unlink()
        await h.kubelet_call(h.kubelet.wait_registered, 2)
        assert h.kubelet.plugin_socket() == str(sock) and len(h.kubelet.registrations) == 2
        h.add_pod("p1", {"main": 1}, placement({"main": [(1, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]))
        assert f"device.0.uuid={uuid_of(1)}" in config_of(h, a.ids["main"])


async def test_a_socket_the_new_kubelet_removed_is_served_again_before_registering() -> None:
    """kubelet restarts in two steps: the old one goes (kubelet.sock with it), the plugin
    serves its socket anew, then the new kubelet removes every socket in the directory
    (CleanupPluginDirectory) and listens. Registering the removed socket fails: kubelet
    cannot dial it ("failed to dial device plugin", after 10 s). The plugin registered it
    anyway, and then stopped on kubelet's refusal (a full test run under load once hit
    this window in the one-step restart)."""
    async with node_harness(2) as h:
        assert h.running is not None
        sock = h.running.socket
        def made() -> tuple[int, int] | None:  # the inode number alone may be reused
            try:
                st = sock.stat()
            except FileNotFoundError:
                return None
            return st.st_ino, st.st_ctime_ns

        first = made()
        await h.kubelet_call(h.kubelet.go_down)
        # the plugin notices kubelet.sock gone and serves its socket anew
        await wait_for(lambda: made() not in (None, first), 10)
        await h.kubelet_call(h.kubelet.come_up)
        await h.kubelet_call(h.kubelet.wait_registered, 2, 30)
        assert h.kubelet.plugin_socket() == str(sock) and sock.exists()
        h.add_pod("p1", {"main": 1}, placement({"main": [(1, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]))
        assert f"device.0.uuid={uuid_of(1)}" in config_of(h, a.ids["main"])


async def test_plugin_restart_keeps_files_and_state() -> None:
    async with node_harness(2) as h:
        h.add_pod("p1", {"main": 1}, placement({"main": [(0, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]))
        cfg = AllocationStore(h.state_dir).path(a.ids["main"]) / "etc" / "config"
        before = (cfg.read_text(), cfg.stat().st_mtime_ns, cfg.stat().st_ino)
        marker = cfg.parent.parent / "state" / "usage"
        marker.write_text("shim state")
        await h.stop_plugin()
        assert (cfg.read_text(), cfg.stat().st_mtime_ns, cfg.stat().st_ino) == before
        running = await h.start_plugin()
        await h.kubelet_call(h.kubelet.wait_registered, 2)
        assert (cfg.read_text(), cfg.stat().st_mtime_ns, cfg.stat().st_ino) == before
        assert marker.read_text() == "shim state"
        assert [(g.owner.pod, g.devices) for g in running.service.store.configured()
                if g.owner is not None] == [("p1", (DeviceGrant(uuid_of(0), 1000, 10),))]
        async with aiohttp.ClientSession() as s, s.get(
                f"http://127.0.0.1:{running.metrics_port}/metrics") as r:
            text = await r.text()
        assert (f'vgpud_container_memory_limit_bytes{{container="main",namespace="default",'
                f'node="{NODE}",pod="p1",uuid="{uuid_of(0)}"}} 1.048576e+09') in text
        assert f'vgpud_gpu_containers{{index="0",model="NVIDIA Fake 24GB",node="{NODE}",' \
               f'uuid="{uuid_of(0)}"}} 1.0' in text
        h.add_pod("p2", {"main": 1}, placement({"main": [(1, 2000, 10)]}))
        b = await h.kubelet_call(h.kubelet.run, FakePod("default", "p2", [("main", 1)]))
        assert f"device.0.uuid={uuid_of(1)}" in config_of(h, b.ids["main"])


@pytest.mark.parametrize("mode", ["cdi", "device-specs"])
async def test_visible_devices_modes(mode: str) -> None:
    async with node_harness(2, settings={"plugin": {"visibleDevices": mode}}) as h:
        h.add_pod("p1", {"main": 2}, placement({"main": [(0, 1000, 10), (1, 1000, 10)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 2)]))
        r = a.responses["main"]
        assert "NVIDIA_VISIBLE_DEVICES" not in r.envs
        if mode == "cdi":
            assert [c.name for c in r.cdi_devices] == [f"nvidia.com/gpu={uuid_of(0)}",
                                                       f"nvidia.com/gpu={uuid_of(1)}"]
        else:
            assert [d.host_path for d in r.devices][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
            assert "/dev/nvidiactl" in [d.host_path for d in r.devices]


async def test_multi_container_pod_each_gets_its_own_limits() -> None:
    async with node_harness(4) as h:
        p = placement({"a": [(0, 1000, 10)], "b": [(0, 2000, 20), (2, 3000, 30)]})
        h.add_pod("p1", {"a": 1, "b": 2}, p)
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("a", 1), ("b", 2)]))
        assert "device.0.memory_limit=1048576000" in config_of(h, a.ids["a"])
        text = config_of(h, a.ids["b"])
        assert f"device.0.uuid={uuid_of(0)}" in text and f"device.1.uuid={uuid_of(2)}" in text
        assert "device.1.memory_limit=3145728000" in text
        rec = json.loads((AllocationStore(h.state_dir).path(a.ids["b"]) / "record.json")
                         .read_text())
        assert rec["owner"]["container"] == "b"
