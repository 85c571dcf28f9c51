"""A kubelet that accepts and never answers: the plugin's gRPC calls give up at their
deadline, and leave the calling task as they found it.

grpclib enforces its own ``timeout=`` by ``Task.cancel()`` and turns the CancelledError
into TimeoutError without ``Task.uncancel()``: the task keeps a cancel request counted
(``Task.cancelling()``), and every anyio cancel scope in that task afterwards refuses to
swallow its own cancellation (it sees another one pending). A long-lived task (the
registration loop, the node's housekeeping) would then die at its next ``move_on_after``.
So the deadlines are anyio's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream

from vgpud.node.podresources import PodResourcesClient, PodResourcesError
from vgpud.plugin._pb import v1beta1 as pb
from vgpud.plugin.kubelet import register

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def silent_kubelet(path: Path) -> AsyncIterator[list[int]]:
    """Accepts connections and reads what comes, answering nothing; yields the number of
    bytes each connection sent (a call did reach it)."""
    received: list[int] = []

    async def swallow(stream: SocketStream) -> None:
        received.append(0)
        i = len(received) - 1
        async with stream:
            try:
                while True:
                    received[i] += len(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return

    listener = await anyio.create_unix_listener(path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, swallow)
        yield received
        tg.cancel_scope.cancel()


async def scopes_still_work() -> None:
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0, "a cancel request of the call is left on the task"
    with anyio.move_on_after(0.05) as scope:
        await anyio.sleep(5)
    assert scope.cancelled_caught


async def test_registration_with_a_kubelet_that_never_answers_times_out_cleanly(
        tmp_path: Path) -> None:
    async with silent_kubelet(tmp_path / "kubelet.sock") as received:
        with anyio.fail_after(10):
            with pytest.raises(TimeoutError):
                await register(tmp_path / "kubelet.sock", "vgpud.sock", "nvidia.com/vgpu",
                               pb.DevicePluginOptions(), seconds=0.3)
        assert received and received[0] > 0  # the request went out
        await scopes_still_work()


async def test_a_pod_resources_list_that_never_ends_times_out_cleanly(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"), "nvidia.com/vgpu-number",
                                timeout=0.3)
    async with silent_kubelet(tmp_path / "kubelet.sock") as received:
        with anyio.fail_after(10):
            with pytest.raises(PodResourcesError, match="cannot list pod resources"):
                await client.pods()
        assert received and received[0] > 0
        await scopes_still_work()
    client.close()
