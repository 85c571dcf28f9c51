"""The extender's verbs: parse (``wire``), decide (``vgpud.core``), write (``vgpud.kube``).

There is no node lock: any number of binds may be in flight, on one node or many.
Each bind *assumes* its placement in the ledger before its first await, so two
binds can never both take the last room on a GPU; a failed write releases the placement
it assumed, and only that one. A write that may have landed (unanswered, or a 409 to a
retry of one) is read back before its room is given up, and kept while the pod cannot
be read; a bind of a pod whose bind is still in flight is refused (kube-scheduler gives
up on a call sooner than a bind's retries end). (The ``SerialBindNode`` gate adds a
lock per node, for those who want it.) A bind is one API write: the Binding carries the
assignment annotation, which kube-apiserver puts on the pod in the update that sets its
node.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

import anyio
import numpy as np
import structlog

from vgpud.core.admission import pod_risk
from vgpud.core.allocate import MAX_SCORE, MAX_TIED, Allocator, Filtered, summarize
from vgpud.core.codec import ASSIGNMENT, CodecError, decode_assignment, encode_assignment
from vgpud.core.dra import MODE_DRA, NODE_MODE_LABEL
from vgpud.core.ledger import Entry, State, same_placement
from vgpud.core.model import Placement, PodRequest, Reason, TopologyMode
from vgpud.core.preempt import Budget, Holder, Proposal, preempt
from vgpud.core.quota import (
    NONE,
    QUOTA_CODE,
    Quota,
    Use,
    exceeds,
    placement_use,
    request_use,
)
from vgpud.core.requests import RequestError, parse_pod
from vgpud.extender.metrics import Metrics
from vgpud.extender.wire import (
    BindingArgs,
    BindingResultJson,
    ExtenderArgs,
    FilterResultJson,
    PreemptionArgs,
    RawJson,
    filter_result,
    host_priorities,
    preemption_result,
)
from vgpud.kube.clock import SYSTEM_CLOCK, Clock
from vgpud.kube.errors import KubeError, NotFound, Unavailable
from vgpud.kube.timestamps import rfc3339
from vgpud.kube.writes import EventRecorder, ObjectRef, PodBinder
from vgpud.scheduling.projections import holder
from vgpud.scheduling.state import SchedulerState

log = structlog.get_logger()
MAX_ROUNDS = 4  # rounds of MAX_TIED top-scored nodes prioritize checks the pod still fits


def describe(p: Placement) -> str:
    parts = []
    for c in p.containers:
        devs = ", ".join(f"{d.uuid} ({d.memory} MiB, {d.cores}%)" for d in c.devices)
        parts.append(f"{c.name}: {devs}")
    return f"GPUs on {p.node}: " + "; ".join(parts)


class Extender:
    def __init__(
        self,
        state: SchedulerState,
        *,
        writer: PodBinder | None,
        events: EventRecorder | None,
        metrics: Metrics,
        clock: Clock = SYSTEM_CLOCK,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object] | None = None,
        budgets: Callable[[], Sequence[Budget]] = lambda: (),
        serial_binds: bool = False,
        allow_privileged: bool = False,
        topology: bool = True,
    ) -> None:
        self.state = state
        self.alloc: Allocator = state.alloc
        self.writer = writer
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.spawn = spawn  # runs event writes beside the request, not in its path
        self.budgets = budgets  # the PodDisruptionBudgets, for preemption
        # SerialBindNode: one bind at a time per node, for users who want the peers'
        # behaviour. Off by default: the ledger's assume makes concurrent binds safe.
        self.serial_binds = serial_binds
        # the webhook's security refusals, again (a pod it did not see): allowPrivilegedGPUPods
        self.allow_privileged = allow_privileged
        # GPUTopology: off, a pod's link topology mode is ignored (VGPU-Manager's gate)
        self.topology = topology
        self._node_locks: dict[str, tuple[anyio.Lock, int]] = {}
        self.binds_in_flight = 0
        self._binding: set[str] = set()  # uids with a bind in flight

    def stamp(self) -> str:
        """Now on the clock, as the RFC 3339 ``Time`` placements and refusals carry."""
        return rfc3339(self.clock.wall())

    def _parse(self, pod: dict[str, object]) -> PodRequest:
        req = parse_pod(pod, self.alloc.defaults)
        if not self.topology and req.topology is TopologyMode.LINK:
            return dataclasses.replace(req, topology=TopologyMode.NONE)
        return req

    async def _event(self, pod: dict[str, object] | ObjectRef, reason: str, message: str,
                     kind: str = "Normal") -> None:
        if self.events is None:
            return
        ref = pod if isinstance(pod, ObjectRef) else ObjectRef.of(pod)
        recorder = self.events

        async def write() -> None:
            await recorder.record(ref, reason, message, type=kind)

        if self.spawn is not None:
            self.spawn(write)
        else:
            await write()

    # -- filter -----------------------------------------------------------------------------

    async def filter(self, args: ExtenderArgs) -> FilterResultJson:
        try:
            req = self._parse(args.pod)
        except RequestError as e:
            msg = f"invalid GPU request: {e}"
            self.metrics.rejections.labels("invalid-request").inc(len(args.node_names))
            await self._event(args.pod, "InvalidGPURequest", msg, "Warning")
            return filter_result(args, [], {}, dict.fromkeys(args.node_names, msg))
        if not req.wants_gpu:
            return filter_result(args, list(args.node_names), {}, {})
        risk = None if self.allow_privileged else pod_risk(
            args.pod, (c.name for c in req.containers))
        if risk:
            self.metrics.rejections.labels("unsafe-container").inc(len(args.node_names))
            await self._event(args.pod, "UnsafeGPUContainer", risk, "Warning")
            return filter_result(args, [], {}, dict.fromkeys(args.node_names, risk))
        self.state.remember(req)
        quotas = self.state.quotas_in(req.namespace)
        fixed = request_use(req) if quotas else None
        if quotas and fixed is not None:  # the same wherever it goes: one answer
            why = exceeds(quotas, self._namespace_use(req), fixed, req.namespace)
            if why is not None:
                self.metrics.rejections.labels(QUOTA_CODE).inc(len(args.node_names))
                self.state.refuse(req, why.message, self.stamp())
                return filter_result(args, [], {}, dict.fromkeys(args.node_names, why.message))
        got = self.alloc.filter(req, args.node_names)
        if quotas and fixed is None and got.feasible:
            got = self._quota_per_node(req, got, quotas)
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for name, reason in got.failed.items():
            if name in self.state.dra_nodes:  # not the extender's: say whose it is
                reason = Reason("dra-node", f"node {name}'s GPUs are managed by DRA (label "
                                f"{NODE_MODE_LABEL}={MODE_DRA}): a vGPU pod reaches them "
                                "through a ResourceClaim, not through this scheduler", False)
            (failed if reason.resolvable else unresolvable)[name] = reason.message
            self.metrics.rejections.labels(reason.code).inc()
        if got.feasible:
            self.state.refused.pop(req.uid, None)
        elif got.failed:
            self.state.refuse(req, summarize(got.failed).message, self.stamp())
        return filter_result(args, got.feasible, failed, unresolvable)

    def _namespace_use(self, req: PodRequest) -> Use:
        """What the pod's namespace takes now, the pod's own entry (if any) left out."""
        used = self.alloc.ledger.namespace_use(req.namespace)
        own = self.alloc.ledger.get(req.uid) if req.uid else None
        return used - placement_use(own.placement) if own is not None else used

    def _quota_per_node(self, req: PodRequest, got: Filtered,
                        quotas: Sequence[Quota]) -> Filtered:
        """A pod whose memory is a share of its GPUs: what it takes on each feasible
        node is what its placement there grants (one placement per node, only for a
        namespace with a vGPU quota)."""
        used = self._namespace_use(req)
        feasible, failed = [], dict(got.failed)
        for node in got.feasible:
            p = self.alloc.place(req, node)
            why = exceeds(quotas, used, placement_use(p) if isinstance(p, Placement) else NONE,
                          req.namespace)
            if why is None:
                feasible.append(node)
            else:
                failed[node] = why
        return Filtered(feasible, failed)

    # -- prioritize -------------------------------------------------------------------------

    def prioritize(self, args: ExtenderArgs) -> RawJson:
        """The HostPriorityList, rendered here: 5,000 dicts would cost more than the
        scoring itself."""
        try:
            req = self._parse(args.pod)
        except RequestError:
            return host_priorities(list(args.node_names), [0] * len(args.node_names))
        if not req.wants_gpu:
            return host_priorities(list(args.node_names), [0] * len(args.node_names))
        known, scores = self.alloc.score_array(req, args.node_names)
        ints = np.clip(np.rint(scores), 0, MAX_SCORE).astype(np.int64).tolist()
        self._settle_top(req, known, ints)
        if len(known) != len(args.node_names):  # nodes without inventory score 0
            by_name = dict(zip(known, ints, strict=True))
            known = list(args.node_names)
            ints = [by_name.get(n, 0) for n in known]
        return host_priorities(known, ints)

    def _settle_top(self, req: PodRequest, known: list[str], ints: list[int]) -> None:
        """Make the best scores ones the pod can still take, and record its intent there.

        kube-scheduler binds to one of the top-scored nodes (a tie at random). Since
        this pod's filter, other binds may have filled a node (filter was exact then),
        and other pods' intents may have spoken for its room: such a node scores 0 here, and
        the next best are tried, a few ties at a time, so that the bind that follows
        finds its GPUs free."""
        for _ in range(MAX_ROUNDS):
            top = max(ints, default=0)
            if top == 0:
                return
            tied = [i for i, v in enumerate(ints) if v == top][:MAX_TIED]
            placed = set(self.alloc.intend(req, [known[i] for i in tied]))
            for i in tied:
                if known[i] not in placed:
                    ints[i] = 0
            if placed:
                return

    # -- preempt --------------------------------------------------------------------------

    def _holder(self, e: Entry) -> Holder | None:
        ns, _, name = e.key.partition("/")
        return holder(self.state.pod_by_name(ns, name), e)

    async def preempt(self, args: PreemptionArgs) -> dict[str, Any]:
        """Keep each node kube-scheduler proposes only if its victims (and, where
        needed, more lower-priority GPU pods there) free the room the pod's GPUs need;
        see :mod:`vgpud.core.preempt`. An invalid GPU request gets no candidates."""
        try:
            req = self._parse(args.pod)
        except RequestError as e:
            await self._event(args.pod, "InvalidGPURequest", f"invalid GPU request: {e}",
                              "Warning")
            return preemption_result({})
        if not req.wants_gpu:
            return preemption_result(args.victims)
        proposals = {node: Proposal(uids, n, args.known)
                     for node, (uids, n) in args.victims.items()}
        outcomes = preempt(self.alloc.cluster, self.alloc.ledger, req, args.priority,
                           proposals, self._holder, self.budgets())
        kept: dict[str, tuple[tuple[str, ...], int]] = {}
        for node, o in outcomes.items():
            self.metrics.preemption.labels(
                "dropped" if o.victims is None else "extended" if o.added else "kept").inc()
            if o.victims is not None:
                kept[node] = (o.victims, o.pdb_violations)
        log.info("preemption", pod=args.key, proposed=len(outcomes), kept=len(kept),
                 reasons={n: o.reason for n, o in list(outcomes.items())[:8]})
        if not kept and outcomes:
            first = next(iter(outcomes.values()))
            await self._event(args.pod, "GPUPreemptionNotHelpful",
                              f"no proposed node can be made to fit the pod's GPUs by "
                              f"evicting lower-priority pods ({first.node}: {first.reason})",
                              "Warning")
        return preemption_result(kept)

    # -- bind -------------------------------------------------------------------------------

    async def bind(self, args: BindingArgs) -> BindingResultJson:
        if self.writer is None:
            return {"Error": "binding is disabled (no API connection)"}
        if args.uid in self._binding:  # kube-scheduler gave up on it, not the API server
            return {"Error": f"a bind of pod {args.namespace}/{args.name} is still in "
                             f"flight; try again once it has ended"}
        if args.uid:
            self._binding.add(args.uid)
        self.binds_in_flight += 1
        try:
            if not self.serial_binds:
                return await self._bind(args, self.writer)
            lock, users = self._node_locks.get(args.node) or (anyio.Lock(), 0)
            self._node_locks[args.node] = (lock, users + 1)
            try:
                async with lock:
                    return await self._bind(args, self.writer)
            finally:
                lock, users = self._node_locks[args.node]
                if users == 1:
                    del self._node_locks[args.node]
                else:
                    self._node_locks[args.node] = (lock, users - 1)
        finally:
            self.binds_in_flight -= 1
            self._binding.discard(args.uid)

    async def _bind(self, args: BindingArgs, writer: PodBinder) -> BindingResultJson:
        key = f"{args.namespace}/{args.name}"
        req = self.state.request(args.uid) if args.uid else None
        if req is None:  # not seen by filter (a restart since): the pod itself
            try:
                pod = await writer.read_pod(args.namespace, args.name)
            except NotFound:
                return {"Error": f"pod {key} not found"}
            except KubeError as e:
                return {"Error": f"cannot read pod {key}: {e}"}
            meta = pod.get("metadata") or {}
            if args.uid and meta.get("uid") != args.uid:
                return {"Error": f"pod {key} was replaced (uid {meta.get('uid')}, "
                                 f"expected {args.uid})"}
            try:
                req = self._parse(pod)
            except RequestError as e:
                return {"Error": f"invalid GPU request: {e}"}
        if not req.wants_gpu:
            return {"Error": f"pod {key} asks for no vGPU; vgpud binds only GPU pods"}
        prior = self.alloc.ledger.get(req.uid) if req.uid else None
        if prior is not None and prior.state is State.CONFIRMED:
            # kube-scheduler's retry of a bind that landed: what the Binding would answer
            # (409), and the running pod's placement stays counted
            return {"Error": f"pod {key} is already bound to {prior.placement.node}"}
        if prior is not None and prior.placement.node != args.node:
            # an earlier bind to another node ended without an answer: its room is freed
            # only once the pod is read and shows it did not land
            refused = await self._landed_elsewhere(args, writer, req, key, prior)
            if refused is not None:
                return refused
            prior = None
        # an earlier bind here that never answered: the same GPUs, which it may hold already
        got = prior.placement if prior is not None else self.alloc.place(req, args.node)
        if isinstance(got, Reason):
            return {"Error": f"pod {key} no longer fits {args.node}: {got.message}"}
        placement = replace(got, time=self.stamp())
        quotas = self.state.quotas_in(req.namespace) if prior is None else ()
        if quotas:  # counted with the ledger as assume will find it: no await between
            over = exceeds(quotas, self._namespace_use(req), placement_use(placement),
                           req.namespace)
            if over is not None:
                return {"Error": f"pod {key} cannot be bound: {over.message}"}
        if prior is not None:  # assumed afresh below, so its TTL counts from this bind
            self._release(req.uid, prior.placement)
        why = self.alloc.assume(req, placement)  # atomic: no await since place()
        if why is not None:
            return {"Error": f"pod {key} cannot hold its GPUs on {args.node}: {why.message}"}
        try:  # one write: the Binding carries the assignment (PodBinder.bind)
            await writer.bind(args.namespace, args.name, args.node, uid=req.uid or None,
                              annotations={ASSIGNMENT: encode_assignment(placement)})
        except KubeError as e:
            if isinstance(e, Unavailable) or prior is not None:
                # unanswered, or a 409 to a retry of one unanswered: it may have landed
                return await self._read_back(args, writer, req, key, placement, e)
            self._release(req.uid, placement)
            log.info("bind_failed", pod=key, node=args.node, error=str(e))
            return {"Error": f"could not bind {key} to {args.node}: {e}"}
        # No event here: kube-scheduler records "Scheduled" itself, and the GPUs are in
        # the pod's annotation (vgpud inspect shows them); a second write per bind would
        # double the API load at scale.
        log.info("pod_bound", pod=key, node=args.node, gpus=describe(placement))
        return {"Error": ""}


    def _release(self, uid: str, placement: Placement) -> None:
        """Forget ``uid``'s assumption if it is still ``placement`` (its stamp aside): not
        confirmed by the watch since, nor replaced by a later bind of the pod."""
        entry = self.alloc.ledger.get(uid)
        if (entry is not None and entry.state is State.ASSUMED
                and same_placement(entry.placement, placement)):
            self.alloc.forget(uid)

    async def _landed_elsewhere(self, args: BindingArgs, writer: PodBinder, req: PodRequest,
                                key: str, prior: Entry) -> BindingResultJson | None:
        """Before a bind to another node than an earlier one that never answered: read
        the pod. Not bound: the earlier room is freed and the bind goes on (None). Bound,
        or unreadable: refused, the earlier room still held."""
        where = prior.placement.node
        try:
            pod = await writer.read_pod(args.namespace, args.name)
        except KubeError as e:
            return {"Error": f"pod {key} cannot be bound to {args.node}: an earlier bind to "
                             f"{where} ended unanswered and the pod cannot be read ({e}); "
                             f"its GPUs there stay held until the pod is seen"}
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            return {"Error": f"pod {key} is already bound to {bound}"}
        self._release(req.uid, prior.placement)
        return None

    async def _read_back(self, args: BindingArgs, writer: PodBinder, req: PodRequest,
                         key: str, placement: Placement,
                         error: KubeError) -> BindingResultJson:
        """A bind that may have landed (every attempt unanswered, or a retry of such a
        bind refused as already bound): read the pod back. Bound here with this
        placement, the bind is a success; otherwise its room is freed; unreadable too, the
        room stays held (the watch confirms it, the ledger's TTL frees it): forgetting a
        bind that landed would let another pod into the same room before the watch
        tells."""
        try:
            pod = await writer.read_pod(args.namespace, args.name)
        except KubeError as e:
            log.warning("bind_outcome_unknown", pod=key, node=args.node, error=str(error),
                        read=str(e))
            return {"Error": f"could not bind {key} to {args.node}: {error} (whether it "
                             f"landed is unknown: its GPUs stay held until the pod is seen)"}
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (spec.get("nodeName") == args.node and (not req.uid or meta.get("uid") == req.uid)
                and _granted(meta, placement)):
            log.info("pod_bound", pod=key, node=args.node, gpus=describe(placement),
                     answer_lost=str(error))
            return {"Error": ""}
        self._release(req.uid, placement)
        log.info("bind_failed", pod=key, node=args.node, error=str(error))
        return {"Error": f"could not bind {key} to {args.node}: {error}"}


def _granted(meta: dict[str, Any], placement: Placement) -> bool:
    """Does the pod's assignment annotation say ``placement`` (its stamp aside)?"""
    value = (meta.get("annotations") or {}).get(ASSIGNMENT)
    try:
        found = decode_assignment(value) if isinstance(value, str) else None
    except CodecError:
        return False
    return found is not None and same_placement(found, placement)


def timed(metrics: Metrics, verb: str) -> Callable[[], float]:
    start = time.perf_counter()

    def done() -> float:
        elapsed = time.perf_counter() - start
        metrics.latency.labels(verb).observe(elapsed)
        return elapsed

    return done
