import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def vgpud(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpud", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_seed_003_numbers_exactly() -> None:
    out = vgpud("simulate", str(EXAMPLES / "seed-003.yaml"), "--output", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    got = [(s["name"], s["summary"]["placed"], s["summary"]["pending"]) for s in doc["scenarios"]]
    assert got == [("seed-003-memory-10000", 6, 4), ("seed-003-memory-5000-cores-30", 6, 4),
                   ("seed-003-memory-scaling-3", 10, 0), ("seed-003-priority", 4, 0)]
    assert doc["summary"] == {"placed": 26, "pending": 8, "rejected": 0, "preempted": 1}
    for pod in doc["pods"]:
        if pod["scenario"] == "seed-003-priority":
            continue
        assert set(pod) >= {"name", "node", "status", "devices", "reason"}
        if pod["status"] == "placed":
            assert pod["node"] == "cosmo-ai01" and pod["reason"] is None
            assert [set(d) for d in pod["devices"]] == [{"uuid", "memory", "cores"}]
        else:
            assert pod["node"] is None and pod["devices"] == [] and pod["reason"]


def test_seed_003_priority_takes_effect() -> None:
    """The report's priority experiment: "not recognised, no effect" in HAMi's
    predecessor. Here the high-priority pod runs first on the shared GPU and the others
    are held to the floor; a production pod preempts one batch pod, no more."""
    out = vgpud("simulate", str(EXAMPLES / "seed-003.yaml"), "--output", "json")
    doc = json.loads(out.stdout)
    (prio,) = [s for s in doc["scenarios"] if s["name"] == "seed-003-priority"]
    pods = {p["name"]: p for p in prio["pods"]}
    assert pods["urgent"]["status"] == "placed" and pods["urgent"]["preempted"] == ["batch-1"]
    assert pods["batch-1"]["status"] == "preempted"
    assert "preempted by urgent" in pods["batch-1"]["reason"]
    assert {p["status"] for n, p in pods.items() if n != "batch-1"} == {"placed"}
    (gpu,) = prio["gpus"]
    assert dict(map(tuple, gpu["sm"])) == {"high": 85.0, "low": 5.0, "batch-0": 5.0,
                                           "urgent": 5.0}


def test_default_command_runs_the_bundled_scenario() -> None:
    out = vgpud("simulate")
    assert out.returncode == 0, out.stderr
    assert "6 placed, 4 pending" in out.stdout and "10 placed, 0 pending" in out.stdout


def test_every_bundled_example_runs() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert len(files) >= 2
    for f in files:
        out = vgpud("simulate", str(f), "-o", "json")
        assert out.returncode == 0, (f, out.stderr)
        doc = json.loads(out.stdout)
        assert doc["summary"]["placed"] > 0


def test_mixed_cluster_exercises_every_policy() -> None:
    out = vgpud("simulate", str(EXAMPLES / "mixed-cluster.yaml"), "-o", "json")
    doc = json.loads(out.stdout)
    pods = {p["name"]: p for p in doc["pods"]}
    assert doc["summary"]["rejected"] >= 1  # the malformed request is refused with a reason
    for p in doc["pods"]:
        if p["status"] != "placed":
            assert p["reason"]
    # uuid include pins the pod; type include picks the A100 node
    assert pods["pinned"]["devices"][0]["uuid"] == "GPU-a100-node-1-3"
    assert all(p["node"] == "a100-node-1" for n, p in pods.items()
               if n.startswith("a100-only") and p["status"] == "placed")
    # nvlink pods land on linked GPUs
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    for n, p in pods.items():
        if n.startswith("nvlink-pair") and p["status"] == "placed":
            assert p["node"] == "h100-node" and len(p["devices"]) == 2
    # pods with a duration left, and pending pods were placed after they did
    assert any(p["left"] is not None for p in doc["pods"])
    assert all(g["memory_used"] <= g["memory"] for g in gpus.values())


@pytest.mark.parametrize(("content", "fragment"), [
    ("nodes: []", "nodes"),
    ("nodes: [{name: a, gpus: [{model: x, memory: -1}]}]", "memory"),
    ("nodes: [{name: a}]\nconfig: {deviceSplitCount: 0}", "deviceSplitCount"),
    ("nodes: [{name: a}]\nconfig: {colour: red}", "unknown key"),
    ("{{{", "not valid YAML"),
    ("[1, 2]", "expected a mapping"),
    ("nodes: [{name: a}, {name: a}]", "share a name"),
])
def test_bad_scenarios_get_a_clear_error(tmp_path: Path, content: str, fragment: str) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(content)
    out = vgpud("simulate", str(f))
    assert out.returncode == 2
    assert fragment in out.stderr and "Traceback" not in out.stderr


def test_missing_file() -> None:
    out = vgpud("simulate", "/nonexistent.yaml")
    assert out.returncode == 2 and "cannot read scenario" in out.stderr


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "alloc.png"
    out = vgpud("simulate", str(EXAMPLES / "seed-003.yaml"), "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mig_inventories_under_both_strategies() -> None:
    out = vgpud("simulate", str(EXAMPLES / "mig.yaml"), "--output", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    pods = {p["name"]: p for p in doc["pods"]}
    gpus = {g["uuid"]: g for g in doc["gpus"]}  # one scenario: the document is it
    mixed = {u for u, g in gpus.items() if g["node"] == "mig-mixed" and g["mig"] != "mode"}
    single = {u for u, g in gpus.items() if g["node"] == "mig-single" and g["mig"] == "shared"}
    assert len(mixed) == 7 and len(single) == 7
    for k in range(3):  # whole 1g.10gb instances, each once
        (d,) = pods[f"small-instance-{k}"]["devices"]
        assert gpus[d["uuid"]]["mig"] == "1g.10gb" and d["memory"] == 9728
    assert len({pods[f"small-instance-{k}"]["devices"][0]["uuid"] for k in range(3)}) == 3
    assert "whole MIG 1g.10gb instance" in pods["small-instance-3"]["reason"]
    assert [gpus[d["uuid"]]["mig"] for d in pods["two-halves"]["devices"]] == ["3g.40gb"] * 2
    assert gpus[pods["hami-mig"]["devices"][0]["uuid"]]["mig"] == "2g.20gb"
    assert pods["no-such-profile"]["status"] == "pending"
    # vGPU slices: never on a mixed instance or a MIG-mode GPU; inside shared instances
    slices = [pods[f"slice-{k}"]["devices"][0]["uuid"] for k in range(12)]
    assert not set(slices) & mixed
    assert all(gpus[u]["mig"] in ("", "shared") for u in slices)
    assert sum(u in single for u in slices) >= 8
    assert pods["big-slice"]["devices"][0]["uuid"] == "GPU-plain-0"
    for g in gpus.values():
        if g["mig"] == "mode":
            assert g["vgpus_used"] == 0 and not g["holders"]


def test_bad_mig_inventories_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    for gpu, message in [
        ("{model: A100, memory: 81920, migInstances: [4g.40gb, 4g.40gb]}", "7 compute slices"),
        ("{model: A100, memory: 40960, migInstances: [3g.40gb, 3g.40gb]}", "more memory"),
        ("{model: A100, memory: 81920, migInstances: [big]}", "not a MIG profile name"),
    ]:
        bad.write_text(f"nodes: [{{name: n, gpus: [{gpu}]}}]\n")
        out = vgpud("simulate", str(bad))
        assert out.returncode != 0 and message in out.stderr, (gpu, out.stderr)
        assert "Traceback" not in out.stderr
