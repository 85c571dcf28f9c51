"""``vgpud webhook`` over HTTPS: the patches it sends, applied by an RFC 6902 library,
give the expected pod; denials carry their message; bad bodies get a 4xx while the
server keeps serving; 200 concurrent reviews; the cluster's GPUs from the node
annotations; certificates rotated on disk are served without a restart."""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import jsonpatch
import pytest
import trustme

from tests.builders import gpu_node
from tests.webhook.conftest import Webhook, review, server_cert

pytestmark = pytest.mark.anyio
NUM, MEM, CORES = "nvidia.com/vgpu-number", "nvidia.com/vgpu-memory", "nvidia.com/vgpu-cores"


def pod(limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
        name: str = "p", **spec: Any) -> dict[str, Any]:
    res = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    c: dict[str, Any] = {"name": "main", "image": "cuda"}
    if res:
        c["resources"] = res
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"},
            "spec": {"containers": [c], **spec}}


async def test_mutate_sends_a_patch_that_gives_the_expected_pod(webhook: Webhook) -> None:
    original = pod(requests={MEM: "3000"}, nodeName="gpu-1", schedulerName="default-scheduler")
    ops = await webhook.patch_of(copy.deepcopy(original))
    out = jsonpatch.apply_patch(original, ops)
    expected = copy.deepcopy(original)
    expected["spec"]["containers"][0]["resources"]["limits"] = {MEM: "3000", NUM: "1"}
    expected["spec"]["schedulerName"] = "vgpu-scheduler"
    del expected["spec"]["nodeName"]
    expected["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]}}}
    assert out == expected


async def test_non_gpu_pods_updates_and_other_kinds_pass_untouched(webhook: Webhook) -> None:
    assert await webhook.patch_of(pod(limits={"cpu": "1"})) == []
    for path in ("/mutate", "/validate"):
        bad = pod(limits={NUM: -1})
        resp = await webhook.admit(path, bad, operation="UPDATE")
        assert resp["allowed"] is True and "patch" not in resp
        resp = await webhook.admit(path, {"metadata": {"name": "x"}}, kind="Deployment",
                                   group="apps")
        assert resp["allowed"] is True and "patch" not in resp
        resp = await webhook.admit(path, None, operation="DELETE")
        assert resp["allowed"] is True


@pytest.mark.parametrize(("limits", "annotations", "spec", "fragments"), [
    ({NUM: -1}, {}, {}, ["'main'", NUM, "negative"]),
    ({MEM: "2.5"}, {}, {}, ["'main'", MEM, "not a whole number"]),
    ({CORES: 130}, {}, {}, ["'main'", CORES, "more than 100"]),
    ({"nvidia.com/vgpu-memory-percentage": 120}, {}, {}, ["between 1 and 100"]),
    ({MEM: 10, "nvidia.com/vgpu-memory-percentage": 10}, {}, {}, ["not both"]),
    ({NUM: 1}, {"nvidia.com/device-scheduler-policy": "fastest"}, {},
     ["nvidia.com/device-scheduler-policy", "'fastest'"]),
    ({NUM: 1}, {"nvidia.com/include-gpu-uuid": "GPU-1", "nvidia.com/exclude-gpu-uuid": "GPU-1"},
     {}, ["both included and excluded"]),
])
async def test_validate_denies_with_the_reason(webhook: Webhook, limits: dict[str, Any],
                                               annotations: dict[str, str], spec: dict[str, Any],
                                               fragments: list[str]) -> None:
    p = pod(limits=limits, **spec)
    p["metadata"]["annotations"] = annotations
    resp = await webhook.admit("/validate", p)
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    for f in fragments:
        assert f in resp["status"]["message"], resp["status"]["message"]


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "main", "image": "cuda", **fields}


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"containers": "main"}, "spec.containers must be a list"),
    ({"containers": {"name": "main"}}, "spec.containers must be a list"),
    ({"containers": [container()], "initContainers": 7}, "spec.initContainers must be a list"),
    ({"containers": ["main"]}, "spec.containers[0] must be an object"),
    ({"containers": [container(resources=[NUM])]},
     "spec.containers[0] (container 'main'): resources must be an object"),
    ({"containers": [container(resources={"limits": f"{NUM}=1"})]},
     "spec.containers[0] (container 'main'): resources.limits must be an object"),
    ({"containers": [container(), container(name="gpu", resources={"requests": [1]})]},
     "spec.containers[1] (container 'gpu'): resources.requests must be an object"),
])
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_a_pod_whose_gpu_use_cannot_be_read_is_denied_with_the_reason(
        webhook: Webhook, path: str, spec: dict[str, Any], fragment: str) -> None:
    p = pod()
    p["spec"] = spec
    resp = await webhook.admit(path, p)
    assert resp["allowed"] is False and "patch" not in resp
    assert resp["status"]["code"] == 403
    assert fragment in resp["status"]["message"], resp["status"]["message"]


