import pytest

from tests.builders import container, node, pod
from vgpud.core.allocate import Allocator
from vgpud.core.model import Defaults, Placement, Reason
from vgpud.core.requests import parse_pod

D = Defaults()


def alloc(*nodes: object, defaults: Defaults = D) -> Allocator:
    a = Allocator(defaults)
    for n in nodes:
        a.set_node(n)  # type: ignore[arg-type]
    return a


def req(manifest: dict, defaults: Defaults = D):
    return parse_pod(manifest, defaults)


def test_filter_returns_every_feasible_node_and_a_reason_for_each_other() -> None:
    a = alloc(node("big", 2, 40000), node("small", 2, 8000), node("sick", 2, 40000,
              healthy=(False, False)))
    got = a.filter(req(pod(memory=10000)), ["big", "small", "sick", "ghost"])
    assert got.feasible == ["big"]
    assert set(got.failed) == {"small", "sick", "ghost"}
    small = got.failed["small"]
    assert not small.resolvable and "room for 10000 MiB" in small.message
    assert not got.failed["sick"].resolvable and "healthy" in got.failed["sick"].message
    assert not got.failed["ghost"].resolvable and "plugin" in got.failed["ghost"].message


def test_full_node_is_resolvable() -> None:
    a = alloc(node("n", 1, 20000))
    first = a.schedule(req(pod("a", memory=15000)))
    assert first.placement is not None
    got = a.filter(req(pod("b", memory=15000)), ["n"])
    assert got.feasible == [] and got.failed["n"].resolvable
    assert "15000 MiB free" in got.failed["n"].message


def test_split_count_limits_sharing() -> None:
    a = alloc(node("n", 1, 80000, split=3))
    placed = [a.schedule(req(pod(f"p{i}", memory=100))).placement for i in range(5)]
    assert sum(p is not None for p in placed) == 3
    r = a.schedule(req(pod("x", memory=100))).reason
    assert r is not None and "free vGPU slot" in r.message


def test_multi_vgpu_container_uses_distinct_gpus() -> None:
    a = alloc(node("n", 4, 10000))
    d = a.schedule(req(pod(number=3, memory=100)))
    assert d.placement is not None
    uuids = [x.uuid for x in d.placement.containers[0].devices]
    assert len(set(uuids)) == 3


def test_containers_of_one_pod_may_share_a_gpu() -> None:
    a = alloc(node("n", 1, 10000))
    d = a.schedule(req(pod(containers=[container("a", memory=4000), container("b", memory=4000)])))
    assert d.placement is not None
    assert {c.devices[0].uuid for c in d.placement.containers} == {"GPU-n-0"}
    d2 = a.schedule(req(pod("q", containers=[container("a", memory=4000),
                                             container("b", memory=4000)])))
    assert d2.placement is None  # 8000 held, 2000 free


def test_multi_container_filter_is_exact() -> None:
    # each container alone fits, together they do not
    a = alloc(node("n", 1, 10000))
    got = a.filter(req(pod(containers=[container("a", memory=6000), container("b", memory=6000)])),
                   ["n"])
    assert got.feasible == [] and "n" in got.failed


def test_whole_gpu_request_needs_an_idle_gpu_and_keeps_others_off() -> None:
    a = alloc(node("n", 2, 10000))
    assert a.schedule(req(pod("small", memory=100))).placement is not None
    whole = a.schedule(req(pod("whole", cores=100, memory=1000))).placement
    assert whole is not None
    small_gpu = "GPU-n-0"
    assert whole.containers[0].devices[0].uuid != small_gpu
    d = a.schedule(req(pod("other", memory=100, cores=0)))
    assert d.placement is not None and d.placement.containers[0].devices[0].uuid == small_gpu
    a.schedule(req(pod("fill", cores=100, memory=1)))
    assert a.ledger.violations() == []


def test_memory_percentage_is_of_each_gpu() -> None:
    a = alloc(node("n", 1, 40000, scaling=2.0))
    d = a.schedule(req(pod(percent=25)))
    assert d.placement is not None and d.placement.containers[0].devices[0].memory == 20000


def test_default_memory_zero_takes_the_whole_gpu() -> None:
    a = alloc(node("n", 2, 16000))
    d = a.schedule(req(pod(cores=10)))
    assert d.placement is not None and d.placement.containers[0].devices[0].memory == 16000


def test_device_policies() -> None:
    def place_two(policy: str) -> set[str]:
        a = alloc(node("n", 4, 10000))
        ann = {"nvidia.com/device-scheduler-policy": policy}
        uuids = set()
        for i in range(2):
            d = a.schedule(req(pod(f"p{i}", memory=1000, annotations=ann)))
            assert d.placement is not None
            uuids.add(d.placement.containers[0].devices[0].uuid)
        return uuids

    assert len(place_two("binpack")) == 1
    assert len(place_two("spread")) == 2


