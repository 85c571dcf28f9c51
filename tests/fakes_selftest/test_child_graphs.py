"""Child graph nodes (cuGraphAddChildGraphNode, cuGraphChildGraphNodeGetGraph): the child
graph is cloned into the node; a launch runs the kernels of its child graphs, nested to any
depth, on the device timeline as top-level kernel nodes run (back to back, each by the wave
model); as cuda.h says, a child graph with memory nodes is refused and none can be added
to an embedded graph."""

from __future__ import annotations

import pytest

from .conftest import Fake

LAUNCH = 1500  # FAKECUDA_LAUNCH_NS default
ONE = LAUNCH + 2 * 10_000  # 2000 blocks of 128 threads of fake_ns_10000: 2 waves of 10 us
GRAPH = 4  # CU_GRAPH_NODE_TYPE_GRAPH
INVALID_VALUE = 1


def busy(fake: Fake, prog: str, script: str) -> tuple[int, list[dict]]:
    """Device time the script's kernels took (fake_busy_ns of its pid), and its replies."""
    p = fake.start(prog)
    t0 = p.ok("fake_now_ns")["value"]
    out = [p.ok(op.strip()) for op in script.split(";")]
    p.ok("sync")
    value: int = p.ok(f"fake_busy_ns 0 {p.pid} {t0}")["value"]
    p.kill()
    return value, out


@pytest.mark.parametrize("prog", ["direct", "viadlsym", "viaproc"])
@pytest.mark.parametrize(("depth", "kernels"), [(0, 3), (1, 3), (4, 2), (12, 1)])
def test_nested_kernels_take_device_time(fake: Fake, prog: str, depth: int,
                                         kernels: int) -> None:
    got, out = busy(fake, prog, f"graphnest {depth} {kernels} 2000 10000; graphlaunch 0 3")
    nest = out[0]
    assert (nest["levels"], nest["kernels"]) == (depth, kernels)
    assert nest["toptype"] == (GRAPH if depth else -1)
    assert got == 3 * kernels * ONE  # as if the kernel nodes were the top graph's


def test_nested_equals_flat(fake: Fake) -> None:
    flat, _ = busy(fake, "direct", "kernel 10000; graph 2000 4 5")
    nested, _ = busy(fake, "direct", "graphnest 3 4 2000 10000; graphlaunch 0 5")
    assert flat == nested == 5 * 4 * ONE


def test_launch_loop_of_a_nested_graph(fake: Fake) -> None:
    got, out = busy(fake, "direct", "graphnest 2 2 2000 10000; graphlaunchfor 0 200")
    n = out[1]["launches"]
    assert n > 0
    assert got == n * 2 * ONE


def test_clone_semantics_type_and_memory_nodes(fake: Fake) -> None:
    got, out = busy(fake, "viaproc", "kernel 10000; graphchild 2000 2; graphlaunch 0 2")
    c = out[1]
    assert c["type"] == GRAPH
    # a node added to the original after embedding is not the node's; nodes added to the
    # embedded graph (cuGraphChildGraphNodeGetGraph: no clone) are
    assert (c["orig"], c["embedded"]) == (2, 3)
    assert got == 2 * 3 * ONE
    # cuda.h: a child graph with allocation/free nodes → error; no memory node can be
    # added to the embedded graph; the node owns it (not destroyable on its own)
    assert c["memchild"] == INVALID_VALUE
    assert c["memembedded"] == INVALID_VALUE
    assert c["destroyembedded"] == INVALID_VALUE


def test_freeing_the_parent_frees_the_embedded_graphs(fake: Fake) -> None:
    p = fake.start("direct")
    for _ in range(3):
        p.ok("graphnest 6 2 1")
        p.ok("graphchild 1 1")
    for i in range(6):
        p.ok(f"free {i}")
    p.ok("sync")
    p.kill()