@pytest.mark.parametrize(("resources", "fragments"), [
    ({"limits": {NUM: "one"}}, ["'main'", NUM, "not a quantity"]),
    ({"requests": {MEM: "3 GiB"}}, ["'main'", MEM, "not a quantity"]),
    ({"limits": {CORES: {"value": 30}}}, ["'main'", CORES, "expected a whole number"]),
    ({"limits": {NUM: 1, MEM: [1024]}}, ["'main'", MEM, "expected a whole number"]),
])
async def test_mutate_denies_a_malformed_gpu_quantity_naming_container_and_resource(
        webhook: Webhook, resources: dict[str, Any], fragments: list[str]) -> None:
    """/validate denied these already; /mutate answered allowed with a patch over them."""
    p = pod()
    p["spec"]["containers"][0]["resources"] = resources
    resp = await webhook.admit("/mutate", p)
    assert resp["allowed"] is False and "patch" not in resp
    for f in fragments:
        assert f in resp["status"]["message"], resp["status"]["message"]


async def test_non_gpu_pods_are_admitted_unchanged_whatever_their_own_quantities(
        webhook: Webhook) -> None:
    for p in (pod(limits={"cpu": "lots", "memory": {"x": 1}}), {**pod(), "spec": None},
              {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [container(resources=None)], "initContainers": None}}):
        for path in ("/mutate", "/validate"):
            resp = await webhook.admit(path, p)
            assert resp["allowed"] is True and "patch" not in resp, (path, p, resp)


async def test_privileged_gpu_pods_follow_the_setting(webhook_factory: Any) -> None:
    p = pod(limits={NUM: 1})
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    strict = await webhook_factory()
    resp = await strict.admit("/validate", p)
    assert not resp["allowed"] and "privileged" in resp["status"]["message"]
    lax = await webhook_factory({"allowPrivilegedGPUPods": True})
    assert (await lax.admit("/validate", p))["allowed"] is True


