"""Limits that hold in a real container, as deployed (issue 9).

The plugin, the fake kubelet and runc containers built from the plugin's Allocate
responses, exactly as kubelet applies them; the shim arrives through the read-only
/etc/ld.so.preload the plugin mounts. Nothing of the host's /proc is mounted into a
container and no pod is hostPID: the host PIDs NVML reports come from registration.
Every GPU context takes 300 MiB, as on a real GPU, and counts against the limit.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import anyio
import pytest

from tests.node.conftest import MIB, gpu_node, metric, placement
from tests.oci.runtime import Node

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("built")]
OOM = 2
INTERP = ["/opt/fakecuda/viaproc"]  # one op per stdin line, one JSON line back


def drv(*ops: str | int) -> list[str]:
    return ["/opt/progs/drv", "--via", "dlsym", *map(str, ops)]


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


async def test_two_pods_on_one_gpu_get_exact_slices(node: Node) -> None:
    async with gpu_node(node) as g:
        g.add_pod("a", placement({"main": [(0, 2048, 0)], "side": [(0, 1024, 0)]}))
        g.add_pod("b", placement({"main": [(0, 4096, 0)]}))
        pa = await g.admit("a", {"main": 1, "side": 1})
        pb = await g.admit("b", {"main": 1})
        main = g.container("a", "main", pa, INTERP)
        side = g.container("a", "side", pa, INTERP)
        other = g.container("b", "main", pb, INTERP)
        p1 = main.start(interactive=True)
        assert p1.ask_json("pid")["pid"] == 1  # its own PID namespace
        assert p1.ask_json("use 0")["rc"] == 0  # a context: 300 MiB
        assert p1.ask_json("alloc 0 1000m")["rc"] == 0
        info = p1.ask_json("info")
        assert (info["total"], info["free"]) == (2048 * MIB, (2048 - 300 - 1000) * MIB)
        # a second process of the same container: its context counts too, the limit is
        # the container's, exact to the byte
        p2 = main.spawn(INTERP, interactive=True)
        assert p2.ask_json("use 0")["rc"] == 0
        assert p2.ask_json("alloc 0 448m")["rc"] == 0
        assert p2.ask_json("alloc 0 1")["rc"] == OOM
        assert p1.ask_json("alloc 0 1")["rc"] == OOM
        # the other container of the pod and the other pod: their own slices
        s = side.start(interactive=True)
        assert s.ask_json("use 0")["rc"] == 0
        assert s.ask_json("alloc 0 724m")["rc"] == 0
        assert s.ask_json("alloc 0 1")["rc"] == OOM
        o = other.start(interactive=True)
        assert o.ask_json("use 0")["rc"] == 0
        assert o.ask_json("alloc 0 3796m")["rc"] == 0
        assert o.ask_json("alloc 0 1")["rc"] == OOM
        # NVML inside, as nvidia-smi reads it: the slice, and only this container's
        # processes under their own PIDs
        seen = lines(main.exec(drv("nvml")).check().stdout)[-1]
        assert (seen["total"], seen["used"]) == (2048 * MIB, 2048 * MIB)
        assert sorted(pid for pid, _ in seen["procs"]) == sorted([1, p2.ask_json("pid")["pid"]])
        assert sorted(mem for _, mem in seen["procs"]) == sorted([1300 * MIB, 748 * MIB])
        seen = lines(other.exec(drv("nvml")).check().stdout)[-1]
        assert (seen["total"], seen["used"]) == (4096 * MIB, 4096 * MIB)
        assert [pid for pid, _ in seen["procs"]] == [1]
        # the plugin's view: every process that touched CUDA registered (the four above,
        # and the two nvml readers), every slice as the shim counts it
        text = await g.metrics()
        assert metric(text, "vgpud_container_process_registrations_total", result="accepted") == 6
        assert metric(text, "vgpud_container_process_registrations_total", result="refused") == 0
        for pod, container, used in (("a", "main", 2048), ("a", "side", 1024),
                                     ("b", "main", 4096)):
            assert metric(text, "vgpud_container_memory_used_bytes", pod=pod,
                          container=container) == used * MIB


async def _until(predicate: Any, seconds: float = 15.0) -> None:
    """Poll a condition another process reaches (the plugin's watchdog, a container)."""
    with anyio.fail_after(seconds):
        while not await predicate():  # noqa: ASYNC110 - the state lives in other processes
            await anyio.sleep(0.1)


async def test_nothing_a_container_does_lifts_its_limit(node: Node) -> None:
    """Issue 9: the environment, a config of its own, the read-only mounts, and the usage
    file the container can write. None lifts the 1 GiB limit for longer than the
    watchdog's grace period (1 s here), and the attempts that could matter are visible
    to the operator."""
    lifted = {"VGPUD_CONFIG": "/nonexistent", "VGPUD_MEMORY_LIMIT": "64g"}
    async with gpu_node(node, action="kill") as g:
        g.add_pod("t", placement({"main": [(0, 1024, 0)]}), env=lifted)
        admitted = await g.admit("t", {"main": 1})
        c = g.container("t", "main", admitted, INTERP, env=lifted)
        p = c.start(interactive=True)
        assert p.ask_json("use 0")["rc"] == 0  # 300 MiB of context
        assert p.ask_json("alloc 0 2g")["rc"] == OOM  # the env names no limit that counts
        assert p.ask_json("info")["total"] == 1024 * MIB
        # a config of its own, named in the environment
        c.exec(["sh", "-c", "printf 'version=1\\ndevice.0.memory_limit=0\\n' > /tmp/mine"]).check()
        out = lines(c.exec(drv("ctx", "alloc", 2 << 30, "info"),
                           env={"VGPUD_CONFIG": "/tmp/mine"}).check().stdout)
        assert out[1]["rc"] == OOM and out[2]["total"] == 1024 * MIB
        # an empty environment: the shim comes from /etc/ld.so.preload, not from LD_PRELOAD
        out = lines(c.exec(["/usr/bin/env", "-i", "LD_LIBRARY_PATH=/opt/fakecuda",
                            *drv("ctx", "alloc", 2 << 30)]).check().stdout)
        assert out[1]["rc"] == OOM
        # the plugin's files are read-only, the node's priority records among them
        for path in ("/etc/vgpud/config", "/etc/ld.so.preload", "/var/run/vgpud-arbiter/mine"):
            r = c.exec(["sh", "-c", f"echo version=1 > {path}"])
            assert r.returncode != 0 and "Read-only file system" in r.stderr, (path, r)
        # the usage file is the container's to write: zero its totals, then allocate again
        assert p.ask_json("alloc 0 600m")["rc"] == 0  # 900 MiB of 1024 in use
        c.exec(["dd", "if=/dev/zero", "of=/var/run/vgpud/usage.v1", "bs=4096", "count=1",
                "conv=notrunc"]).check()
        assert p.ask_json("alloc 0 600m")["rc"] == 0  # the shim was fooled: 1500 MiB
        # ... the node was not: NVML on the host shows 1500 MiB, the watchdog kills the
        # offender within its grace period and says why
        t0 = time.monotonic()
        await _until(lambda: anyio.to_thread.run_sync(lambda: p.returncode is not None))
        assert p.returncode == 128 + signal.SIGKILL, p.stderr
        print(f"over the limit for {time.monotonic() - t0:.1f} s")
        (event,) = await g.events("VgpuOverLimit")
        assert "'main'" in event["message"] and "1500 MiB" in event["message"]
        text = await g.metrics()
        assert metric(text, "vgpud_watchdog_actions_total", action="kill") == 1
        assert metric(text, "vgpud_watchdog_actions_total", action="report") == 1
        # the environment attempts were seen: every registered process reported them
        for name in lifted:
            assert (metric(text, "vgpud_container_env_ignored_total", variable=name) or 0) >= 1
        assert await g.events("VgpuEnvIgnored")


async def test_memory_taken_through_a_graphics_api_is_caught_by_the_watchdog(
        node: Node) -> None:
    """Issue 22, finding 19 (external memory): device memory a container takes through a
    graphics API (Vulkan's own allocation, which CUDA's external memory imports) passes
    no CUDA call, so no hook of the shim sees it, and NVML lists its process among the
    graphics processes, not the compute ones. The watchdog reads every list: under a
    1 GiB limit, 300 MiB of CUDA context and 1200 MiB taken that way, the graphics process
    is killed within the grace period, the largest first, and the CUDA one lives on."""
    async with gpu_node(node, action="kill") as g:
        g.add_pod("v", placement({"main": [(0, 1024, 0)]}))
        admitted = await g.admit("v", {"main": 1})
        c = g.container("v", "main", admitted, INTERP)
        p = c.start(interactive=True)
        assert p.ask_json("use 0")["rc"] == 0  # registered, and 300 MiB of context
        gfx = c.spawn(INTERP, interactive=True)
        assert gfx.ask_json("gfxalloc 0 1200m")["rc"] == 0  # the shim saw no call
        await _until(lambda: anyio.to_thread.run_sync(lambda: gfx.returncode is not None))
        assert gfx.returncode == 128 + signal.SIGKILL, gfx.stderr
        (event,) = await g.events("VgpuOverLimit")
        assert "1500 MiB" in event["message"], event["message"]
        assert p.returncode is None
        assert p.ask_json("alloc 0 700m")["rc"] == 0  # its room is back


async def test_a_restarted_container_reclaims_its_dead_pid_1(node: Node) -> None:
    """Issue 9 item 11: the state directory outlives a container; its restarted first
    process is PID 1 again, and a dead PID 1's usage used to stay charged forever."""
    async with gpu_node(node) as g:
        g.add_pod("r", placement({"main": [(0, 2048, 0)]}))
        g.add_pod("n", placement({"main": [(0, 2048, 0)]}))
        r = g.container("r", "main", await g.admit("r", {"main": 1}), INTERP)
        n = g.container("n", "main", await g.admit("n", {"main": 1}), INTERP)
        neighbour = n.start(interactive=True)
        assert neighbour.ask_json("use 0")["rc"] == 0
        assert neighbour.ask_json("alloc 0 1000m")["rc"] == 0
        first = r.start(interactive=True)
        assert first.ask_json("pid")["pid"] == 1
        assert first.ask_json("use 0")["rc"] == 0
        assert first.ask_json("alloc 0 700m")["rc"] == 0  # mid-allocation ...
        r.kill(signal.SIGKILL)  # ... killed
        r.wait(10)

        async def dead_usage_gone() -> bool:
            return metric(await g.metrics(), "vgpud_container_memory_used_bytes",
                          pod="r") == 0

        await _until(dead_usage_gone)  # the plugin no longer counts a dead process
        again = r.restart(interactive=True)
        assert again.ask_json("pid")["pid"] == 1  # PID 1 again, same allocation
        assert again.ask_json("use 0")["rc"] == 0
        assert again.ask_json("alloc 0 1748m")["rc"] == 0  # all of it: reclaimed at once
        assert again.ask_json("alloc 0 1")["rc"] == OOM
        # the neighbour was not disturbed
        assert neighbour.ask_json("info")["free"] == (2048 - 300 - 1000) * MIB
        text = await g.metrics()
        assert metric(text, "vgpud_container_memory_used_bytes", pod="r") == 2048 * MIB
        assert metric(text, "vgpud_container_memory_used_bytes", pod="n") == 1300 * MIB
