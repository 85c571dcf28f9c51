"""Rows for the status page, its JSON API and ``vgpud inspect``."""

from __future__ import annotations

from tests.builders import node, pod
from vgpud.core.allocate import Allocator
from vgpud.core.report import gpu_rows, pending_reasons, pod_rows, to_json
from vgpud.core.requests import parse_pod

MIB = 1 << 20


def test_gpu_and_pod_rows_in_bytes_with_their_slices() -> None:
    a = Allocator()
    a.set_node(node("n", 2, 16000))
    r = parse_pod(pod("p", memory=3000, cores=30,
                      annotations={"nvidia.com/vgpu-priority": "7"}), a.defaults)
    d = a.schedule(r)
    assert d.placement is not None  # assumed, not yet confirmed
    rows = gpu_rows(a.cluster, a.ledger)
    assert [(g.node, g.index) for g in rows] == [("n", 0), ("n", 1)]
    held = next(g for g in rows if g.slices)
    assert (held.memory_allocated, held.memory_capacity) == (3000 * MIB, 16000 * MIB)
    assert to_json(held)["slices"] == [{"namespace": "default", "pod": "p", "container": "main",
                                        "memory": 3000 * MIB, "cores": 30, "priority": 7,
                                        "state": "assumed"}]
    (p,) = pod_rows(a.ledger)
    assert (p.node, p.state, p.grants[0].memory) == ("n", "assumed", 3000 * MIB)
    assert gpu_rows(a.cluster, a.ledger, ["ghost"]) == []


def test_pending_reasons_group_nodes_by_reason() -> None:
    a = Allocator()
    for name in ("a", "b"):
        a.set_node(node(name, 1, 8000))
    a.set_node(node("c", 1, 40000))
    big = parse_pod(pod("big", memory=20000), a.defaults)
    assert a.schedule(big).placement is not None  # c is taken
    again = parse_pod(pod("again", memory=30000), a.defaults)
    got = pending_reasons(a, again)
    assert [n for n, _, _ in got] == [2, 1]
    assert [res for _, _, res in got] == [False, True]  # a, b never; c when big leaves
    assert pending_reasons(a, parse_pod(pod("small", memory=100), a.defaults)) == []
