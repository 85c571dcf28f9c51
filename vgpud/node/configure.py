"""Configuring a container from its pod's assignment: the node's shell around
:func:`vgpud.node.startup.plan`, for any adapter that knows which container holds which
device IDs (the device plugin learns it from kubelet's PodResources).

:meth:`Configurer.configure` reads the pod (one GET: the limits are written from the
API's current pod, never from a cache that may still show a namesake it replaced; the
adapter may hand in the pod read ahead, once kubelet's call began), believes its
assignment only when vgpud's scheduler can have made it (:meth:`Configurer.granted`),
takes the node's compute policy for a pod that names none (the node read at most every
``policy_max_age`` seconds),
and carries out what :func:`~vgpud.node.startup.plan` decides: write the limits file
atomically (after rewriting the assignment when kubelet chose other GPUs with room:
:meth:`Configurer.reconcile`, the neighbours from the watched pods), or fail that one
container with a message (:class:`AllocationFailed`) kubelet shows on the pod.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import structlog

from vgpud.core.codec import ASSIGNMENT, encode_assignment
from vgpud.core.limits import LimitsError, render
from vgpud.core.model import ComputePolicy, Defaults, GpuUsage
from vgpud.core.requests import (
    COMPUTE_POLICY,
    RequestError,
    enabled_presets,
    parse_pod,
    preset_of,
)
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import Conflict, KubeError, NotFound
from vgpud.node import edits
from vgpud.node.allocations import (
    DEFAULT_RESOURCE,
    Allocation,
    AllocationOwner,
    AllocationStore,
)
from vgpud.node.cluster import ClusterApi, PodView
from vgpud.node.devices import NodeDevices
from vgpud.node.ids import VGPU_IDS
from vgpud.node.pods import NodePods, PodKey
from vgpud.node.registration import Registrar, SocketOwner
from vgpud.node.startup import NEEDS_OTHERS, Configure, Refuse, held_by_others, plan

log = structlog.get_logger(__name__)


class AllocationFailed(Exception):
    """A container cannot get its vGPUs; ``str()`` is what kubelet shows on the pod."""

    def __init__(self, message: str, pod: PodView | None = None) -> None:
        super().__init__(message)
        self.pod = pod


def complete(pod: PodView, resource: str) -> bool:
    """Whether the cached view of a pod kubelet lists can be decided on (for the IDs of
    ``resource``)."""
    return not pod.deleting and (ASSIGNMENT in pod.annotations or not any(
        resource in names for names in pod.asks.values()))


class Configurer:
    def __init__(
        self,
        *,
        node: str,
        devices: NodeDevices,
        store: AllocationStore,
        cluster: ClusterApi,
        pods: Callable[[], NodePods],
        registrar: Registrar | None = None,
        arbiter: Path | None = None,
        scheduler_name: str | None = None,
        defaults: Defaults | None = None,
        reconcile_lock: anyio.Lock | None = None,
        rewrite_wait: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        policy_max_age: float = 10.0,
    ) -> None:
        self.node = node
        self.clock = clock
        # the node's compute policy as last read, and when (a GET of the node on every
        # container start cost the API a read and the start a round trip, for an
        # annotation an operator sets once): a change reaches the containers started
        # ``policy_max_age`` seconds later at most
        self.policy_max_age = policy_max_age
        self._policy: tuple[float, str | None] | None = None
        self.devices = devices
        self.store = store
        self.cluster = cluster
        self.pods = pods  # the node's watched pods (an unstarted one GETs every pod)
        self.registrar = registrar
        self.arbiter = arbiter  # host directory of the priority records (None: off)
        # whose assignments are grants: pods naming this scheduler (None: any) and asking
        # for a vGPU of the presets ``defaults`` enables, within what they ask (None: any)
        self.scheduler_name = scheduler_name
        self.defaults = defaults
        self.presets = tuple(enabled_presets(defaults)) if defaults is not None else ()
        # shared by every configurer of one node: two reconciliations onto one GPU must
        # not both see the same room
        self.reconcile_lock = reconcile_lock or anyio.Lock()
        self.rewrite_wait = rewrite_wait  # for the cache to show our own rewrite

    async def configure(self, namespace: str, name: str, container: str, ids: list[str],
                        chosen: list[str], *, resource: str = DEFAULT_RESOURCE,
                        per_gpu: int = VGPU_IDS, listed: set[PodKey] | frozenset[PodKey]
                        = frozenset(), read: PodView | None = None) -> Allocation:
        """Write the limits file of ``container`` of pod ``namespace/name``, which holds
        ``ids`` of ``resource`` (``chosen``: their GPUs, one per ID); ``listed``: the
        pods kubelet lists, read from the API when the cache does not show them in full;
        ``read``: the pod as the API gave it since kubelet's call began (else one GET)."""
        where = f"pod {namespace}/{name} container {container!r}"
        # the pod and the node's policy, read at once (two API round trips, one wait),
        # unless the watched pod names a policy of its own (which wins)
        raw_policy: list[str | None] = []
        refused: AllocationFailed | None = None
        cached = self.pods().cached(namespace, name)
        async with anyio.create_task_group() as tg:
            if cached is None or COMPUTE_POLICY not in cached.annotations:
                tg.start_soon(self._read_policy, raw_policy)
            try:  # raised from here, not out of the task group (as a group)
                pod = (read if read is not None and (read.namespace, read.name)
                       == (namespace, name) else await self.pod(namespace, name, where))
            except AllocationFailed as e:
                refused = e
                tg.cancel_scope.cancel()  # a refusal waits for no node read
        if refused is not None:
            raise refused
        if not raw_policy and COMPUTE_POLICY not in pod.annotations:
            await self._read_policy(raw_policy)  # the watched view lagged
        if not self.granted(pod):
            raise AllocationFailed(
                f"{where}: the pod names scheduler {pod.scheduler!r}, not vgpud's "
                f"{self.scheduler_name!r}: an assignment vgpud's scheduler did not make "
                f"configures no limits (issue 23: a pod may not grant itself a GPU)", pod)
        node_policy = self.policy_of(pod, raw_policy[0] if raw_policy else None)
        step = self.plan(where, pod, container, chosen, policy=node_policy, per_gpu=per_gpu)
        if step is NEEDS_OTHERS:
            step = await self.reconcile(where, pod, container, chosen, node_policy,
                                        listed=listed, resource=resource, per_gpu=per_gpu)
        if isinstance(step, Refuse):
            raise AllocationFailed(step.message, pod)
        assert isinstance(step, Configure)
        owner = AllocationOwner(namespace, name, container, pod.uid)
        try:
            text = render(step.limits)
            order = {u: i for i, u in enumerate(step.limits.visible_uuids)}
            devices = tuple(sorted(step.grant.devices, key=lambda d: order[d.uuid]))
            policy = (step.limits.devices[0].core_policy.value if step.limits.devices
                      else "fixed")
            write = partial(self.store.configure, ids, owner, text, devices, resource,
                            step.limits.priority, policy)
            previous = self.store.owner_of(ids, resource)
            if previous is not None and previous != owner:
                # the container before left a state directory it could fill with any
                # number of files: cleared in a worker thread, not on the node's loop
                alloc = await anyio.to_thread.run_sync(write)
            else:  # two small files renamed into place, no fsync: a fraction of a
                alloc = write()  # millisecond, less than a worker thread's round trip
        except LimitsError as e:
            raise AllocationFailed(f"{where}: {e}", pod) from None
        except OSError as e:
            raise AllocationFailed(f"{where}: cannot write the limits file: "
                                   f"{e.strerror or e}", pod) from None
        log.info("configured", resource=resource, pod=f"{namespace}/{name}",
                 container=container, key=alloc.key, gpus=list(step.limits.visible_uuids))
        if self.registrar is not None:
            self.registrar.set_owner(alloc.key, SocketOwner(
                alloc.key, owner.namespace, owner.pod, owner.container, owner.uid))
        return alloc

    def granted(self, pod: PodView) -> bool:
        """Can the pod's assignment be a grant of vgpud's scheduler? It names that
        scheduler and asks for a vGPU (a pod that asks none, or bound by its own
        ``nodeName`` under another scheduler, holds nothing: issue 23, findings 1-2)."""
        if self.scheduler_name is not None and pod.scheduler != self.scheduler_name:
            return False
        return not self.presets or any(preset_of(names, self.presets) is not None
                                       for names in pod.asks.values())

    async def pod(self, namespace: str, name: str, where: str) -> PodView:
        try:
            pod = await self.cluster.get_pod(namespace, name)
        except KubeError as e:
            raise AllocationFailed(f"{where}: {e}") from None
        if pod is None:
            raise AllocationFailed(f"{where}: the pod no longer exists in the API")
        return pod

    async def _read_policy(self, into: list[str | None]) -> None:
        """Append the node's policy annotation (None: none, or the node unreadable), as
        read at most ``policy_max_age`` seconds ago."""
        now = self.clock.now()
        if self._policy is not None and now - self._policy[0] < self.policy_max_age:
            into.append(self._policy[1])
            return
        try:
            value = await self.cluster.node_annotation(self.node, COMPUTE_POLICY)
        except KubeError as e:  # not kept: the next start asks again
            log.warning("node_policy_unread", node=self.node, error=str(e))
            into.append(None)
            return
        self._policy = (now, value)
        into.append(value)

    def policy_of(self, pod: PodView, raw: str | None) -> ComputePolicy | None:
        """The node's ``nvidia.com/vgpu-compute-policy`` (``raw``) for a pod that names
        none (the pod's own wins, as in VGPU-Manager); a value that is not a policy is
        ignored with a warning, an unreadable node too."""
        if COMPUTE_POLICY in pod.annotations or raw is None:
            return None
        try:
            return ComputePolicy(raw.strip().lower())
        except ValueError:
            log.warning("node_policy_invalid", node=self.node, value=raw,
                        known=[p.value for p in ComputePolicy])
            return None

    def plan(self, where: str, pod: PodView, container: str, chosen: list[str],
             others: dict[str, GpuUsage] | None = None, *,
             policy: ComputePolicy | None = None, per_gpu: int = VGPU_IDS,
             ) -> Configure | Refuse | object:
        request = None
        if self.defaults is not None:
            try:
                request = parse_pod(pod.source, self.defaults)
            except RequestError as e:
                return Refuse(f"{where}: the pod's request cannot be read: {e}")
        return plan(where, pod.assignment, node=self.node, container=container, request=request,
                    chosen=chosen, inventory=self.devices.inventory(),
                    state_dir=edits.STATE_DIR,
                    register=edits.REGISTER if self.registrar is not None else "",
                    arbiter_dir=edits.ARBITER_DIR if self.arbiter is not None else "",
                    others=others,
                    per_gpu=per_gpu, node_policy=policy)

    async def reconcile(self, where: str, pod: PodView, container: str,
                        chosen: list[str], policy: ComputePolicy | None = None,
                        listed: set[PodKey] | frozenset[PodKey] = frozenset(), *,
                        resource: str = DEFAULT_RESOURCE, per_gpu: int = VGPU_IDS,
                        ) -> Configure | Refuse:
        """kubelet chose other GPUs: rewrite the assignment if they have room.

        The neighbours are the watched pods, and those of ``listed`` (the pods kubelet
        lists) the cache does not show in full (:func:`complete`), read from the API. A rewrite is
        waited for in the cache (under the lock) before the next reconciliation counts
        the neighbours again."""
        async with self.reconcile_lock:
            for _ in range(5):
                on_node = await self.pods().views(listed, partial(complete, resource=resource))
                others = held_by_others(((p.namespace, p.name, p.phase, p.assignment)
                                         for p in on_node.values() if self.granted(p)),
                                        (pod.namespace, pod.name))
                step = self.plan(where, pod, container, chosen, others, policy=policy,
                                 per_gpu=per_gpu)
                if not isinstance(step, Configure) or not step.rewrite:
                    assert isinstance(step, Configure | Refuse)
                    return step
                value = encode_assignment(step.placement)
                try:
                    written = await self.cluster.rewrite_assignment(pod, value)
                except Conflict:  # the assignment changed meanwhile: decide again
                    pod = await self.pod(pod.namespace, pod.name, where)
                    continue
                except NotFound:
                    return Refuse(f"{where}: the pod no longer exists in the API")
                except KubeError as e:
                    return Refuse(f"{where}: cannot rewrite the assignment: {e}")
                await self._await_cache(written, value)
                gpus = list(dict.fromkeys(chosen))  # percent IDs name a GPU many times
                log.info("reconciled", pod=f"{pod.namespace}/{pod.name}", container=container,
                         gpus=gpus)
                await self.cluster.pod_event(
                    pod, "VgpuReassigned", f"container {container!r} runs on "
                    f"{', '.join(gpus)} (kubelet's choice); the assignment was updated",
                    warning=False)
                return step
            return Refuse(f"{where}: the assignment kept changing while it was being "
                          f"reconciled")

    async def _await_cache(self, pod: PodView, value: str) -> None:
        """Wait (``rewrite_wait`` at most) for the watched pods to show the assignment
        just written on ``pod``, or a pod that replaced it."""
        def shown(cached: PodView | None) -> bool:
            return cached is not None and (cached.uid != pod.uid
                                           or cached.annotations.get(ASSIGNMENT) == value)
        if not await self.pods().wait_until(pod.namespace, pod.name, shown, self.rewrite_wait):
            log.warning("rewrite_not_yet_watched", pod=f"{pod.namespace}/{pod.name}",
                        waited=self.rewrite_wait)