def test_node_policies() -> None:
    def nodes_used(policy: str) -> set[str]:
        a = alloc(node("a", 2, 10000), node("b", 2, 10000))
        ann = {"nvidia.com/node-scheduler-policy": policy}
        out = set()
        for i in range(2):
            d = a.schedule(req(pod(f"p{i}", memory=1000, annotations=ann)))
            assert d.placement is not None
            out.add(d.placement.node)
        return out

    assert len(nodes_used("binpack")) == 1
    assert len(nodes_used("spread")) == 2


def test_type_and_uuid_filters() -> None:
    a = alloc(node("v", 1, 32768, model="Tesla V100"), node("h", 1, 81920, model="NVIDIA H100"))
    d = a.schedule(req(pod(memory=10, annotations={"nvidia.com/include-gpu-type": "h100"})))
    assert d.placement is not None and d.placement.node == "h"
    d = a.schedule(req(pod("b", memory=10, annotations={"nvidia.com/exclude-gpu-type": "H100"})))
    assert d.placement is not None and d.placement.node == "v"
    got = a.filter(req(pod("c", memory=10, annotations={"nvidia.com/include-gpu-uuid": "GPU-v-0"})))
    assert got.feasible == ["v"] and "type/uuid" in got.failed["h"].message


def test_numa_mode_keeps_a_container_on_one_numa_node() -> None:
    a = alloc(node("n", 4, 10000, numa=(0, 0, 1, 1)))
    ann = {"nvidia.com/device-topology-mode": "numa"}
    d = a.schedule(req(pod(number=2, memory=100, annotations=ann)))
    assert d.placement is not None
    gpus = {g.gpu.uuid: g.gpu for g in a.cluster.gpus("n")}
    assert len({gpus[x.uuid].numa for x in d.placement.containers[0].devices}) == 1
    got = a.filter(req(pod("x", number=3, memory=100, annotations=ann)), ["n"])
    assert got.feasible == [] and not got.failed["n"].resolvable
    assert "NUMA" in got.failed["n"].message


def test_link_mode_needs_a_connected_set() -> None:
    a = alloc(node("plain", 4, 10000), node("nvl", 4, 10000, links=True))
    ann = {"nvidia.com/device-topology-mode": "link"}
    got = a.filter(req(pod(number=2, memory=100, annotations=ann)))
    assert got.feasible == ["nvl"] and "NVLink" in got.failed["plain"].message


def test_topology_scores_prefer_linked_gpus() -> None:
    a = alloc(node("plain", 2, 10000, numa=(0, 1)), node("nvl", 2, 10000, links=True))
    scores = a.prioritize(req(pod(number=2, memory=100)), ["plain", "nvl"])
    assert scores["nvl"] > scores["plain"]
    assert all(0 <= s <= 10 for s in scores.values())


def test_scores_follow_the_names_order_and_a_few_candidates_score_as_all_do() -> None:
    # 3 plain nodes, 3 linked ones, 6 more: two names are a minority (the filter then
    # gathers the candidates' GPUs and counts per candidate, not per node index)
    nodes = [node(f"n{i}", 2, 10000, numa=(0, 1), links=i % 2 == 1) for i in range(12)]
    a = alloc(*nodes)
    two = req(pod("two", number=2, memory=100))
    everything = a.prioritize(two, [f"n{i}" for i in range(12)])
    assert everything["n1"] > everything["n0"]
    for names in (["n1", "n0"], ["n0", "n1"], ["n5", "n2", "n9"]):
        a.filter(two, names)  # prioritize reuses this filter's result
        assert a.prioritize(two, names) == {n: everything[n] for n in names}
        known, scores = a.score_array(two, names)
        assert known == names and scores.tolist() == [everything[n] for n in names]


def test_a_candidate_named_twice_is_one_node() -> None:
    a = alloc(*[node(f"n{i}", 2, 10000) for i in range(8)])
    assert a.schedule(req(pod("a", memory=6000)), ["n3"]).placement is not None
    big = req(pod("big", number=2, memory=6000))
    got = a.filter(big, ["n3", "n3"])  # one free GPU is not two
    assert got.feasible == [] and "n3" in got.failed
    assert a.filter(big, ["n3", "n4", "n4"]).feasible == ["n4"]


