"""The status queries (vgpud.core.query): filters, paging and totals against a
brute-force reference built from report.gpu_rows / report.pod_rows."""

from __future__ import annotations

import gc
import random
import time

import pytest

from tests.builders import node
from vgpud.core.allocate import Allocator
from vgpud.core.dra_report import DraRows, dra_rows
from vgpud.core.model import ContainerGrant, DeviceGrant, Placement
from vgpud.core.query import (
    MAX_LIMIT,
    POD_PARAMS,
    Query,
    QueryError,
    complete,
    parse_query,
    select_gpus,
    select_pods,
    summary,
)
from vgpud.core.report import MIB, GpuRow, PodRow, gpu_rows, pod_rows


def place(alloc: Allocator, key: str, node_name: str, *grants: tuple[int, int, int],
          confirmed: bool = True, priority: int = 0) -> None:
    """``grants``: (GPU index, MiB, cores) for one container ``main``."""
    p = Placement(node_name, (ContainerGrant("main", False, tuple(
        DeviceGrant(f"GPU-{node_name}-{i}", mem, cores) for i, mem, cores in grants)),),
        priority=priority, time="2026-11-21T00:00:00Z")
    uid = "uid-" + key.replace("/", "-")
    if confirmed:
        alloc.confirm(uid, key, p)
    else:
        assert alloc.ledger.assume(uid, key, p, 0.0) is None


@pytest.fixture
def alloc() -> Allocator:
    a = Allocator()
    a.set_node(node("b-node", 2, 32768))
    a.set_node(node("a-node", 2, 16384, model="NVIDIA A100-SXM4-80GB",
                    healthy=(True, False)))
    a.set_node(node("c-node", 1, 32768))
    place(a, "team-a/train-1", "a-node", (0, 8000, 30))
    place(a, "team-a/infer", "b-node", (1, 1000, 10), priority=5)
    place(a, "team-b/train-2", "b-node", (1, 2000, 20), confirmed=False)
    return a


def uuids(rows: list[GpuRow]) -> list[str]:
    return [r.uuid for r in rows]


def test_all_gpus_in_node_then_index_order(alloc: Allocator) -> None:
    page = complete(select_gpus(alloc.cluster, alloc.ledger, Query()))
    assert page.total == 5
    assert uuids(page.items) == ["GPU-a-node-0", "GPU-a-node-1", "GPU-b-node-0",
                                 "GPU-b-node-1", "GPU-c-node-0"]
    assert page.items == gpu_rows(alloc.cluster, alloc.ledger)
    b1 = page.items[3]
    assert b1.memory_allocated == 3000 * MIB and b1.cores_allocated == 30
    assert [(s.pod, s.state, s.priority) for s in b1.slices] == [
        ("infer", "confirmed", 5), ("train-2", "assumed", 0)]


@pytest.mark.parametrize(("query", "expected"), [
    (Query(node="b-node"), ["GPU-b-node-0", "GPU-b-node-1"]),
    (Query(node="b"), []),  # exact
    (Query(namespace="team-a"), ["GPU-a-node-0", "GPU-b-node-1"]),
    (Query(namespace="team-b"), ["GPU-b-node-1"]),
    (Query(namespace="team"), []),  # exact
    (Query(q="train"), ["GPU-a-node-0", "GPU-b-node-1"]),  # pod names
    (Query(q="team-b/"), ["GPU-b-node-1"]),  # namespace/pod
    (Query(q="a100"), ["GPU-a-node-0", "GPU-a-node-1"]),  # model, any case
    (Query(q="TRAIN"), ["GPU-a-node-0", "GPU-b-node-1"]),
    (Query(q="c-node"), ["GPU-c-node-0"]),  # node name
    (Query(q="gpu-b-node-0"), ["GPU-b-node-0"]),  # uuid
    (Query(health="unhealthy"), ["GPU-a-node-1"]),
    (Query(health="healthy", node="a-node"), ["GPU-a-node-0"]),
    (Query(namespace="team-a", q="infer"), ["GPU-b-node-1"]),
    (Query(namespace="team-b", q="c-node"), []),
    (Query(node="a-node", q="infer"), []),
    (Query(node="ghost"), []),
])
def test_gpu_filters(alloc: Allocator, query: Query, expected: list[str]) -> None:
    page = complete(select_gpus(alloc.cluster, alloc.ledger, query))
    assert uuids(page.items) == expected
    assert page.total == len(expected)


