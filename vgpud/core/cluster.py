"""The cluster snapshot: every node's GPUs and what is held against each of them.

Per-GPU numbers live in flat numpy arrays (one *slot* per GPU, a node's slots
contiguous) so that filtering 5,000 nodes is a handful of vector operations rather
than a Python loop. State is incremental: a node update touches that node's slots, a
placement adds or subtracts its charge from the GPUs it names; nothing is recomputed
from all pods (HAMi's filter rebuilds every node's usage from every pod each time).

The ledger (:mod:`vgpud.core.ledger`) decides *what* is held; this module only keeps
the numbers. A charge may name a GPU the node no longer reports (inventory changed):
it is kept per node by uuid and lands on the slot again if the GPU comes back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vgpud.core.model import ZERO, Gpu, GpuUsage, Node, NodeInventory

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]

MIG_PARENT = -2  # the profile_id of a GPU in MIG mode (never -1: "no GPU offers it")


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU of one node, with its capacity and what is free on it."""

    gpu: Gpu
    slot: int
    cap_memory: int
    cap_cores: int
    free_memory: int
    free_cores: int
    free_split: int
    used_vgpus: int
    exclusive: bool


class Cluster:
    """Nodes, their GPUs' capacities, and per-GPU usage totals."""

    def __init__(self, capacity: int = 64) -> None:
        self.node_names: list[str] = []
        self.node_index: dict[str, int] = {}
        self.nodes: list[Node | None] = []
        self.node_labels: list[Mapping[str, str]] = []
        # Usage held on GPUs that have no slot (their node left, or its inventory no
        # longer lists them), by node and uuid: kept until the GPU comes back or its
        # holders release it. Usage on slotted GPUs lives in the arrays only.
        self._orphans: dict[str, dict[str, GpuUsage]] = {}
        # Nodes with the same hardware share a shape id (uuids aside): what a pod can
        # never fit is decided once per shape.
        self.node_shape: list[int] = []
        self._shape_ids: dict[tuple[object, ...], int] = {}
        self._uuid_slot: list[dict[str, int]] = []
        self._free_nodes: list[int] = []
        self.type_names: list[str] = []
        self._type_ids: dict[str, int] = {}
        self.profile_names: list[str] = [""]
        self._profile_ids: dict[str, int] = {"": 0}
        self.generation = 0  # bumped when a node is added, replaced or removed
        self._smallest: tuple[int, GpuUsage] = (-1, ZERO)  # (generation, smallest())
        self.usage_generation = 0  # bumped when what GPUs hold changes
        self._n = 0  # slots in use (including dead ones)
        self._alloc(capacity)
        # Per-node totals, kept incrementally for scoring: capacity and use of
        # memory and cores over the node's GPUs.
        self.node_cap_mem = np.zeros(16, dtype=np.float64)
        self.node_used_mem = np.zeros(16, dtype=np.float64)
        self.node_cap_cores = np.zeros(16, dtype=np.float64)
        self.node_used_cores = np.zeros(16, dtype=np.float64)
        # Each node's slots: the one record of where a node's GPUs live in the arrays.
        self.node_start = np.zeros(16, dtype=np.int64)
        self.node_count = np.zeros(16, dtype=np.int64)

    # -- storage ---------------------------------------------------------------------------------

    def _alloc(self, cap: int) -> None:
        def grow(name: str, dtype: type, fill: int | bool = 0) -> None:
            new: npt.NDArray[np.generic] = np.full(cap, fill, dtype=dtype)
            old = getattr(self, name, None)
            if old is not None:
                new[: len(old)] = old
            setattr(self, name, new)

        grow("node_of", np.int32, -1)
        grow("alive", np.bool_, False)
        grow("healthy", np.bool_, False)
        grow("profile_id", np.int32, 0)
        grow("type_id", np.int32, 0)
        grow("numa", np.int32, 0)
        grow("cap_mem", np.int64)
        grow("cap_cores", np.int64)
        grow("cap_split", np.int64)
        grow("used_mem", np.int64)
        grow("used_cores", np.int64)
        grow("used_split", np.int64)
        grow("excl", np.int64)
        grow("free_mem", np.int32)
        grow("free_cores", np.int32)
        grow("free_split", np.int32)
        grow("link_degree", np.int64)
        self._cap = cap

    # numpy attributes, declared for the type checker
    node_of: I32
    alive: B
    healthy: B
    # What a GPU offers: 0 vGPUs; k > 0 a MIG instance of profile_names[k], placed
    # whole; MIG_PARENT a GPU in MIG mode, which offers nothing itself.
    profile_id: I32
    type_id: I32
    numa: I32
    cap_mem: I64
    cap_cores: I64
    cap_split: I64
    used_mem: I64
    used_cores: I64
    used_split: I64
    excl: I64
    # cap - used, kept beside them: a filter over a few candidates reads one gather
    # per rule instead of two and a subtraction (int32: a GPU's MiB, percent, slots)
    free_mem: I32
    free_cores: I32
    free_split: I32
    link_degree: I64

    @property
    def slots(self) -> int:
        return self._n

    def _type(self, model: str) -> int:
        tid = self._type_ids.get(model)
        if tid is None:
            tid = self._type_ids[model] = len(self.type_names)
            self.type_names.append(model)
        return tid

    def profile_code(self, profile: str) -> int:
        """The ``profile_id`` of GPUs offered to a request for ``profile``; -1 when no
        GPU offers it."""
        return self._profile_ids.get(profile, -1)

    def _profile(self, profile: str) -> int:
        pid = self._profile_ids.get(profile)
        if pid is None:
            pid = self._profile_ids[profile] = len(self.profile_names)
            self.profile_names.append(profile)
        return pid

    # -- nodes -----------------------------------------------------------------------------------

    def set_node(self, node: Node) -> None:
        """Add a node or replace its inventory; usage held on it is kept."""
        idx = self.node_index.get(node.name)
        if idx is None:
            if self._free_nodes:
                idx = self._free_nodes.pop()
                self.node_names[idx] = node.name
                self.nodes[idx] = node
                self.node_labels[idx] = dict(node.labels)
            else:
                idx = len(self.node_names)
                self._grow_nodes(idx + 1)
                self.node_shape.append(-1)
                self.node_names.append(node.name)
                self.nodes.append(node)
                self.node_labels.append(dict(node.labels))
                self._uuid_slot.append({})
            self.node_index[node.name] = idx
        else:
            self.nodes[idx] = node
            self.node_labels[idx] = dict(node.labels)
        self._place_slots(idx, node.inventory)
        self.node_shape[idx] = self._shape(node.inventory)
        self.generation += 1

    def _shape(self, inv: NodeInventory) -> int:
        pos = {g.uuid: i for i, g in enumerate(inv.devices)}
        key = (inv.memory_scaling, inv.core_scaling, tuple(
            (g.model, g.memory, g.split, g.numa, g.healthy, g.mig, g.profile,
             tuple(sorted(pos.get(u, -1) for u in g.links))) for g in inv.devices))
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = self._shape_ids[key] = len(self._shape_ids)
        return sid

    def _grow_nodes(self, need: int) -> None:
        if need <= len(self.node_cap_mem):
            return
        cap = max(need, 2 * len(self.node_cap_mem))
        for name in ("node_cap_mem", "node_used_mem", "node_cap_cores", "node_used_cores",
                     "node_start", "node_count"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _sum_node(self, idx: int) -> None:
        r = self.node_slots(idx)
        s = slice(r.start, r.stop)
        self.node_cap_mem[idx] = float(self.cap_mem[s].sum())
        self.node_used_mem[idx] = float(self.used_mem[s].sum())
        self.node_cap_cores[idx] = float(self.cap_cores[s].sum())
        self.node_used_cores[idx] = float(self.used_cores[s].sum())

    def remove_node(self, name: str) -> None:
        """Forget a node; usage held on it is dropped with it."""
        idx = self.node_index.pop(name, None)
        if idx is None:
            return
        self._evict_usage(idx)
        self._kill_slots(idx)
        self._sum_node(idx)
        self.nodes[idx] = None
        self._uuid_slot[idx] = {}
        self._free_nodes.append(idx)
        self.generation += 1

    def _kill_slots(self, idx: int) -> None:
        r = self.node_slots(idx)
        self.alive[r.start : r.stop] = False
        self.node_of[r.start : r.stop] = -1
        self.node_count[idx] = 0

    def _evict_usage(self, idx: int) -> None:
        """Move what the node's slots hold into the orphans, before they change."""
        for uuid, k in self._uuid_slot[idx].items():
            u = self._slot_usage(k)
            if u != ZERO:
                self._orphans.setdefault(self.node_names[idx], {})[uuid] = u

    def _slot_usage(self, k: int) -> GpuUsage:
        return GpuUsage(int(self.used_split[k]), int(self.used_mem[k]),
                        int(self.used_cores[k]), int(self.excl[k]))

    def _place_slots(self, idx: int, inv: NodeInventory) -> None:
        self._evict_usage(idx)
        n = len(inv.devices)
        if n != self.node_count[idx]:
            self._kill_slots(idx)
            if self._n + n > self._cap:
                self._compact(extra=n)
            self.node_start[idx] = self._n
            self.node_count[idx] = n
            self._n += n
        s = int(self.node_start[idx])
        slot_of: dict[str, int] = {}
        name = self.node_names[idx]
        usage = self._orphans.pop(name, {})
        for i, g in enumerate(inv.devices):
            k = s + i
            slot_of[g.uuid] = k
            self.node_of[k] = idx
            self.alive[k] = True
            self.healthy[k] = g.healthy
            self.profile_id[k] = MIG_PARENT if g.mig else self._profile(g.profile)
            self.type_id[k] = self._type(g.model)
            self.numa[k] = g.numa
            cap = inv.capacity(g)
            self.cap_mem[k] = cap.memory
            self.cap_cores[k] = cap.cores
            self.cap_split[k] = cap.vgpus
            self.link_degree[k] = len(g.links)
            u = usage.pop(g.uuid, ZERO)
            self.used_mem[k] = u.memory
            self.used_cores[k] = u.cores
            self.used_split[k] = u.vgpus
            self.excl[k] = u.exclusive
            self.free_mem[k] = cap.memory - u.memory
            self.free_cores[k] = cap.cores - u.cores
            self.free_split[k] = cap.vgpus - u.vgpus
        if usage:  # held on GPUs this inventory does not list
            self._orphans[name] = usage
        self._uuid_slot[idx] = slot_of
        self._sum_node(idx)

    def _compact(self, extra: int) -> None:
        live = [i for i, node in enumerate(self.nodes) if node is not None]
        need = int(sum(self.node_count[i] for i in live)) + extra
        cap = max(64, self._cap)
        while cap < need * 2:
            cap *= 2
        order = np.concatenate(
            [np.arange(self.node_start[i], self.node_start[i] + self.node_count[i])
             for i in live] or [np.zeros(0, dtype=np.int64)]
        ).astype(np.int64)
        arrays = ("node_of", "alive", "healthy", "profile_id", "type_id", "numa", "cap_mem",
                  "cap_cores", "cap_split", "used_mem", "used_cores", "used_split", "excl",
                  "free_mem", "free_cores", "free_split", "link_degree")
        kept = {name: getattr(self, name)[order] for name in arrays}
        for name in arrays:
            delattr(self, name)
        self._alloc(cap)
        for name, values in kept.items():
            getattr(self, name)[: len(values)] = values
        pos = 0
        for i in live:
            self.node_start[i] = pos
            node = self.nodes[i]
            assert node is not None
            self._uuid_slot[i] = {g.uuid: pos + off for off, g in enumerate(node.inventory.devices)}
            pos += int(self.node_count[i])
        self._n = pos

    # -- usage -----------------------------------------------------------------------------------

    def add_usage(self, node: str, charges: Mapping[str, GpuUsage], sign: int) -> None:
        """Add (sign=+1) or remove (sign=-1) a placement's per-GPU charge.

        Usage is kept by node name, so it survives the node leaving and coming back.
        """
        self.usage_generation += 1
        idx = self.node_index.get(node)
        slots = self._uuid_slot[idx] if idx is not None else {}
        for uuid, c in charges.items():
            k = slots.get(uuid)
            if k is None:
                self._add_orphan(node, uuid, c, sign)
                continue
            assert idx is not None
            old = self._slot_usage(k)
            new = old + c if sign > 0 else old - c
            self.node_used_mem[idx] += new.memory - old.memory
            self.node_used_cores[idx] += new.cores - old.cores
            self.used_split[k] = new.vgpus
            self.used_mem[k] = new.memory
            self.used_cores[k] = new.cores
            self.excl[k] = new.exclusive
            self.free_split[k] += old.vgpus - new.vgpus
            self.free_mem[k] += old.memory - new.memory
            self.free_cores[k] += old.cores - new.cores

    def _add_orphan(self, node: str, uuid: str, c: GpuUsage, sign: int) -> None:
        usage = self._orphans.setdefault(node, {})
        old = usage.get(uuid, ZERO)
        new = old + c if sign > 0 else old - c
        if new == ZERO:
            usage.pop(uuid, None)
        else:
            usage[uuid] = new
        if not usage:
            del self._orphans[node]

    def usage(self, node: str, uuid: str) -> GpuUsage:
        idx = self.node_index.get(node)
        k = self._uuid_slot[idx].get(uuid) if idx is not None else None
        if k is None:
            return self._orphans.get(node, {}).get(uuid, ZERO)
        return self._slot_usage(k)

    def capacity(self, node: str, uuid: str) -> GpuUsage | None:
        """One GPU's capacity, or None if the node lacks it."""
        idx = self.node_index.get(node)
        k = None if idx is None else self._uuid_slot[idx].get(uuid)
        if k is None:
            return None
        return GpuUsage(vgpus=int(self.cap_split[k]), memory=int(self.cap_mem[k]),
                        cores=int(self.cap_cores[k]), exclusive=1)

    def has_node(self, node: str) -> bool:
        return node in self.node_index

    # -- views -----------------------------------------------------------------------------------

    def node_slots(self, idx: int) -> range:
        s = int(self.node_start[idx])
        return range(s, s + int(self.node_count[idx]))

    def gpus(self, node: str, released: Mapping[str, GpuUsage] | None = None,
             ) -> list[GpuView]:
        """The node's GPUs with their free capacity, in index order. ``released``: per
        uuid, held amounts to count as free (a what-if: nothing here changes)."""
        idx = self.node_index[node]
        n = self.nodes[idx]
        assert n is not None
        out = []
        for k, g in zip(self.node_slots(idx), n.inventory.devices, strict=True):
            r = released.get(g.uuid, ZERO) if released else ZERO
            out.append(GpuView(
                gpu=g, slot=k,
                cap_memory=int(self.cap_mem[k]), cap_cores=int(self.cap_cores[k]),
                free_memory=int(self.cap_mem[k] - self.used_mem[k]) + r.memory,
                free_cores=int(self.cap_cores[k] - self.used_cores[k]) + r.cores,
                free_split=int(self.cap_split[k] - self.used_split[k]) + r.vgpus,
                used_vgpus=int(self.used_split[k]) - r.vgpus,
                exclusive=bool(self.excl[k] - r.exclusive > 0),
            ))
        return out

    def n_nodes(self) -> int:
        return len(self.node_index)

    def drift(self) -> list[str]:
        """Slots whose kept free amounts disagree with capacity minus use (for tests)."""
        n = self._n
        live = self.alive[:n]
        out = []
        for name, cap, used in (("free_mem", self.cap_mem, self.used_mem),
                                ("free_cores", self.cap_cores, self.used_cores),
                                ("free_split", self.cap_split, self.used_split)):
            bad = np.flatnonzero(live & (getattr(self, name)[:n] != cap[:n] - used[:n]))
            out += [f"slot {k}: {name} is {getattr(self, name)[k]}, capacity minus use "
                    f"{cap[k] - used[k]}" for k in bad.tolist()]
        return out

    def smallest(self) -> GpuUsage:
        """The least memory, cores and vGPUs any GPU of the cluster has (as capacity)."""
        if self._smallest[0] != self.generation:
            n = self._n
            live = self.alive[:n]
            if live.any():
                least = GpuUsage(int(self.cap_split[:n][live].min()),
                                 int(self.cap_mem[:n][live].min()),
                                 int(self.cap_cores[:n][live].min()))
            else:
                least = ZERO
            self._smallest = (self.generation, least)
        return self._smallest[1]

    def slots_of(self, nodes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Every slot of the given nodes, node by node."""
        counts = self.node_count[nodes]
        total = int(counts.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64)
        starts = self.node_start[nodes]
        offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
        out: npt.NDArray[np.int64] = offsets + np.arange(total, dtype=np.int64)
        return out

    def live_node_indices(self) -> Iterable[int]:
        return self.node_index.values()

    def free_node_indices(self) -> list[int]:
        """Node indices left by removed nodes (not candidates)."""
        return self._free_nodes

