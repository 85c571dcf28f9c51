"""KubeClient: configuration loading, error mapping, the request budget."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.kube.clocks import JumpClock
from tests.standin import ApiServer
from vgpud.kube import errors
from vgpud.kube.budget import RequestBudget
from vgpud.kube.client import KubeClient

pytestmark = pytest.mark.anyio


async def test_kubeconfig_flag_wins(api: ApiServer, tmp_path: Path) -> None:
    api.create("nodes", {"metadata": {"name": "n1"}})
    path = api.write_kubeconfig(tmp_path / "config")
    async with KubeClient.connect(path, environ={}) as kube:
        nodes = await kube.call(kube.core.list_node)
    assert [n["metadata"]["name"] for n in nodes["items"]] == ["n1"]


async def test_kubeconfig_from_environment(api: ApiServer, tmp_path: Path) -> None:
    path = api.write_kubeconfig(tmp_path / "config")
    async with KubeClient.connect(environ={"KUBECONFIG": str(path)}) as kube:
        assert (await kube.request("GET", "/version"))["gitVersion"].endswith("standin")


async def test_missing_configuration_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="--kubeconfig PATH"):
        async with KubeClient.connect(environ={}):
            pass
    with pytest.raises(errors.ConfigError, match="no such file"):
        async with KubeClient.connect(tmp_path / "absent", environ={}):
            pass
    with pytest.raises(errors.ConfigError, match="cannot load"):
        async with KubeClient.connect(
            environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
        ):
            pass  # in-cluster detected, but there is no service account token here


async def test_bearer_token_is_sent_and_refusal_is_mapped() -> None:
    async with ApiServer(token="s3cret") as api:
        async with KubeClient.for_url(api.url, token="s3cret") as kube:
            assert (await kube.call(kube.core.list_node))["items"] == []
        async with KubeClient.for_url(api.url, token="wrong") as kube:
            with pytest.raises(errors.Unauthorized):
                await kube.call(kube.core.list_node)


async def test_error_mapping(api: ApiServer, kube: KubeClient) -> None:
    with pytest.raises(errors.NotFound) as not_found:
        await kube.call(kube.core.read_node, "absent")
    assert not_found.value.status == 404 and "absent" in not_found.value.message
    node = {"metadata": {"name": "n1"}}
    await kube.call(kube.core.create_node, node)
    with pytest.raises(errors.AlreadyExists):
        await kube.call(kube.core.create_node, node)
    api.fail("get", "nodes", 429, times=1, retry_after=3)
    with pytest.raises(errors.TooManyRequests) as throttled:
        await kube.call(kube.core.read_node, "n1")
    assert throttled.value.retry_after == 3.0
    assert isinstance(throttled.value, errors.Unavailable)
    api.fail("get", "nodes", 503, times=1)
    with pytest.raises(errors.ServerError):
        await kube.call(kube.core.read_node, "n1")
    with pytest.raises(errors.Invalid):
        await kube.call(kube.core.create_namespaced_pod, "default", {"metadata": {"name": "p"}})


async def test_unreachable_server_is_connection_failed() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with KubeClient.for_url(f"http://127.0.0.1:{port}", request_timeout=2) as kube:
        with pytest.raises(errors.ConnectionFailed):
            await kube.call(kube.core.list_node)


async def test_budget_allows_a_burst_then_qps() -> None:
    clock = JumpClock()
    budget = RequestBudget(qps=10, burst=5, clock=clock)
    for _ in range(5):
        await budget.acquire()
    assert clock.elapsed == 0
    for _ in range(20):
        await budget.acquire()
    assert clock.elapsed == pytest.approx(2.0)
    assert not budget.try_acquire()
    with pytest.raises(ValueError):
        RequestBudget(qps=0)


async def test_requests_on_the_wire_respect_the_budget(api: ApiServer) -> None:
    clock = JumpClock()
    qps, burst, total = 20.0, 10, 60
    violations: list[tuple[float, int]] = []
    real_sleep = clock.sleep

    async def observed_sleep(seconds: float) -> None:
        # Before time moves on: requests the server saw so far must fit the budget.
        seen = api.count("get", "nodes")
        if seen > burst + qps * clock.elapsed + 1e-9:
            violations.append((clock.elapsed, seen))
        await real_sleep(seconds)

    clock.sleep = observed_sleep  # type: ignore[method-assign]
    api.create("nodes", {"metadata": {"name": "n1"}})
    async with KubeClient.for_url(api.url, qps=qps, burst=burst, clock=clock) as kube:
        for _ in range(total):
            await kube.call(kube.core.read_node, "n1")
    assert api.count("get", "nodes") == total
    assert violations == []
    assert clock.elapsed == pytest.approx((total - burst) / qps)


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_proxy_is_resolved_once_from_the_environment(
        api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP(S)_PROXY / NO_PROXY apply to the API server as aiohttp reads them, looked up
    when the client is made, not on every request (which cost two worker-thread hops
    and a read of ~/.netrc per request)."""
    dead = f"http://127.0.0.1:{_dead_port()}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", dead)
    async with KubeClient.for_url(api.url) as kube:  # the proxy applies: nothing gets through
        with pytest.raises(errors.ConnectionFailed):
            await kube.request("GET", "/version")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with KubeClient.for_url(api.url) as kube:  # exempt: direct
        assert (await kube.request("GET", "/version"))["gitVersion"].endswith("standin")
        monkeypatch.delenv("NO_PROXY")  # a later change of the environment is not seen
        assert (await kube.request("GET", "/version"))["gitVersion"].endswith("standin")


async def test_a_kubeconfig_that_is_not_yaml_is_a_clear_error(tmp_path: Path) -> None:
    """It was a ParserError's traceback (`vgpud inspect gpus --kubeconfig bad.yaml`)."""
    from vgpud.kube.client import load_configuration
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [1, 2\n")
    with pytest.raises(errors.ConfigError,
                       match=r"(?s)the kubeconfig is not YAML: .*line 1, column"):
        await load_configuration(bad)