def test_pods_with_pending(alloc: Allocator) -> None:
    pending = [PodRow("team-c", "big", "u1", None, "pending", 0, reason="too big",
                      since="2026-11-21T00:00:00Z")]
    page = complete(select_pods(alloc.ledger, pending, Query()))
    assert [(p.namespace, p.name, p.state) for p in page.items] == [
        ("team-a", "infer", "confirmed"), ("team-a", "train-1", "confirmed"),
        ("team-b", "train-2", "assumed"), ("team-c", "big", "pending")]
    assert page.items[:3] == pod_rows(alloc.ledger)
    for q, names in [(Query(state="pending"), ["big"]), (Query(state="assumed"), ["train-2"]),
                     (Query(node="b-node"), ["infer", "train-2"]),
                     (Query(namespace="team-a"), ["infer", "train-1"]),
                     (Query(q="GPU-A-NODE"), ["train-1"]),
                     (Query(q="big"), ["big"]), (Query(node="b-node", state="pending"), [])]:
        got = complete(select_pods(alloc.ledger, pending, q))
        assert [p.name for p in got.items] == names, q
        assert got.total == len(names)


def test_parse_query_says_what_is_wrong() -> None:
    assert parse_query({}) == Query()
    assert parse_query({"q": "  Train ", "offset": "5", "limit": "10"}) == Query(
        q="Train", offset=5, limit=10)
    assert parse_query({"state": "pending"}, POD_PARAMS) == Query(state="pending")
    for params, words in [({"limit": "x"}, "limit must be a whole number"),
                          ({"offset": "-1"}, "offset must be between 0"),
                          ({"limit": "0"}, "limit must be between 1"),
                          ({"limit": str(MAX_LIMIT + 1)}, f"between 0 and {MAX_LIMIT}"),
                          ({"health": "meh"}, "health must be one of healthy, unhealthy"),
                          ({"color": "red"}, "unknown parameter 'color'"),
                          ({"q": "x" * 300}, "longer than 256"),
                          ({"state": "pending"}, "unknown parameter 'state'")]:
        with pytest.raises(QueryError, match=words):
            parse_query(params)
    with pytest.raises(QueryError, match="unknown parameter 'health'"):
        parse_query({"health": "healthy"}, POD_PARAMS)
    with pytest.raises(QueryError, match="state must be one of pending, assumed, confirmed"):
        parse_query({"state": "running"}, POD_PARAMS)


def test_summary(alloc: Allocator) -> None:
    s = summary(alloc.cluster, alloc.ledger, pending=2)
    assert s == {"nodes": 3, "gpus": 5, "unhealthyGpus": 1,
                 "memoryCapacity": (2 * 32768 + 2 * 16384 + 32768) * MIB,
                 "memoryAllocated": 11000 * MIB, "coresCapacity": 500, "coresAllocated": 60,
                 "vgpusCapacity": 50, "vgpusAllocated": 3, "pods": 3, "assumedPods": 1,
                 "pendingPods": 2}


