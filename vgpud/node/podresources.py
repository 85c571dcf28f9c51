"""kubelet's PodResources API (``v1.PodResourcesLister``): who holds which device IDs.

The node's client (any adapter's: the device plugin's source of a container's identity,
the node runtime's of the allocations still in use; the generated code is
``vgpud.node._pb``): kubelet records the
replica IDs it allocated to each container, per resource name, and :func:`find_owner`
looks up the container whose IDs of one resource are exactly a given set (the plugin
serves several resources whose IDs may be the same strings: a lookup is always for
one resource). ``List`` is GA since
Kubernetes 1.28 (``Get`` is still behind a feature gate, so it is not used).

A client keeps one connection to kubelet's socket for its calls (a new one per call
cost a connection set-up on every GetPreferredAllocation and PreStartContainer); a call
that fails on it is made once more on a new connection, so a kubelet restart costs no
failed call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from vgpud.node._pb import v1 as pr


class PodResourcesError(RuntimeError):
    """kubelet's PodResources socket could not be read; the message says why."""


# What a gRPC call over a kubelet socket raises when kubelet is away, restarting or
# refusing. AttributeError: grpclib (0.4) drops a connection's transport when the socket
# closes, and a request made in that moment fails with "'Connection' object has no
# attribute '_transport'" instead of a connection error.
KUBELET_GONE = (OSError, GRPCError, StreamTerminatedError, TimeoutError, AttributeError)


@dataclass(frozen=True, slots=True)
class Held:
    """One container and the IDs of one resource kubelet gave it (possibly none)."""

    namespace: str
    pod: str
    container: str
    ids: frozenset[str]


class PodResourcesClient:
    def __init__(self, socket: str, resource: str, *, timeout: float = 10.0) -> None:
        self.socket = socket
        self.resource = resource
        self.timeout = timeout
        self._channel: Channel | None = None

    async def list(self) -> list[Held]:
        """Every container of every active pod, with its IDs of ``resource``."""
        out = []
        for p in await self._pods():
            for c in p.containers:
                ids = frozenset(i for d in c.devices if d.resource_name == self.resource
                                for i in d.device_ids)
                out.append(Held(p.namespace, p.name, c.name, ids))
        return out

    async def live(self) -> set[tuple[str, frozenset[str]]]:
        """``(resource, IDs)`` of every container holding devices, of every resource
        (what allocation directories, of any resource, are still in use)."""
        return (await self.snapshot())[0]

    async def pods(self) -> set[tuple[str, str]]:
        """``(namespace, name)`` of every active pod kubelet lists."""
        return (await self.snapshot())[1]

    async def snapshot(self) -> tuple[set[tuple[str, frozenset[str]]], set[tuple[str, str]]]:
        """:meth:`live` and :meth:`pods` from one List call (one instant of kubelet's view)."""
        live: set[tuple[str, frozenset[str]]] = set()
        pods: set[tuple[str, str]] = set()
        for p in await self._pods():
            pods.add((p.namespace, p.name))
            for c in p.containers:
                by: dict[str, set[str]] = {}
                for d in c.devices:
                    by.setdefault(d.resource_name, set()).update(d.device_ids)
                live |= {(r, frozenset(ids)) for r, ids in by.items() if ids}
        return live, pods

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    async def _pods(self) -> tuple[pr.PodResources, ...]:
        if self._channel is not None:
            try:
                return await self._list(self._channel)
            except KUBELET_GONE:
                self.close()  # kubelet restarted, or the connection broke: a new one
        self._channel = Channel(path=self.socket)
        try:
            return await self._list(self._channel)
        except KUBELET_GONE as e:
            self.close()
            raise PodResourcesError(
                f"cannot list pod resources from kubelet at {self.socket}: {e}") from None

    async def _list(self, channel: Channel) -> tuple[pr.PodResources, ...]:
        reply = await pr.PodResourcesListerStub(channel).list(
            pr.ListPodResourcesRequest(), timeout=self.timeout)
        return tuple(reply.pod_resources)


def find_owner(held: Iterable[Held], ids: Iterable[str]) -> Held | None:
    """The container holding exactly ``ids`` (None if no container does)."""
    want = frozenset(ids)
    for h in held:
        if h.ids == want:
            return h
    return None