def test_init_containers_reuse_capacity_and_sidecars_count_in_every_phase() -> None:
    a = alloc(node("n", 1, 10000))
    manifest = pod(containers=[container("app", memory=6000)],
                   init=[container("setup", memory=8000)])
    d = a.schedule(req(manifest))
    assert d.placement is not None  # 8000 then 6000, never both
    assert a.cluster.usage("n", "GPU-n-0").memory == 8000
    b = alloc(node("n", 1, 10000))
    manifest = pod(containers=[container("app", memory=6000)],
                   init=[container("proxy", restart="Always", memory=3000),
                         container("setup", memory=8000)])
    got = b.schedule(req(manifest))
    assert got.placement is None  # the sidecar runs alongside setup: 11000 > 10000
    assert got.reason is not None and not got.reason.resolvable


def test_place_on_unknown_node_and_unknown_gpu_in_assume() -> None:
    a = alloc(node("n", 1, 10000))
    r = a.place(req(pod(memory=1)), "ghost")
    assert isinstance(r, Reason) and not r.resolvable
    d = a.place(req(pod(memory=1)), "n")
    assert isinstance(d, Placement)
    a.remove_node("n")
    why = a.assume(req(pod(memory=1)), d)
    assert why is not None and why.code == "unknown-gpu"


def test_node_update_keeps_usage() -> None:
    a = alloc(node("n", 1, 10000))
    assert a.schedule(req(pod("a", memory=6000))).placement is not None
    a.set_node(node("n", 2, 10000))  # a GPU was added
    assert a.cluster.usage("n", "GPU-n-0").memory == 6000
    assert a.filter(req(pod("b", memory=6000)), ["n"]).feasible == ["n"]
    d = a.schedule(req(pod("b", memory=6000)))
    assert d.placement is not None and d.placement.containers[0].devices[0].uuid == "GPU-n-1"
    assert a.ledger.violations() == []


def test_usage_outlives_its_gpu_and_its_node_leaving_and_returns_with_them() -> None:
    a = alloc(node("n", 2, 10000))
    assert a.schedule(req(pod("a", memory=6000))).placement is not None
    assert a.schedule(req(pod("b", memory=7000))).placement is not None
    held = {u: a.cluster.usage("n", u).memory for u in ("GPU-n-0", "GPU-n-1")}
    assert sorted(held.values()) == [6000, 7000]
    a.set_node(node("n", 1, 10000))  # GPU-n-1 left the inventory
    assert a.cluster.usage("n", "GPU-n-1").memory == held["GPU-n-1"]
    a.remove_node("n")  # and then the whole node
    assert {u: a.cluster.usage("n", u).memory for u in held} == held
    a.set_node(node("n", 2, 10000))  # both come back, still held
    assert {u: a.cluster.usage("n", u).memory for u in held} == held
    assert a.filter(req(pod("c", memory=5000)), ["n"]).feasible == []
    assert a.ledger.violations() == []
    assert a.forget(req(pod("a")).uid) and a.forget(req(pod("b")).uid)
    assert a.filter(req(pod("c", memory=10000)), ["n"]).feasible == ["n"]
    assert a.ledger.violations() == []


@pytest.mark.parametrize("n_nodes", [1, 50, 300])
def test_many_nodes_and_removals_stay_consistent(n_nodes: int) -> None:
    a = alloc(*[node(f"n{i}", 1 + i % 3, 10000) for i in range(n_nodes)])
    for i in range(0, n_nodes, 3):
        a.remove_node(f"n{i}")
    for i in range(0, n_nodes, 6):
        a.set_node(node(f"n{i}", 4, 10000))
    placed = sum(a.schedule(req(pod(f"p{i}", memory=3000))).placement is not None
                 for i in range(n_nodes * 3))
    assert placed > 0 and a.ledger.violations() == []


def test_candidate_subset_agrees_with_the_full_cluster() -> None:
    import random

    rng = random.Random(5)
    a = alloc(*[node(f"n{i:02d}", rng.randint(0, 4), rng.choice([8000, 16000]),
                     numa=None, links=rng.random() < 0.3) for i in range(40)])
    for i in range(60):  # fill unevenly
        a.schedule(req(pod(f"f{i}", memory=rng.choice([2000, 6000]), cores=rng.choice([0, 30]))))
    a.remove_node("n07")
    names = sorted(a.cluster.node_index)
    for shape in ({"memory": 3000}, {"number": 2, "memory": 1000}, {"cores": 100, "memory": 1},
                  {"percent": 50, "cores": 40}):
        r = req(pod("q", **shape))
        full = a.filter(r, names)
        for _ in range(5):
            cands = rng.sample(names, 8)  # a minority: the gathered-slots path
            sub = a.filter(r, cands)
            assert sub.feasible == [n for n in full.feasible if n in cands]
            assert sub.failed == {n: why for n, why in full.failed.items() if n in cands}
            assert a.prioritize(r, sub.feasible) == {
                n: s for n, s in a.prioritize(r, full.feasible).items() if n in sub.feasible}
