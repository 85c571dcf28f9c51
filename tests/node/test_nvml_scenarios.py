"""The node scenarios over the fake NVML, each in a child process (tests/node/nvml_node.py):
GPUs that fall off the bus, are added and swapped (device events of the fake NVML), and
MIG ``mixed`` and ``single`` on two A100-like GPUs in MIG mode whose instances the fake
NVML made (``FAKECUDA_MIG_LAYOUT``), under vgpud's names and HAMi's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.build import build_fakes
from tests.plugin.mig import LAYOUT

ROOT = Path(__file__).resolve().parents[2]


def run(scenario: str, tmp: Path, **knobs: str) -> None:
    lib = build_fakes()
    events = tmp / "events"
    events.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKECUDA_", "VGPUD_"))}
    env.update(knobs, LD_LIBRARY_PATH=str(lib), PYTHONPATH=str(ROOT),
               FAKECUDA_EVENTS=str(events), FAKECUDA_STATE=str(tmp / "gpu.state"))
    done = subprocess.run([sys.executable, "-m", "tests.node.nvml_node", scenario], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, (done.stderr[-6000:] or done.stdout[-3000:])


def test_gpus_fall_off_the_bus_are_added_and_swapped(tmp_path: Path) -> None:
    # four GPUs on the bus and a fifth that is plugged in during the test
    run("hotplug", tmp_path, FAKECUDA_DEVICES="24576,24576,24576,24576,24576",
        FAKECUDA_ABSENT="4")


@pytest.mark.parametrize("scenario", ["mixed", "single", "mixed-hami", "single-hami"])
def test_mig_on_the_fake_nvml(scenario: str, tmp_path: Path) -> None:
    layout = ";".join(f"{g}:{','.join(p)}" for g, p in LAYOUT.items())
    run(scenario, tmp_path, FAKECUDA_DEVICES="81920,81920", FAKECUDA_MIG="0,1",
        FAKECUDA_MIG_LAYOUT=layout)
