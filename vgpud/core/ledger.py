"""The allocation ledger: which pod holds what on which GPU.

The state machine of one pod's entry (after kube-scheduler's cache)::

    (none) --assume--> ASSUMED --confirm--> CONFIRMED
              ^            |                    |
              |     forget / expire          forget
              +------------+--------------------+

* ``assume`` is the scheduler's bind: it checks capacity and holds the placement
  for ``ttl`` seconds. It is idempotent for the same placement.
* ``confirm`` is the informer seeing the pod's ``vgpud.io/assignment``: the entry
  becomes permanent. Reality wins: an assignment that was never assumed here (a
  restart, another replica) is recorded even if it exceeds capacity (the node then
  admits nothing more until it drains); a changed one replaces the old charge.
* ``forget`` is a failed bind or a pod that ended; ``expire`` drops assumptions that
  were never confirmed (HAMi#2923: stale reservations block nodes forever).

Each namespace's total (:meth:`Ledger.namespace_use`: vGPU memory and cores its entries
hold, assumed and confirmed, counted as :func:`vgpud.core.quota.placement_use` counts a
pod) is kept as entries come and go, for the namespace quota.

Invariants (while only ``assume`` adds): per GPU, held memory ≤ memory × scaling,
cores ≤ 100 × core scaling, vGPUs ≤ split (each pod charged the maximum over its
phases, :meth:`~vgpud.core.model.Placement.charge`), and a pod that holds a GPU
exclusively (in any of its phases) shares it with no other pod. Its own other phases
may use that GPU: they never run at the same time as the exclusive one.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, replace

from vgpud.core.cluster import Cluster
from vgpud.core.fit import room
from vgpud.core.model import ZERO, GpuUsage, Placement, Reason
from vgpud.core.quota import NONE, Use, placement_totals, placement_use


class State(enum.Enum):
    ASSUMED = "assumed"
    CONFIRMED = "confirmed"


@dataclass(frozen=True, slots=True)
class Entry:
    uid: str
    key: str  # namespace/name, for messages
    placement: Placement
    state: State
    deadline: float | None


def same_placement(a: Placement, b: Placement) -> bool:
    """The same GPUs for the same containers, whenever each was stamped."""
    return replace(a, time="") == replace(b, time="")


class Ledger:
    """Entries by pod uid, applied to a :class:`Cluster`'s usage totals."""

    def __init__(self, cluster: Cluster, ttl: float = 120.0) -> None:
        self.cluster = cluster
        self.ttl = ttl
        self._entries: dict[str, Entry] = {}
        self._on_node: dict[str, dict[str, None]] = {}  # node -> uids (insertion order)
        self._deadlines: list[tuple[float, str]] = []
        self._assumed = 0  # entries in State.ASSUMED, kept as they change
        # namespace -> [MiB, percent] its entries take (vgpud.core.quota), kept as they change
        self._namespaces: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, uid: object) -> bool:
        return uid in self._entries

    def get(self, uid: str) -> Entry | None:
        return self._entries.get(uid)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def counts(self) -> dict[State, int]:
        """Entries by state, without walking them (metrics ask at every scrape)."""
        return {State.ASSUMED: self._assumed,
                State.CONFIRMED: len(self._entries) - self._assumed}

    def on_node(self, node: str) -> list[Entry]:
        """The entries placed on ``node`` (preemption looks for victims there)."""
        return [self._entries[uid] for uid in self._on_node.get(node, ())]

    def namespace_use(self, namespace: str) -> Use:
        """What the namespace's entries (confirmed and assumed) take, for its quota."""
        t = self._namespaces.get(namespace)
        return Use(t[0], t[1]) if t is not None else NONE

    def namespaces(self) -> dict[str, Use]:
        return {ns: Use(t[0], t[1]) for ns, t in self._namespaces.items()}

    def _count(self, e: Entry, sign: int) -> None:
        ns = e.key.partition("/")[0]
        memory, cores = placement_totals(e.placement)
        t = self._namespaces.get(ns)
        if t is None:
            t = self._namespaces[ns] = [0, 0]
        t[0] += sign * memory
        t[1] += sign * cores
        if sign < 0 and t[0] == 0 and t[1] == 0:
            del self._namespaces[ns]

    def room(self, placement: Placement, held: dict[str, GpuUsage] | None = None) -> Reason | None:
        """Why ``placement`` would break an invariant now; None when it fits."""
        held = held if held is not None else placement.charge()
        for uuid, c in held.items():
            cap = self.cluster.capacity(placement.node, uuid)
            if cap is None:
                return Reason("unknown-gpu", f"node {placement.node} has no GPU {uuid}", False)
            why = room(uuid, cap, self.cluster.usage(placement.node, uuid), c)
            if why is not None:
                return why
        return None

    def assume(self, uid: str, key: str, placement: Placement, now: float) -> Reason | None:
        """Hold ``placement`` for ``uid`` until confirmed or ``ttl`` passes."""
        old = self._entries.get(uid)
        if old is not None:
            if same_placement(old.placement, placement):
                return None
            return Reason("already-placed", f"pod {key} already holds GPUs on "
                          f"{old.placement.node}", False)
        held = placement.charge()
        why = self.room(placement, held)
        if why is not None:
            return why
        deadline = now + self.ttl
        self._add(Entry(uid, key, placement, State.ASSUMED, deadline), held)
        heapq.heappush(self._deadlines, (deadline, uid))
        return None

    def confirm(self, uid: str, key: str, placement: Placement) -> None:
        """The API says ``uid`` holds ``placement``: make it permanent."""
        old = self._entries.get(uid)
        if old is not None:
            if same_placement(old.placement, placement):
                if old.state is State.ASSUMED:
                    self._entries[uid] = replace(old, state=State.CONFIRMED, deadline=None,
                                                 placement=placement)
                    self._assumed -= 1
                return
            self._drop(old)
        self._add(Entry(uid, key, placement, State.CONFIRMED, None))

    def forget(self, uid: str) -> bool:
        """Release whatever ``uid`` holds; True if it held something."""
        old = self._entries.get(uid)
        if old is None:
            return False
        self._drop(old)
        return True

    def expire(self, now: float) -> list[Entry]:
        """Drop assumptions past their deadline; return them."""
        gone = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, uid = heapq.heappop(self._deadlines)
            e = self._entries.get(uid)
            if e is not None and e.state is State.ASSUMED and e.deadline == deadline:
                self._drop(e)
                gone.append(e)
        return gone

    def violations(self) -> list[str]:
        """Every broken invariant, recomputed from the entries (for tests and /debug)."""
        totals: dict[tuple[str, str], GpuUsage] = {}
        holders: dict[tuple[str, str], list[Entry]] = {}
        for e in self._entries.values():
            for uuid, c in e.placement.charge().items():
                k = (e.placement.node, uuid)
                totals[k] = totals.get(k, ZERO) + c
                holders.setdefault(k, []).append(e)
        out = []
        for (node, uuid), t in totals.items():
            if self.cluster.usage(node, uuid) != t:
                out.append(f"{node}/{uuid}: cluster holds {self.cluster.usage(node, uuid)}, "
                           f"entries add up to {t}")
            cap = self.cluster.capacity(node, uuid)
            if cap is None:
                continue
            if t.memory > cap.memory or t.cores > cap.cores or t.vgpus > cap.vgpus:
                out.append(f"{node}/{uuid}: {t} exceeds capacity {cap}")
            pods = holders[(node, uuid)]
            if t.exclusive and len(pods) > 1:
                out.append(f"{node}/{uuid}: held exclusively but shared by "
                           f"{', '.join(sorted(e.key for e in pods))}")
        out += self.cluster.drift()
        assumed = sum(e.state is State.ASSUMED for e in self._entries.values())
        spaces: dict[str, Use] = {}
        for e in self._entries.values():
            ns = e.key.partition("/")[0]
            spaces[ns] = spaces.get(ns, NONE) + placement_use(e.placement)
        kept = self.namespaces()
        if {k: v for k, v in spaces.items() if v != NONE} != {
                k: v for k, v in kept.items() if v != NONE}:
            out.append(f"namespace totals {kept} differ from the entries' {spaces}")
        if assumed != self._assumed:
            out.append(f"{assumed} entries are assumed but the count says {self._assumed}")
        return out

    def _add(self, e: Entry, held: dict[str, GpuUsage] | None = None) -> None:
        self._entries[e.uid] = e
        self._assumed += e.state is State.ASSUMED
        self._on_node.setdefault(e.placement.node, {})[e.uid] = None
        self.cluster.add_usage(e.placement.node, held or e.placement.charge(), +1)
        self._count(e, +1)

    def _drop(self, e: Entry) -> None:
        # The charge is derived again rather than stored: 50,000 entries' dicts cost
        # more memory than recomputing one on release costs time.
        del self._entries[e.uid]
        self._assumed -= e.state is State.ASSUMED
        uids = self._on_node[e.placement.node]
        del uids[e.uid]
        if not uids:
            del self._on_node[e.placement.node]
        self.cluster.add_usage(e.placement.node, e.placement.charge(), -1)
        self._count(e, -1)