async def test_presets_are_mutated_under_their_names(webhook_factory: Any) -> None:
    w = await webhook_factory({"resourcePreset": "hami"})
    original = pod(limits={"nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})
    out = jsonpatch.apply_patch(original, await w.patch_of(original))
    assert out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert out["spec"]["schedulerName"] == "vgpu-scheduler"


def node(name: str, memory: int, n: int) -> dict[str, Any]:
    return gpu_node(name, n, memory, model="NVIDIA A100", numa=(0,) * n)


async def wait_allowed(w: Webhook, p: dict[str, Any], allowed: bool) -> dict[str, Any]:
    with anyio.fail_after(10):
        while True:
            resp = await w.admit("/validate", p)
            if resp["allowed"] is allowed:
                return resp
            await anyio.sleep(0.02)


async def test_requests_larger_than_any_gpu_are_denied_from_node_annotations(
        webhook: Webhook) -> None:
    big = pod(limits={MEM: 40000})
    assert (await webhook.admit("/validate", big))["allowed"]  # no GPU node known yet
    webhook.api.create("nodes", node("small", 24576, 4))
    resp = await wait_allowed(webhook, big, False)
    assert "24576 MiB" in resp["status"]["message"] and "'main'" in resp["status"]["message"]
    webhook.api.create("nodes", node("big", 81920, 2))
    await wait_allowed(webhook, big, True)
    assert not (await webhook.admit("/validate", pod(limits={MEM: 40000, NUM: 3})))["allowed"]
    webhook.api.delete("nodes", "big", namespace="")
    await wait_allowed(webhook, big, False)
    async with webhook.session.get(webhook.ops_url + "/metrics") as r:
        text = await r.text()
    assert "vgpud_webhook_gpu_nodes 1.0" in text


async def test_bad_bodies_get_4xx_and_the_server_keeps_serving(webhook: Webhook) -> None:
    good = review(pod(limits={NUM: 1}))
    cases: list[tuple[bytes, int, str]] = [
        (b"not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "not a JSON object"),
        (b"null", 400, "not a JSON object"),
        (json.dumps({**good, "apiVersion": "admission.k8s.io/v1beta1"}).encode(), 400,
         "admissionReviewVersions"),
        (json.dumps({**good, "request": None}).encode(), 400, "request is missing"),
        (json.dumps({**good, "request": {**good["request"], "uid": ""}}).encode(), 400, "uid"),
        (json.dumps({**good, "request": {**good["request"], "object": None}}).encode(), 400,
         "object is null"),
        (json.dumps({**good, "request": {**good["request"], "object": [1]}}).encode(), 400,
         "not an object"),
        (json.dumps({**good, "request": {**good["request"], "kind": "Pod"}}).encode(), 400,
         "GroupVersionKind"),
        (b"{" + b" " * (5 << 20) + b"}", 413, "larger than"),
    ]
    for path in ("/mutate", "/validate"):
        for body, status, fragment in cases:
            got, doc = await webhook.post(path, None, raw=body)
            assert (got, path) == (status, path), (body[:80], doc)
            assert fragment in doc["error"], doc
        resp = await webhook.admit(path, pod(limits={NUM: 1}))
        assert resp["allowed"] is True
    # a pod that is garbage inside a well-formed review is a denial with a reason, not a 4xx
    resp = await webhook.admit("/validate", {"spec": {"containers": [
        {"name": "x", "resources": {"limits": {NUM: {"a": 1}}}}]}})
    assert resp["allowed"] is False and "expected a whole number" in resp["status"]["message"]
    async with webhook.session.get(webhook.ops_url + "/healthz") as r:
        assert r.status == 200
    async with webhook.session.get(webhook.ops_url + "/metrics") as r:
        text = await r.text()
    assert 'vgpud_webhook_reviews_total{endpoint="validate",outcome="bad_request"} 10.0' in text


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_hostile_json_gets_a_400_that_says_why(webhook: Webhook) -> None:
    """Whatever the body holds, the answer is a 4xx naming what was wrong, never a 5xx:
    a body nested past the decoder's recursion limit (it answered 500), one nested past
    what any Kubernetes object needs, one nested inside the pod of a good review, JSON's
    forbidden constants, an integer too long to convert, text that is not UTF-8, a body
    that is not what its Content-Encoding says."""
    good = review(pod(limits={NUM: 1}))
    deep_pod = json.dumps({**good, "request": {**good["request"], "object": "HOLE"}}).encode()
    cases: list[tuple[bytes, str]] = [
        (nested(100_000), "deeper than 100 levels"),
        (nested(500), "deeper than 100 levels"),
        (deep_pod.replace(b'"HOLE"', b'{"spec": {"x": ' + nested(150) + b"}}"),
         "deeper than 100 levels"),
        (b'{"apiVersion": NaN}', "not valid JSON"),
        (b'{"apiVersion": -Infinity}', "not valid JSON"),
        (b'{"request": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"apiVersion": "\\x41"}', "not valid JSON"),  # not a JSON escape
        (b'{"apiVersion": "' + bytes([0xC3, 0x28]) + b'"}', "not UTF-8"),
    ]
    gzip = {"Content-Encoding": "gzip"}  # the body is not gzip: aiohttp answered 500
    for path in ("/mutate", "/validate"):
        for body, fragment, headers in [(b, f, {}) for b, f in cases] + [
                (json.dumps(good).encode(), "Content-Encoding (gzip)", gzip)]:
            async with webhook.session.post(webhook.url + path, data=body, ssl=webhook.ssl,
                                            headers={"Content-Type": "application/json",
                                                     **headers}) as r:
                status, text = r.status, await r.text()
            assert status == 400, (path, body[:60], status, text[:200])
            assert fragment in json.loads(text)["error"], (body[:60], text)
        resp = await webhook.admit(path, pod(limits={NUM: 1}))
        assert resp["allowed"] is True  # still serving
    # depth up to the limit is a review like any other
    shallow = json.dumps({**good, "request": {**good["request"], "object": "HOLE"}}).encode()
    ok = pod(limits={NUM: 1})
    ok["metadata"]["labels"] = {"a": "b"}
    body = shallow.replace(b'"HOLE"', json.dumps(
        {**ok, "spec": {**ok["spec"], "x": json.loads(nested(80))}}).encode())
    async with webhook.session.post(webhook.url + "/validate", data=body, ssl=webhook.ssl) as r:
        assert r.status == 200 and (await r.json())["response"]["allowed"] is True


async def test_200_concurrent_reviews_are_answered_correctly(webhook: Webhook) -> None:
    kinds = [("/mutate", pod(limits={MEM: 1000}), lambda r: r["allowed"] and "patch" in r),
             ("/validate", pod(limits={MEM: 1000, NUM: 1}), lambda r: r["allowed"]),
             ("/validate", pod(limits={CORES: 200}), lambda r: not r["allowed"]
              and "more than 100" in r["status"]["message"]),
             ("/mutate", pod(limits={"cpu": 1}), lambda r: r["allowed"] and "patch" not in r)]
    latencies: list[float] = []

    async def one(i: int) -> None:
        path, obj, check = kinds[i % len(kinds)]
        t0 = time.perf_counter()
        resp = await webhook.admit(path, copy.deepcopy(obj))
        latencies.append(time.perf_counter() - t0)
        assert check(resp), (i, resp)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        webhook.session, old = session, webhook.session
        try:
            await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            webhook.session = old
    assert len(latencies) == 200
    q = statistics.quantiles(latencies, n=100)
    print(f"\n200 concurrent reviews over HTTPS (new connections): p50 {q[49] * 1e3:.1f} ms, "
          f"p99 {q[98] * 1e3:.1f} ms")


async def test_a_rotated_certificate_is_served_without_a_restart(webhook: Webhook) -> None:
    def peer_serial() -> int:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        import socket
        with socket.create_connection(("127.0.0.1", webhook.serving.port), timeout=5) as s, \
                ctx.wrap_socket(s, server_hostname="localhost") as t:
            der = t.getpeercert(binary_form=True)
        from cryptography import x509
        return x509.load_der_x509_certificate(der).serial_number

    before = await anyio.to_thread.run_sync(peer_serial)
    new_ca = trustme.CA()
    server_cert(new_ca, webhook.tls_dir)
    with anyio.fail_after(10):
        while (await anyio.to_thread.run_sync(peer_serial)) == before:  # noqa: ASYNC110
            await anyio.sleep(0.05)
    new_ctx = ssl.create_default_context()
    new_ca.configure_trust(new_ctx)
    webhook.ssl = new_ctx
    assert (await webhook.admit("/validate", pod(limits={NUM: 1})))["allowed"]
    assert webhook.serving.tls.loads == 2
    # a half-written pair is refused and the good one kept
    (webhook.tls_dir / "tls.key").write_text("garbage")
    await anyio.sleep(0.3)
    assert (await webhook.admit("/validate", pod(limits={NUM: 1})))["allowed"]
    assert webhook.serving.tls.loads == 2


def test_the_command_refuses_missing_certificates_with_a_message(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vgpud", "webhook", "--tls-cert", str(tmp_path / "nope.crt"),
         "--tls-key", str(tmp_path / "nope.key"), "--listen", "127.0.0.1:0",
         "--kubeconfig", str(tmp_path / "missing-kubeconfig")],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("vgpud webhook: ") and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "vgpud", "webhook", "--listen", "nowhere"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "HOST:PORT" in proc.stderr


DRA_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
           "spec": {"nodeSelector": {"vgpud.io/node-mode": "dra"}, "containers": [{
               "name": "main", "image": "cuda", "resources": {"limits": {
                   "nvidia.com/vgpu-number": 1, "nvidia.com/vgpu-memory": 4096,
                   "nvidia.com/vgpu-cores": 30}}}]}}
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates"


async def test_a_pod_headed_to_dra_nodes_gets_claims_and_its_template_is_made(
        webhook_factory: Any) -> None:
    """Issue 26, item 3: with dra.translate on, the webhook rewrites the vGPU asks into a
    claim from a template of the ask's shape, which it makes in the pod's namespace (once:
    a second pod of that shape finds it); a dry run makes nothing."""
    w = await webhook_factory({"dra": {"translate": "selected"}})
    dry = await w.admit("/mutate", DRA_POD, dry_run=True)
    assert dry["allowed"] is True
    assert w.api.get("resourceclaimtemplates", "vgpud-1x4096mi-30c", "team") is None
    out = jsonpatch.apply_patch(DRA_POD, await w.patch_of(DRA_POD))
    assert out["spec"]["resourceClaims"] == [
        {"name": "vgpud-main", "resourceClaimTemplateName": "vgpud-1x4096mi-30c"}]
    assert out["spec"]["containers"][0]["resources"] == {"limits": {},
                                                         "claims": [{"name": "vgpud-main"}]}
    made = w.api.get("resourceclaimtemplates", "vgpud-1x4096mi-30c", "team")
    assert made is not None
    assert made["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "4096Mi", "cores": "30"}}
    assert await w.patch_of(DRA_POD)  # the template found: the same answer
    # without the DRA label, the device-plugin path's patch
    plain = {**DRA_POD, "spec": {**DRA_POD["spec"], "nodeSelector": {}}}
    ops = await w.patch_of(plain)
    assert {"op": "add", "path": "/spec/schedulerName", "value": "vgpu-scheduler"} in ops


async def test_a_template_of_that_name_with_another_request_is_refused_not_used(
        webhook_factory: Any) -> None:
    w = await webhook_factory({"dra": {"translate": "always"}})
    w.api.create("resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "vgpud-1x4096mi-30c", "namespace": "team"},
        "spec": {"spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
            "deviceClassName": "vgpu.vgpud.io", "capacity": {"requests": {
                "memory": "16Gi", "cores": "100"}}}}]}}}}, "team")
    resp = await w.admit("/mutate", DRA_POD)
    assert resp["allowed"] is False
    assert "team/vgpud-1x4096mi-30c exists with another request" in resp["status"]["message"]