def big_cluster(n_nodes: int, n_pods: int) -> Allocator:
    rng = random.Random(7)
    a = Allocator()
    for i in range(n_nodes):
        a.set_node(node(f"node-{i:05d}", 8, 81920, healthy=tuple(
            rng.random() > 0.01 for _ in range(8))))
    for i in range(n_pods):
        n = f"node-{i % n_nodes:05d}"
        place(a, f"ns-{i % 13}/pod-{i:06d}", n, ((i // n_nodes) % 8, 2000, 10))
    return a


def test_pages_and_filters_match_a_brute_force_reference() -> None:
    a = big_cluster(60, 700)
    everything = gpu_rows(a.cluster, a.ledger)
    rng = random.Random(1)
    for _ in range(60):
        query = Query(node=rng.choice(["", "", "node-00007", "node-00059"]),
                      namespace=rng.choice(["", "", "ns-3"]),
                      q=rng.choice(["", "", "pod-0001", "node-0004", "v100", "-3"]),
                      health=rng.choice(["", "", "healthy", "unhealthy"]),
                      offset=rng.choice([0, 0, 7, 100, 470, 1000]),
                      limit=rng.choice([1, 8, 50, 200]))

        def keep(r: GpuRow, query: Query = query) -> bool:
            keys = [f"{s.namespace}/{s.pod}" for s in r.slices]
            return ((not query.node or r.node == query.node)
                    and (not query.namespace
                         or any(s.namespace == query.namespace for s in r.slices))
                    and (not query.q or query.q in r.node or query.q in r.uuid.lower()
                         or query.q in r.model.lower() or any(query.q in k for k in keys))
                    and (not query.health or r.healthy == (query.health == "healthy")))

        want = [r for r in everything if keep(r)]
        got = complete(select_gpus(a.cluster, a.ledger, query, step=7))
        assert got.total == len(want), query
        assert got.items == want[query.offset:query.offset + query.limit], query


def test_a_page_of_40000_gpus_is_cheap_and_steps_are_short() -> None:
    """Filter first, rows for the page only; no step holds the loop for long."""
    a = big_cluster(5000, 50_000)
    gc.collect()  # the scheduler freezes its synced caches (gc.freeze) likewise
    for query in (Query(), Query(offset=39_800), Query(q="pod-04"), Query(namespace="ns-5"),
                  Query(health="unhealthy")):
        steps = select_gpus(a.cluster, a.ledger, query)
        longest, start = 0.0, time.perf_counter()
        t = start
        while True:
            try:
                next(steps)
            except StopIteration as done:
                page = done.value
                break
            finally:
                now = time.perf_counter()
                longest, t = max(longest, now - t), now
        total = time.perf_counter() - start
        assert page.items, query
        # generous bounds: 2-core CI boxes; typical figures are ~10x smaller
        assert longest < 0.05, (query, longest)
        assert total < 1.0, (query, total)
    for query in (Query(), Query(q="pod-0499"), Query(offset=49_900)):
        steps = select_pods(a.ledger, [], query)
        longest, t = 0.0, time.perf_counter()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                page = done.value
                break
            finally:
                now = time.perf_counter()
                longest, t = max(longest, now - t), now
        assert page.items and longest < 0.05, (query, longest)
    assert complete(select_pods(a.ledger, [], Query(q="pod-0499"))).total == 100  # pod-049900…


# -- the DRA nodes' rows, beside the cluster's ---------------------------------------------


@pytest.fixture
def dra() -> DraRows:
    """Two DRA nodes: d-node (two GPUs, one unhealthy; two claims share GPU 0) and
    e-node (one GPU held whole by a claim reserved for no pod yet)."""
    from tests.core.test_dra_report import _claim, _gpu, _result, _slices

    slices = [*_slices("d-node", _gpu(0), _gpu(1, healthy=False)),
              *_slices("e-node", _gpu(7, memory=81920))]
    claims = [_claim("c1", _result("gpu-0", pool="d-node", memory="4Gi", cores="30"),
                     pods=("serve",), namespace="team-d"),
              _claim("c2", _result("gpu-0", pool="d-node", memory="2Gi", cores="10"),
                     pods=("train-9",), namespace="team-a"),
              _claim("c3", _result("gpu-7", pool="e-node"), namespace="team-e")]
    rows = dra_rows(slices, claims)
    assert not rows.warnings
    return rows


def test_dra_nodes_gpus_follow_the_clusters_and_page_across_the_seam(
        alloc: Allocator, dra: DraRows) -> None:
    cluster = uuids(complete(select_gpus(alloc.cluster, alloc.ledger, Query())).items)
    everything = [*cluster, "GPU-0", "GPU-1", "GPU-7"]
    page = complete(select_gpus(alloc.cluster, alloc.ledger, Query(), dra=dra.gpus))
    assert uuids(page.items) == everything and page.total == 8
    assert all(r.dra for r in page.items[5:]) and not any(r.dra for r in page.items[:5])
    for offset in range(10):
        for limit in (1, 2, 3, 5):
            got = complete(select_gpus(alloc.cluster, alloc.ledger,
                                       Query(offset=offset, limit=limit), dra=dra.gpus, step=2))
            assert uuids(got.items) == everything[offset:offset + limit], (offset, limit)
            assert got.total == 8


@pytest.mark.parametrize(("query", "expected"), [
    (Query(node="d-node"), ["GPU-0", "GPU-1"]),
    (Query(node="e-node"), ["GPU-7"]),
    (Query(namespace="team-a"), ["GPU-a-node-0", "GPU-b-node-1", "GPU-0"]),
    (Query(namespace="team-e"), ["GPU-7"]),  # a claim no pod holds yet
    (Query(q="TRAIN"), ["GPU-a-node-0", "GPU-b-node-1", "GPU-0"]),  # pod names, any case
    (Query(q="team-d/serve"), ["GPU-0"]),
    (Query(q="e-no"), ["GPU-7"]),  # node name
    (Query(q="nvidia l4"), ["GPU-0", "GPU-1", "GPU-7"]),  # model
    (Query(health="unhealthy"), ["GPU-a-node-1", "GPU-1"]),
    (Query(health="healthy", node="d-node"), ["GPU-0"]),
    (Query(node="d-node", q="team-e"), []),
])
def test_dra_nodes_gpus_match_the_same_filters(alloc: Allocator, dra: DraRows, query: Query,
                                               expected: list[str]) -> None:
    page = complete(select_gpus(alloc.cluster, alloc.ledger, query, dra=dra.gpus))
    assert uuids(page.items) == expected
    assert page.total == len(expected)


def test_pods_of_dra_claims_are_listed_with_the_ledgers(alloc: Allocator, dra: DraRows) -> None:
    page = complete(select_pods(alloc.ledger, [], Query(), dra=dra.pods))
    assert [(p.namespace, p.name, p.state, p.node) for p in page.items] == [
        ("team-a", "infer", "confirmed", "b-node"), ("team-a", "train-1", "confirmed", "a-node"),
        ("team-a", "train-9", "confirmed", "d-node"), ("team-b", "train-2", "assumed", "b-node"),
        ("team-d", "serve", "confirmed", "d-node")]
    for q, names in [(Query(state="assumed"), ["train-2"]),
                     (Query(state="pending"), []),
                     (Query(node="d-node"), ["train-9", "serve"]),
                     (Query(q="gpu-0"), ["train-9", "serve"]),  # the uuid it holds
                     (Query(namespace="team-d", offset=0, limit=1), ["serve"])]:
        got = complete(select_pods(alloc.ledger, [], q, dra=dra.pods))
        assert [p.name for p in got.items] == names, q


def test_summary_counts_the_dra_nodes(alloc: Allocator, dra: DraRows) -> None:
    base = summary(alloc.cluster, alloc.ledger, pending=0)
    s = summary(alloc.cluster, alloc.ledger, pending=0, dra_gpus=dra.gpus,
                dra_pods=len(dra.pods))
    gib = 1 << 30
    assert {k: s[k] - base[k] for k in s} == {
        "nodes": 2, "gpus": 3, "unhealthyGpus": 1,
        "memoryCapacity": (16384 * 2 + 81920) * MIB,
        "memoryAllocated": 6 * gib + 81920 * MIB,  # c3 holds its GPU whole
        "coresCapacity": 300, "coresAllocated": 40 + 100,
        "vgpusCapacity": sum(r.vgpus_capacity for r in dra.gpus), "vgpusAllocated": 3,
        "pods": 2, "assumedPods": 0, "pendingPods": 0}
