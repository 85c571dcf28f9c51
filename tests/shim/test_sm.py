"""SM limit: the controller's error against its target, measured in the fake
driver's simulation (fake_busy_ns over steady-state windows)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import Built, Shim

WINDOW_NS = 250_000_000
WARMUP_NS = 1_000_000_000
OFFSET = 100000


def _host_proc_entry(root: Path, pid: int) -> None:
    d = root / str(pid + OFFSET)
    d.mkdir(parents=True)
    stat = Path(f"/proc/{pid}/stat").read_text()
    (d / "stat").write_text(f"{pid + OFFSET}{stat[len(str(pid)) :]}")
    (d / "cgroup").write_text(Path(f"/proc/{pid}/cgroup").read_text())
    (d / "status").write_text(f"NSpid:\t{pid + OFFSET}\t{pid}\n")


class Container:
    """One container: its own config and state dir, sharing the fake device."""

    def __init__(self, built: Built, root: Path, name: str, fake_state: Path, **cfg: str):
        self.shim = Shim(built, root / name, asan=False)
        self.shim.tmp.mkdir()
        self.host_proc = root / "hostproc"
        self.host_proc.mkdir(exist_ok=True)
        self.shim.config(device__0__memory_limit="0", host_proc=str(self.host_proc), **cfg)
        self.env = {"FAKECUDA_STATE": str(fake_state), "FAKECUDA_HOST_PID_OFFSET": str(OFFSET)}

    def start(
        self, seconds: float, kind: str = "kernel", map_pid: bool = True
    ) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            self.shim.cmd("ctx", "launch", 100, seconds, kind, via="proc"),
            env=self.shim.env(self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if map_pid:  # what the plugin's host-/proc mount shows
            _host_proc_entry(self.host_proc, p.pid)
        return p


def _result(p: subprocess.Popen[str]) -> dict:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def _utilisation(built: Built, fake_state: Path, launch: dict) -> list[float]:
    """percent of each steady-state window this process's kernels held the device"""
    t0 = launch["t0"] + WARMUP_NS
    env = {
        "LD_LIBRARY_PATH": str(built.fakes),
        "FAKECUDA_STATE": str(fake_state),
        "PATH": os.environ.get("PATH", ""),
    }
    out = subprocess.run(
        [
            str(built.drv),
            "--via",
            "dlsym",
            "busy",
            str(launch["pid"] + OFFSET),
            str(t0),
            str(launch["t1"] - WINDOW_NS // 2),
            str(WINDOW_NS),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    windows = json.loads(out)["windows"]
    assert len(windows) >= 6
    return [100.0 * w / WINDOW_NS for w in windows]


def _mae(util: list[float], target: float) -> float:
    return sum(abs(u - target) for u in util) / len(util)


@pytest.fixture
def fake_state(tmp_path: Path) -> Path:
    return tmp_path / "fake.state"


def test_fixed_limit_alone(built: Built, tmp_path: Path, fake_state: Path) -> None:
    a = Container(built, tmp_path, "a", fake_state, device__0__core_limit="30")
    util = _utilisation(built, fake_state, _result(a.start(3.0)))
    print("fixed 30 alone:", [round(u, 1) for u in util], "MAE", round(_mae(util, 30), 2))
    assert _mae(util, 30) <= 3.0


def test_fixed_limits_shared(built: Built, tmp_path: Path, fake_state: Path) -> None:
    a = Container(built, tmp_path, "a", fake_state, device__0__core_limit="30")
    b = Container(built, tmp_path, "b", fake_state, device__0__core_limit="50")
    pa, pb = a.start(3.5), b.start(3.5)
    ua = _utilisation(built, fake_state, _result(pa))
    ub = _utilisation(built, fake_state, _result(pb))
    print("30+50: MAE", round(_mae(ua, 30), 2), round(_mae(ub, 50), 2))
    assert _mae(ua, 30) <= 3.0
    assert _mae(ub, 50) <= 3.0


@pytest.mark.parametrize("kind", ["coop", "graph", "ex"])
def test_every_launch_kind_is_charged(
    built: Built, tmp_path: Path, fake_state: Path, kind: str
) -> None:
    a = Container(built, tmp_path, "a", fake_state, device__0__core_limit="30")
    util = _utilisation(built, fake_state, _result(a.start(3.0, kind)))
    print(kind, [round(u, 1) for u in util])
    assert _mae(util, 30) <= 3.0


def test_missing_pid_mapping_fails_the_target(
    built: Built, tmp_path: Path, fake_state: Path
) -> None:
    """NVML speaks of host PIDs: a shim that uses its own PID learns nothing."""
    a = Container(built, tmp_path, "a", fake_state, device__0__core_limit="30")
    util = _utilisation(built, fake_state, _result(a.start(3.0, map_pid=False)))
    assert _mae(util, 30) > 3.0


def test_balance_uses_idle_capacity(built: Built, tmp_path: Path, fake_state: Path) -> None:
    a = Container(
        built,
        tmp_path,
        "a",
        fake_state,
        device__0__core_limit="30",
        device__0__core_policy="balance",
    )
    util = _utilisation(built, fake_state, _result(a.start(3.0)))
    print("balance 30 alone:", [round(u, 1) for u in util])
    assert min(util[2:]) > 45


def test_balance_never_below_limit_under_contention(
    built: Built, tmp_path: Path, fake_state: Path
) -> None:
    a = Container(
        built,
        tmp_path,
        "a",
        fake_state,
        device__0__core_limit="40",
        device__0__core_policy="balance",
    )
    b = Container(built, tmp_path, "b", fake_state, device__0__core_limit="0")  # unlimited
    pa, pb = a.start(3.5), b.start(3.5)
    ua = _utilisation(built, fake_state, _result(pa))
    _result(pb)
    print("balance 40 vs greedy:", [round(u, 1) for u in ua])
    assert sum(ua) / len(ua) >= 40 - 3.0


def test_priority_wins_under_contention(built: Built, tmp_path: Path, fake_state: Path) -> None:
    hi = Container(built, tmp_path, "hi", fake_state, device__0__core_limit="60", priority="1")
    lo = Container(built, tmp_path, "lo", fake_state, device__0__core_limit="60", priority="0")
    ph, pl = hi.start(3.5), lo.start(3.5)
    uh = _utilisation(built, fake_state, _result(ph))
    ul = _utilisation(built, fake_state, _result(pl))
    print("priority 60/60:", round(sum(uh) / len(uh), 1), round(sum(ul) / len(ul), 1))
    assert sum(uh) / len(uh) >= 60 - 3.0
    assert sum(ul) / len(ul) < sum(uh) / len(uh)
