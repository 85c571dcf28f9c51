"""Publishing the node's ResourceSlices: the API holds exactly what
:mod:`vgpud.core.slices` says of the node's GPUs, and follows them as they change.

:func:`run_publisher` is the entry point (``vgpud dra`` starts it in its task group once
the kubelet has accepted the plugin's registration). Each round reads the Node (its uid:
the slices are owned by it, so they go when it goes) and this driver's slices of this
node (one list, by field selector), asks :func:`vgpud.core.slices.plan` what to write,
and writes it: creates, updates (with the resourceVersion it read: a conflict means
someone else wrote, so the round starts again), deletes. A round runs at start, on every
change of the inventory (``source.version``: health, GPUs that come and go) and after
``recheck`` quiet seconds, in case something removed or changed the slices.

It does not fight the kubelet. The kubelet deletes a driver's slices of its node when
the driver's plugin goes away (unregistered for its grace period) and on its own start
for plugins that did not come back. The publisher only touches its own driver's slices
of its own node, runs inside the plugin's process (so it goes when the plugin goes), and
writes nothing while ``registered()`` is false: a plugin that lost its registration lets
the kubelet's wipe stand until it registers again. Slices removed while it is registered
come back at the next recheck, never in a tight loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.core.dra import DRIVER
from vgpud.core.model import Defaults, NodeInventory
from vgpud.core.slices import DriverFacts, GpuFacts, Plan, devices, plan, published
from vgpud.kube.backoff import Backoff
from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import Conflict, KubeError, NotFound
from vgpud.kube.resources import NODES, RESOURCESLICES

log = structlog.get_logger(__name__)


class InventorySource(Protocol):
    """The node's devices as they change (:class:`vgpud.node.devices.NodeDevices` is one)."""

    @property
    def version(self) -> int: ...

    def inventory(self) -> NodeInventory: ...

    async def wait_change(self, seen: int) -> int: ...


@dataclass
class SlicePublisher:
    """One node's slices: :meth:`sync` makes the API hold what the inventory says."""

    kube: KubeClient
    node: str
    defaults: Defaults | None = None
    facts: Mapping[str, GpuFacts] | None = None
    driver: DriverFacts | None = None
    writes: int = field(default=0, init=False)  # objects written, for tests and logs

    async def current(self) -> list[Json]:
        body = await self.kube.request("GET", RESOURCESLICES.collection_path(), query={
            "fieldSelector": f"spec.nodeName={self.node},spec.driver={DRIVER}"})
        items: list[Json] = body.get("items") or []
        return items

    async def node_uid(self) -> str:
        node = await self.kube.request("GET", NODES.object_path(self.node))
        return str((node.get("metadata") or {}).get("uid", ""))

    async def sync(self, inventory: NodeInventory) -> Plan:
        """One round; the plan it carried out (empty: the API already held it).
        Raises :class:`~vgpud.kube.errors.KubeError` (a :class:`Conflict`: read again)."""
        uid = await self.node_uid()
        want = devices(inventory, self.defaults, facts=self.facts, driver=self.driver)
        todo = plan(self.node, want, [published(s) for s in await self.current()])
        for s in todo.creates:
            await self.kube.request("POST", RESOURCESLICES.collection_path(),
                                    body=s.manifest(uid))
            self.writes += 1
        for s in todo.updates:
            await self.kube.request("PUT", RESOURCESLICES.object_path(s.name),
                                    body=s.manifest(uid))
            self.writes += 1
        for name, version in todo.deletes:
            try:
                await self.kube.request("DELETE", RESOURCESLICES.object_path(name), body={
                    "apiVersion": "v1", "kind": "DeleteOptions",
                    "preconditions": {"resourceVersion": version}})
            except NotFound:
                pass  # gone already (the kubelet, or the Node's garbage collection)
            self.writes += 1
        if todo:
            written = todo.creates + todo.updates
            log.info("resource_slices_published", node=self.node, created=len(todo.creates),
                     updated=len(todo.updates), deleted=len(todo.deletes),
                     generation=written[0].generation if written else None)
        return todo


async def run_publisher(
    client: KubeClient,
    node_name: str,
    source: InventorySource,
    *,
    defaults: Defaults | None = None,
    facts: Mapping[str, GpuFacts] | None = None,
    driver: DriverFacts | None = None,
    registered: Callable[[], bool] = lambda: True,
    recheck: float = 60.0,
    clock: Clock = SYSTEM_CLOCK,
    task_status: TaskStatus[SlicePublisher] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``node_name``'s ResourceSlices equal to ``source``'s inventory. Forever.

    ``defaults`` are the settings' request defaults (``defaultMem``, ``defaultCores``:
    the capacities' request policies); ``facts`` and ``driver`` what the backend read
    beyond the inventory (PCI bus ids, SMs, versions), if anything. ``task_status`` is
    started, with the publisher, once a round has succeeded (the slices are there)."""
    pub = SlicePublisher(client, node_name, defaults, facts, driver)
    backoff = Backoff(initial=0.5, cap=30.0, clock=clock)
    started = False
    while True:
        seen = source.version
        if not registered():
            with anyio.move_on_after(recheck):
                await source.wait_change(seen)
            continue
        try:
            await pub.sync(source.inventory())
        except Conflict as e:  # someone wrote between our read and write: read again
            log.info("resource_slices_conflict", node=node_name, error=str(e))
            await backoff.sleep()
            continue
        except KubeError as e:
            log.warning("resource_slices_publish_failed", node=node_name, error=str(e))
            await backoff.sleep()
            continue
        backoff.reset()
        if not started:
            started = True
            task_status.started(pub)
        with anyio.move_on_after(recheck):
            await source.wait_change(seen)
