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

A reply is decoded a pod at a time, and a pod whose bytes are those of the call before
is not decoded again (:class:`PodDecoder`): between two of the plugin's calls kubelet's
list changes by the pod it admits, and decoding every pod (betterproto2 is pure Python,
about 80 µs a pod here) cost 16 ms a call on a node of 200 pods.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import anyio
from betterproto2 import parse_fields
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from vgpud.node._pb import v1 as pr


class PodResourcesError(RuntimeError):
    """kubelet's PodResources socket could not be read; the message says why."""


# What a gRPC call over a kubelet socket raises when kubelet is away, restarting or
# refusing. AttributeError: grpclib (0.4) drops a connection's transport when the socket
# closes, and a request made in that moment fails with "'Connection' object has no
# attribute '_transport'" instead of a connection error. TimeoutError: the deadline of a
# call, which is anyio's (``fail_after``), never grpclib's ``timeout=``: grpclib cancels
# the calling task and turns that into TimeoutError without ``Task.uncancel()``, and every
# anyio cancel scope of that task afterwards mistakes the leftover request for another
# cancellation and lets its own escape (tests/plugin/test_grpc_deadlines.py).
KUBELET_GONE = (OSError, GRPCError, StreamTerminatedError, TimeoutError, AttributeError)


@dataclass(frozen=True, slots=True)
class Held:
    """One container and the IDs of one resource kubelet gave it (possibly none)."""

    namespace: str
    pod: str
    container: str
    ids: frozenset[str]


LIST = "/v1.PodResourcesLister/List"
_POD_RESOURCES = 1  # ListPodResourcesResponse.pod_resources: repeated, length-delimited


class Reply(bytes):
    """A reply's bytes as they came: grpclib's codec hands them to ``FromString``."""

    @classmethod
    def FromString(cls, data: bytes) -> Reply:  # the name grpclib's codec calls
        return cls(data)


class PodDecoder:
    """Decodes a ``ListPodResourcesResponse`` pod by pod, keeping the pods of the reply
    before: a pod whose encoding is unchanged is the same message (any other field of
    the reply, unknown to this version, is skipped as a decoder skips it)."""

    def __init__(self) -> None:
        self._known: dict[bytes, pr.PodResources] = {}
        self.decoded = 0  # pods decoded, not found in the reply before

    def __call__(self, data: bytes) -> tuple[pr.PodResources, ...]:
        known: dict[bytes, pr.PodResources] = {}
        out = []
        for f in parse_fields(data):
            if f.number != _POD_RESOURCES or not isinstance(f.value, bytes):
                continue
            pod = self._known.get(f.value)
            if pod is None:
                pod = pr.PodResources.FromString(f.value)
                self.decoded += 1
            known[f.value] = pod
            out.append(pod)
        self._known = known  # only the pods of this reply: bounded by the node's pods
        return tuple(out)


class PodResourcesClient:
    def __init__(self, socket: str, resource: str, *, timeout: float = 10.0) -> None:
        self.socket = socket
        self.resource = resource
        self.timeout = timeout
        self._channel: Channel | None = None
        self._decode = PodDecoder()

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
        with anyio.fail_after(self.timeout):
            async with channel.request(LIST, Cardinality.UNARY_UNARY,
                                       pr.ListPodResourcesRequest, Reply) as stream:
                await stream.send_message(pr.ListPodResourcesRequest(), end=True)
                reply = await stream.recv_message()
        if reply is None:
            raise StreamTerminatedError("kubelet ended the List call without a reply")
        return self._decode(reply)


def find_owner(held: Iterable[Held], ids: Iterable[str]) -> Held | None:
    """The container holding exactly ``ids`` (None if no container does)."""
    want = frozenset(ids)
    for h in held:
        if h.ids == want:
            return h
    return None
