"""Every PromQL expression the chart ships, evaluated by a real Prometheus.

The system: the API stand-in, ``vgpud scheduler`` and ``vgpud plugin`` as processes (the
plugin over fake GPUs from a file, one of three unhealthy, registered with the fake
kubelet). Two GPU pods are placed through the extender the way kube-scheduler drives
it and started through the fake kubelet (Allocate, PreStartContainer), and their shims'
usage files are written (the layout of ``vgpud.node.usage_state``, the C ABI's mirror); a third asks
for more GPUs than the node has healthy and stays Pending. Prometheus scrapes both
daemons every second and evaluates the alert rules file itself.

Then every expression of every dashboard panel and template variable, with the
variables set to this system's node, namespace and pod, must return data, and so must
each alert's condition without its threshold (a condition like ``x > 900`` is rightly
empty while all is well; what must exist is the series it compares, or the expression
names a metric or label nobody serves). Each rule must evaluate without error inside
Prometheus, the one alert this system deserves (the unhealthy GPU) must be pending,
``promtool check rules`` must pass, and every ``vgpud_*`` metric scraped must be in
``docs/metrics.md``. The scheduler's and the plugin's figures for the same GPUs must
agree, in bytes and ratios.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import gpu_pod
from tests.e2e.cluster import Driver, Scheduler, free_port, standin
from tests.fakekubelet import FakePod
from tests.fakekubelet.kubelet import FakeKubelet
from tests.observability.prometheus import (
    DASHBOARDS,
    ROOT,
    RULES,
    Prometheus,
    Query,
    Tools,
    dashboard_queries,
    rule_queries,
    without_threshold,
)
from vgpud.core.codec import NODE_DEVICES
from vgpud.node import usage_state
from vgpud.node.allocations import AllocationStore

pytestmark = pytest.mark.anyio

NODE = "gpu-node-1"
MIB = 1 << 20
UUIDS = [f"GPU-0b5e0000-0000-4000-8000-{i:012x}" for i in range(3)]
SICK = 2  # the unhealthy GPU's index
# (pod, vGPUs, MiB, cores, MiB its shim counts)
PODS = [("train", 1, 4000, 30, 3000), ("infer", 1, 2000, 20, 500)]
DOCS = (ROOT / "docs" / "metrics.md").read_text()
PENDING = "huge"  # asks for 3 GPUs: the node has 2 healthy ones
# Grafana's variables, as this system gives them values. A rate over [1m] has the two
# scrapes it needs once Prometheus has scraped twice (1 s apart).
VARIABLES = {"$__rate_interval": "1m", "$__interval": "1s", "$__range": "1m",
             "$node": NODE, "$namespace": "default", "$pod": "train"}


def substitute(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace("${" + name[1:] + "}", value).replace(name, value)
    assert "$" not in expr, f"a variable the test does not know: {expr}"
    return expr


def write_usage(state: Path, used: int, limit: int) -> None:
    """A usage file as the shim keeps it (``vgpud.node.usage_state``'s layout, which
    tests/shim checks against the C ABI): one device, one live process charging ``used`` bytes."""
    buf = bytearray(usage_state.FILE_SIZE)

    def put(table: dict[str, tuple[int, str]], base: int, name: str, *values: int) -> None:
        offset, fmt = table[name]
        n = struct.calcsize(fmt) // struct.calcsize("<" + fmt[-1])
        struct.pack_into(fmt, buf, base + offset, *values, *[0] * (n - len(values)))

    h = usage_state.HEADER_FIELDS
    put(h, 0, "magic", usage_state.MAGIC)
    put(h, 0, "version", usage_state.VERSION)
    for name, value in (("header_size", usage_state.HEADER_SIZE),
                        ("slot_size", usage_state.SLOT_SIZE),
                        ("max_slots", usage_state.MAX_SLOTS),
                        ("max_devices", usage_state.MAX_DEVICES),
                        ("device_count", 1)):
        put(h, 0, name, value)
    put(h, 0, "limit", limit)
    put(h, 0, "used", used)
    slot = usage_state.HEADER_SIZE  # slot 0; host PID 0: not registered yet, counted as alive
    put(usage_state.SLOT_FIELDS, slot, "pid", 1)
    put(usage_state.SLOT_FIELDS, slot, "used", used)
    tmp = state / (usage_state.STATE_FILE + ".tmp")
    tmp.write_bytes(bytes(buf))
    tmp.replace(state / usage_state.STATE_FILE)


@contextlib.contextmanager
def plugin(root: Path, kubeconfig: Path, kubelet: FakeKubelet, port: int,
           ) -> Iterator[subprocess.Popen[bytes]]:
    """``vgpud plugin`` over fake GPUs, serving /metrics on ``port``."""
    devices = root / "devices.json"
    devices.write_text(json.dumps({"devices": [
        {"uuid": u, "index": i, "model": "NVIDIA Fake 24GB", "memory": 24576, "numa": 0,
         "links": [], "healthy": i != SICK, "mig": False} for i, u in enumerate(UUIDS)]}))
    cfg = root / "plugin.yaml"  # the scheduler (tests.e2e.cluster) writes its own vgpud.yaml
    cfg.write_text(yaml.safe_dump({"logLevel": "warning", "plugin": {
        "shimHostDir": str(root / "shim"), "watchdogIntervalSeconds": 0.5,
        "arbitrationPeriodSeconds": 0.2}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPUD_", "FAKECUDA_"))}
    with (root / "plugin.log").open("wb") as log:
        p = subprocess.Popen(
            [sys.executable, "-m", "vgpud", "plugin", "--node-name", NODE,
             "--kubeconfig", str(kubeconfig), "--config", str(cfg),
             "--device-plugin-dir", str(kubelet.plugin_dir),
             "--pod-resources-socket", str(kubelet.podres_socket),
             "--state-dir", str(root / "state"), "--fake-devices", str(devices),
             "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield p
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _tail(log: Path | None) -> str:
    return log.read_text(errors="replace")[-3000:] if log else ""


async def poll(what: str, check: Any, within: float = 30.0, *, log: Path | None = None) -> Any:
    """``await check()`` until it returns something true, else fail naming ``what``."""
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {within:.0f} s\n{_tail(log)}")
        await anyio.sleep(0.05)


async def families(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    with contextlib.suppress(aiohttp.ClientError):
        async with s.get(url) as r:
            if r.status == 200:
                return {f.name: f for f in text_string_to_metric_families(await r.text())}
    return {}


async def place(d: Driver, pod: dict[str, Any]) -> str:
    """Schedule ``pod`` on the node, retrying while the scheduler has not seen the node's
    inventory yet."""
    async def once() -> str | None:
        return (await d.schedule(pod, [NODE])).node
    node: str = await poll(f"placing {pod['metadata']['name']}", once)
    return node


def one(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


async def test_every_dashboard_and_alert_expression_returns_data(
        prometheus_tools: Tools) -> None:
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="vgo"))  # unix socket paths must stay short
    try:
        await _run(prometheus_tools, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"observability test: {time.monotonic() - started:.1f} s")


async def _run(tools: Tools, root: Path) -> None:
    checked = await anyio.run_process([tools.promtool, "check", "rules", str(RULES)],
                                      check=False)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()

    plugin_port = free_port()
    with standin(root) as (api, kubeconfig), contextlib.ExitStack() as stack:
        kubelet = FakeKubelet(root)
        kubelet.start_servers()
        stack.callback(kubelet.stop)
        async with aiohttp.ClientSession() as s:
            sched = Scheduler(kubeconfig, root, ops_port=free_port())
            d = Driver(s, api, sched.url)
            await d.create([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}])
            stack.enter_context(plugin(root, kubeconfig, kubelet, plugin_port))
            sched.start()
            stack.callback(sched.stop)
            try:
                await anyio.to_thread.run_sync(kubelet.wait_registered, 1, 30.0)
            except Exception:
                raise AssertionError("the plugin did not register:\n"
                                     + _tail(root / "plugin.log")) from None
            await sched.wait_ready()

            async def published() -> bool:
                nodes = await d.nodes()
                return any(NODE_DEVICES in (n["metadata"].get("annotations") or {})
                           for n in nodes)

            await poll("the plugin's inventory on the node", published,
                       log=root / "plugin.log")
            for name, n, mib, cores, _ in PODS:
                pod = gpu_pod(name, {"nvidia.com/vgpu-number": str(n),
                                     "nvidia.com/vgpu-memory": str(mib),
                                     "nvidia.com/vgpu-cores": str(cores)})
                await d.create([pod])
                assert await place(d, pod) == NODE
            huge = gpu_pod(PENDING, {"nvidia.com/vgpu-number": "3"})
            await d.create([huge])
            refused = await d.schedule(huge, [NODE])
            assert refused.node is None and refused.reason
            store = AllocationStore(root / "state")
            for name, n, mib, _, used in PODS:
                admitted = await anyio.to_thread.run_sync(
                    kubelet.run, FakePod("default", name, [("main", n)]))
                write_usage(store.path(admitted.ids["main"]) / "state", used * MIB, mib * MIB)

            plugin_url = f"http://127.0.0.1:{plugin_port}/metrics"

            async def every_container_measured() -> bool:
                f = await families(s, plugin_url)
                want = ("vgpud_container_memory_used_bytes",
                        "vgpud_container_sm_utilization_ratio", "vgpud_container_over_limit")
                pods = {p[0] for p in PODS}
                return all(name in f and {x.labels["pod"] for x in f[name].samples} == pods
                           for name in want)

            await poll("the plugin's container metrics", every_container_measured,
                       log=root / "plugin.log")

            prom = Prometheus(tools, root, {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "vgpud-scheduler",
                     "static_configs": [{"targets": [f"127.0.0.1:{sched.ops_port}"]}]},
                    {"job_name": "vgpud-plugin",
                     "static_configs": [{"targets": [f"127.0.0.1:{plugin_port}"]}]}]},
                free_port())
            prom.start()
            stack.callback(prom.stop)
            await _evaluate(prom, s)


async def _evaluate(prom: Prometheus, s: aiohttp.ClientSession) -> None:
    async def ready(s: aiohttp.ClientSession) -> bool:
        async with s.get(f"{prom.url}/-/ready") as r:
            return r.status == 200

    await prom.until(s, "prometheus ready", ready)

    async def scraped_thrice(s: aiohttp.ClientSession) -> bool:
        targets = (await prom.api(s, "/api/v1/targets"))["activeTargets"]
        assert all(t["health"] != "down" for t in targets), targets
        counts = await prom.query(s, "count_over_time(up[1m])")
        return len(counts) == 2 and all(float(c["value"][1]) >= 3 for c in counts)

    await prom.until(s, "both targets up and scraped three times", scraped_thrice)

    async def rules_evaluated(s: aiohttp.ClientSession) -> list[dict[str, Any]]:
        groups = (await prom.api(s, "/api/v1/rules"))["groups"]
        rules = [r for g in groups for r in g["rules"]]
        errors = [f"{r['name']}: {r['lastError']}" for r in rules if r["health"] == "err"]
        assert not errors, errors  # a rule Prometheus cannot evaluate fails at once
        return rules if rules and all(r["health"] == "ok" for r in rules) else []

    rules = await prom.until(s, "every rule evaluated", rules_evaluated)
    assert {r["name"] for r in rules} == {r.get("alert") or r.get("record") for r, _ in
                                          rule_queries(RULES)}

    # Every expression the dashboards and rules hold returns data here.
    queries: list[Query] = [q for b in sorted(DASHBOARDS.glob("*.json"))
                            for q in dashboard_queries(b)]
    for rule, q in rule_queries(RULES):
        if q.expr == rule["expr"]:
            await prom.query(s, q.expr)  # the condition itself is valid PromQL ...
            q = Query(q.where + " without its threshold", without_threshold(q.expr))
        queries.append(q)  # ... and the series it compares exist
    assert len(queries) > 40
    empty = []
    for q in queries:
        result = await prom.query(s, substitute(q.expr))
        if not result:
            empty.append(f"{q.where}: {q.expr}")
        elif q.label is not None and not all(q.label in r["metric"] for r in result):
            empty.append(f"{q.where}: no label {q.label!r} on {q.expr}")
    assert not empty, "expressions that return no data:\n" + "\n".join(empty)

    # The one alert this system deserves is on its way (for: 5m), and only that one.
    async def alerting(s: aiohttp.ClientSession) -> list[dict[str, Any]]:
        return list((await prom.api(s, "/api/v1/alerts"))["alerts"])

    alerts = await prom.until(s, "an alert for the unhealthy GPU", alerting)
    assert [(a["labels"]["alertname"], a["labels"].get("index"), a["state"])
            for a in alerts] == [("VgpudGpuUnhealthy", str(SICK), "pending")]
    assert one(await prom.query(s, "max(vgpud_scheduler_pending_gpu_pods)")) == 1
    assert one(await prom.query(
        s, "max(vgpud_scheduler_oldest_pending_gpu_pod_age_seconds)")) > 0

    # The scheduler's ledger and the plugin's grants agree, in the same units.
    for expr, want in (("sum({}_gpu_memory_allocated_bytes)", sum(p[2] for p in PODS) * MIB),
                       ("sum({}_gpu_cores_allocated_ratio)", sum(p[3] for p in PODS) / 100)):
        sched_says = one(await prom.query(s, expr.format("vgpud_scheduler")))
        plugin_says = one(await prom.query(s, expr.format("vgpud")))
        assert sched_says == pytest.approx(want) and plugin_says == pytest.approx(want), expr
    for name, _, _, _, used in PODS:
        got = await prom.query(s, f'vgpud_container_memory_used_bytes{{pod="{name}"}}')
        assert one(got) == used * MIB

    # Whatever the daemons serve is documented (a histogram by its base name).
    names = set(await prom.api(s, "/api/v1/label/__name__/values"))
    served = set()
    for n in names:
        if n.startswith("vgpud_") and not n.endswith("_created"):
            for suffix in ("_bucket", "_sum", "_count"):
                if n.endswith(suffix) and n.removesuffix(suffix) + "_bucket" in names:
                    n = n.removesuffix(suffix)
            served.add(n)
    assert len(served) >= 30  # the scheduler's and the plugin's, all but env_ignored
    assert {n for n in served if f"`{n}`" not in DOCS} == set()
