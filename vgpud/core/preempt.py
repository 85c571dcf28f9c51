"""GPU-aware preemption: which pods must leave a node for a higher-priority pod to fit.

kube-scheduler chooses preemption victims by the resources it knows (CPU, memory, the
vGPU *count*), never by GPU memory or cores, so its victims may free nothing the
pod's GPUs need. Its ``preempt`` extender verb lets us correct each proposal:

* the proposed victims are kept (kube-scheduler needs them for its own resources);
* if the pod then fits the node's GPUs (:func:`~vgpud.core.choose.place_released`,
  the same placement as bind), the proposal stands as it was;
* otherwise more GPU holders of *lower* Kubernetes priority on that node are added.
  As kube-scheduler does for its own victims: every lower-priority holder is removed,
  the fit is checked, then holders are *reprieved* one by one (put back if the pod
  still fits), those whose eviction would violate a PodDisruptionBudget first, then
  the most important first (higher priority, then the smaller charge, then the older
  start). What is left is minimal (no victim can be spared) and takes the least
  important pods, the largest first, so the fewest leave;
* a node where even that is not enough is dropped, with the reason.

A pod of equal or higher priority is never a victim: a proposal naming one (stale
data on either side) drops the node. A pod already being deleted is not a victim
either; its room is counted as leaving. Only *confirmed* holders are added (a bind
in flight is not yet a pod kube-scheduler could evict on that node).

PDB accounting follows kube-scheduler's: each matching budget (same namespace,
selector matches the pod's labels as policy/v1 defines selectors, the pod not already in
its ``disruptedPods``) is decremented per victim; a victim that takes one below zero is a
violation.

Pure: the caller supplies the ledger's holders and the pods' priority and labels
(:class:`Holder`), and the budgets (:class:`Budget`); the result is a value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from vgpud.core.choose import place_released
from vgpud.core.cluster import Cluster
from vgpud.core.ledger import Entry, Ledger, State
from vgpud.core.model import ZERO, GpuUsage, Placement, PodRequest


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` term of a label selector."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        return False


@dataclass(frozen=True, slots=True)
class Budget:
    """A PodDisruptionBudget, as preemption reads it.

    Its selector as policy/v1 defines it (and the eviction API and the disruption
    controller apply it): an empty selector ``{}`` selects every pod of the namespace,
    labelled or not; a missing one (``selects_nothing``) selects none. kube-scheduler up
    to 1.37 reads both as selecting nothing (fixed upstream in kubernetes#141785)."""

    namespace: str
    name: str
    match_labels: tuple[tuple[str, str], ...]
    match_expressions: tuple[Requirement, ...]
    disruptions_allowed: int
    disrupted: frozenset[str] = frozenset()  # pod names the API already counted
    selects_nothing: bool = False  # no selector, or one that cannot be read

    def selects(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        # a pod in disruptedPods is already counted
        if namespace != self.namespace or self.selects_nothing or name in self.disrupted:
            return False
        return (all(labels.get(k) == v for k, v in self.match_labels)
                and all(r.matches(labels) for r in self.match_expressions))


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod that holds GPUs on the node, with what preemption must know of it."""

    uid: str
    namespace: str
    name: str
    priority: int
    placement: Placement
    labels: tuple[tuple[str, str], ...] = ()
    start_time: str = ""  # RFC 3339; "" (unknown) sorts as the newest
    deleting: bool = False
    confirmed: bool = True

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Proposal:
    """kube-scheduler's victims on one node: their uids and its PDB-violation count.
    ``known`` carries what the request itself said of them (full pods, when the
    extender is not node-cache capable): namespace, name and labels by uid."""

    uids: tuple[str, ...]
    pdb_violations: int = 0
    known: Mapping[str, tuple[str, str, tuple[tuple[str, str], ...]]] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer for one node: the victims (None: the node is dropped), the PDB
    violations among them, the GPU victims added to kube-scheduler's, and why."""

    node: str
    victims: tuple[str, ...] | None
    pdb_violations: int
    added: tuple[str, ...]
    reason: str


def _release(charges: Iterable[Mapping[str, GpuUsage]]) -> dict[str, GpuUsage]:
    out: dict[str, GpuUsage] = {}
    for ch in charges:
        for uuid, u in ch.items():
            out[uuid] = out.get(uuid, ZERO) + u
    return out


def _gpus_of(p: Placement) -> set[str]:
    return {d.uuid for c in p.containers for d in c.devices}


def _violations(victims: Sequence[tuple[str, str, Mapping[str, str]]],
                budgets: Sequence[Budget], allowed: list[int]) -> list[bool]:
    """For each victim (namespace, name, labels), in order: does it violate a budget?
    ``allowed`` (per budget) is decremented as kube-scheduler does."""
    out = []
    for ns, name, labels in victims:
        hit = False
        for i, b in enumerate(budgets):
            if b.selects(ns, name, labels):
                allowed[i] -= 1
                hit = hit or allowed[i] < 0
        out.append(hit)
    return out


def select_victims(cluster: Cluster, pod: PodRequest, priority: int, node: str,
                   proposal: Proposal, holders: Sequence[Holder],
                   budgets: Sequence[Budget] = ()) -> Outcome:
    """Correct kube-scheduler's ``proposal`` for ``node``: see the module docstring."""
    if not cluster.has_node(node):
        return Outcome(node, None, 0, (), f"node {node} has no vgpud GPU inventory")
    by_uid = {h.uid: h for h in holders}
    proposed = set(proposal.uids)
    for uid in proposal.uids:
        h = by_uid.get(uid)
        if h is not None and h.priority >= priority:
            return Outcome(node, None, 0, (), f"proposed victim {h.key} has priority "
                           f"{h.priority}, not lower than the pod's {priority}")
    leaving = [h for h in holders if h.uid in proposed or h.deleting]
    charges = {h.uid: h.placement.charge() for h in holders}
    released = _release(charges[h.uid] for h in leaving)
    got = place_released(cluster, pod, node, released)
    if isinstance(got, Placement):
        return Outcome(node, proposal.uids, proposal.pdb_violations, (),
                       "the proposed victims free enough GPU room")
    extra = [h for h in holders
             if h.uid not in proposed and not h.deleting and h.confirmed
             and h.priority < priority]
    if not extra:
        return Outcome(node, None, 0, (), f"no lower-priority pod holds GPUs that would "
                       f"make room: {got}")
    everything = _release([released, *(charges[h.uid] for h in extra)])
    got = place_released(cluster, pod, node, everything)
    if not isinstance(got, Placement):
        return Outcome(node, None, 0, (), "evicting every lower-priority GPU pod still "
                       f"leaves too little: {got}")

    # kube-scheduler's budgets start where its own victims left them.
    allowed = [b.disruptions_allowed for b in budgets]
    known = proposal.known or {}
    ahead = []
    for uid in proposal.uids:
        h = by_uid.get(uid)
        if h is not None:
            ahead.append((h.namespace, h.name, dict(h.labels)))
        elif uid in known:
            ns, name, labels = known[uid]
            ahead.append((ns, name, dict(labels)))
    _violations(ahead, budgets, allowed)
    flags = _violations([(h.namespace, h.name, dict(h.labels)) for h in extra], budgets,
                        list(allowed))
    violating = {h.uid for h, f in zip(extra, flags, strict=True) if f}

    def importance(h: Holder) -> tuple[int, int, str]:
        # reprieved first: higher priority, smaller, older ("" = unknown = newest)
        size = sum(u.memory + 100 * u.cores for u in charges[h.uid].values())
        return (-h.priority, size, h.start_time or "~")

    order = (sorted((h for h in extra if h.uid in violating), key=importance)
             + sorted((h for h in extra if h.uid not in violating), key=importance))
    # Reprieve one by one, keeping the released total up to date. Putting a holder back
    # takes room only on its own GPUs: when the last placement that fitted used none
    # of them, it still fits, and no new placement is needed.
    free = dict(everything)
    gone: set[str] = set()
    using = _gpus_of(got)
    for h in order:
        ch = charges[h.uid]
        for uuid, u in ch.items():
            free[uuid] = free[uuid] - u
        if using.isdisjoint(ch):
            continue
        trial = place_released(cluster, pod, node, free)
        if isinstance(trial, Placement):
            using = _gpus_of(trial)
            continue
        for uuid, u in ch.items():  # it must go
            free[uuid] = free[uuid] + u
        gone.add(h.uid)
    added = tuple(h.uid for h in extra if h.uid in gone)
    chosen = [by_uid[u] for u in added]
    more = sum(_violations([(h.namespace, h.name, dict(h.labels)) for h in chosen], budgets,
                           allowed))
    names = ", ".join(by_uid[u].key for u in added)
    return Outcome(node, proposal.uids + added, proposal.pdb_violations + more, added,
                   f"GPU room needs {len(added)} more victims: {names}")


def holders_on(ledger: Ledger, node: str,
               describe: Callable[[Entry], Holder | None]) -> list[Holder]:
    """The ledger's entries on ``node`` as :class:`Holder` values; ``describe`` adds the
    pod's priority and labels (None: unknown pod, which is never a victim)."""
    out = []
    for e in ledger.on_node(node):
        h = describe(e)
        if h is not None:
            out.append(h if e.state is State.CONFIRMED else replace(h, confirmed=False))
    return out


def preempt(cluster: Cluster, ledger: Ledger, pod: PodRequest, priority: int,
            proposals: Mapping[str, Proposal], describe: Callable[[Entry], Holder | None],
            budgets: Sequence[Budget] = ()) -> dict[str, Outcome]:
    """:func:`select_victims` for every proposed node."""
    return {node: select_victims(cluster, pod, priority, node, p,
                                 holders_on(ledger, node, describe), budgets)
            for node, p in proposals.items()}
