"""Leader election on a coordination.k8s.io/v1 Lease.

The algorithm is client-go's: every ``retry_period`` the elector reads the Lease.
If another identity holds it and its record has not changed for
``lease_duration`` seconds *of our own clock* (we never compare the timestamps
written in the Lease with our clock, so clock skew between nodes does not matter),
or nobody holds it, the elector writes itself in as holder with a replace that
carries the Lease's resourceVersion: of two candidates only one write succeeds.
The leader renews the same way; if no renewal succeeds for ``renew_deadline``
seconds, or another identity is seen holding the Lease, leadership is lost and the
elector goes back to being a candidate. On exit (cancellation) a leader releases
the Lease (empty holder) so a successor takes over at once.

``is_leader``, ``on_change(bool)``, ``wait_leading()`` and ``wait_not_leading()``
report transitions. Run it in the caller's task group::

    elector = LeaderElector(kube, name="vgpu-scheduler", namespace="kube-system",
                            identity=pod_name)
    await tg.start(elector.run)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import structlog
from anyio.abc import TaskStatus

from vgpud.kube.client import Json, KubeClient
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import KubeError, NotFound
from vgpud.kube.resources import LEASES
from vgpud.kube.timestamps import rfc3339_micro

log = structlog.get_logger(__name__)


class LeaderElector:
    def __init__(
        self,
        kube: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_exit: bool = True,
        on_change: Callable[[bool], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not identity:
            raise ValueError("a leader election identity must not be empty")
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_exit = release_on_exit
        self.on_change = on_change
        self.clock = clock
        self.is_leader = False
        self.transitions = 0  # how often this elector became leader
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._holder = ""
        self._leading = anyio.Event()
        self._not_leading = anyio.Event()
        self._not_leading.set()

    @property
    def holder(self) -> str:
        """The holder identity this elector last saw in the Lease."""
        return self._holder

    async def wait_leading(self) -> None:
        await self._leading.wait()

    async def wait_not_leading(self) -> None:
        await self._not_leading.wait()

    def _set(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        self.is_leader = leading
        if leading:
            self.transitions += 1
            self._leading.set()
            self._not_leading = anyio.Event()
            log.info("leader_elected", lease=self.name, identity=self.identity)
        else:
            self._not_leading.set()
            self._leading = anyio.Event()
            log.warning("leader_lost", lease=self.name, identity=self.identity)
        if self.on_change is not None:
            self.on_change(leading)

    def _observe(self, lease: Json) -> None:
        spec = lease.get("spec") or {}
        record = (
            spec.get("holderIdentity") or "",
            spec.get("renewTime"),
            spec.get("acquireTime"),
            spec.get("leaseTransitions"),
            spec.get("leaseDurationSeconds"),
        )
        self._holder = record[0]
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock.now()

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this elector holds the Lease afterwards."""
        now_wall = rfc3339_micro(self.clock.wall())
        try:
            lease = await self.kube.request("GET", LEASES.object_path(self.name, self.namespace))
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": math.ceil(self.lease_duration),
                    "acquireTime": now_wall,
                    "renewTime": now_wall,
                    "leaseTransitions": 0,
                },
            }
            try:
                created = await self.kube.request(
                    "POST", LEASES.collection_path(self.namespace), body=body
                )
            except KubeError as exc:
                log.debug("lease_create_failed", lease=self.name, error=str(exc))
                return False
            self._observe(created)
            return True
        except KubeError as exc:
            log.debug("lease_read_failed", lease=self.name, error=str(exc))
            return False
        self._observe(lease)
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        held_by_other = bool(holder) and holder != self.identity
        if held_by_other and self._observed_at + duration > self.clock.now():
            return False
        if holder != self.identity:
            spec["acquireTime"] = now_wall
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = math.ceil(self.lease_duration)
        spec["renewTime"] = now_wall
        meta = lease.get("metadata") or {}
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": meta.get("resourceVersion"),
            },
            "spec": spec,
        }
        try:
            updated = await self.kube.request(
                "PUT", LEASES.object_path(self.name, self.namespace), body=body)
        except KubeError as exc:
            log.debug("lease_update_failed", lease=self.name, error=str(exc))
            return False
        self._observe(updated)
        return True

    async def release(self) -> None:
        """Give the Lease up if we hold it (empty holder, 1 s duration)."""
        try:
            lease = await self.kube.request(
                "GET", LEASES.object_path(self.name, self.namespace))
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            now_wall = rfc3339_micro(self.clock.wall())
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now_wall)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion"),
                },
                "spec": spec,
            }
            await self.kube.request(
                "PUT", LEASES.object_path(self.name, self.namespace), body=body)
            log.info("leader_released", lease=self.name, identity=self.identity)
        except KubeError as exc:
            log.warning("lease_release_failed", lease=self.name, error=str(exc))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> NoReturn:
        """Campaign, lead, lose, campaign again — until cancelled."""
        task_status.started()
        try:
            while True:
                while not await self.try_acquire_or_renew():
                    await self.clock.sleep(self.retry_period)
                self._set(True)
                last_renew = self.clock.now()
                while True:
                    await self.clock.sleep(self.retry_period)
                    if await self.try_acquire_or_renew():
                        last_renew = self.clock.now()
                        continue
                    if self._holder and self._holder != self.identity:
                        break  # someone else holds it now
                    if self.clock.now() - last_renew >= self.renew_deadline:
                        break
                self._set(False)
        finally:
            if self.is_leader and self.release_on_exit:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                    await self.release()
            self._set(False)
