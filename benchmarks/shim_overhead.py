"""Per-call overhead of the shim against the fake driver.

Builds the shim, the fake driver and tests/shim/progs/bench, then runs the bench
program without and with LD_PRELOAD=libvgpu.so (release build) and prints ns per
call and the ratio for a cuMemAlloc_v2 + cuMemFree_v2 pair (1 MiB, with a memory
limit configured, so the shared usage state is updated on every call) and for
cuLaunchKernel, without an SM limit (the path of an unthrottled launch) and with one
(every launch charged to the SM controller's bucket, which never has to sleep here).
The fake's kernels take 1 ns of device time, so launches are bound by the CPU and
the figures are the calls' own cost. The entry points are obtained through
cuGetProcAddress_v2, as libcudart does.

    python benchmarks/shim_overhead.py            # 200k calls per round, 5 rounds
    python benchmarks/shim_overhead.py --quick    # 20k calls (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build() -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT / "csrc")], check=True)
    try:
        sys.path.insert(0, str(ROOT))
        from tests.fakes.build import build_fakes

        fakes = Path(build_fakes())
    except ImportError:
        subprocess.run(["make", "-s", "-C", str(ROOT / "tests/fakes")], check=True)
        fakes = ROOT / "tests/fakes/build"
    subprocess.run(
        ["make", "-s", "-C", str(ROOT / "tests/shim/progs"), f"FAKES={fakes}"], check=True
    )
    return fakes


def run(fakes: Path, n: int, preload: bool, tmp: Path, config: str = "config",
        ) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPUD_", "FAKECUDA_"))}
    env.update(
        LD_LIBRARY_PATH=str(fakes),
        FAKECUDA_NS_PER_BLOCK="0",
        FAKECUDA_LAUNCH_NS="1",
        FAKECUDA_CTX_MIB="0",
        FAKECUDA_STATE=str(tmp / "fake.state"),
        VGPUD_CONFIG=str(tmp / config),
    )
    if preload:
        env["LD_PRELOAD"] = str(ROOT / "csrc/build/libvgpu.so")
    out = subprocess.run(
        [str(ROOT / "tests/shim/progs/build/bench"), str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (CI)")
    args = ap.parse_args()
    n = 20_000 if args.quick else 200_000
    fakes = build()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "state").mkdir()
        (tmp / "config").write_text(
            f"version=1\ndevice.0.memory_limit={1 << 34}\nstate_dir={tmp / 'state'}\n"
        )
        (tmp / "sm").write_text((tmp / "config").read_text() + "device.0.core_limit=50\n")
        base = run(fakes, n, False, tmp)
        shim = run(fakes, n, True, tmp)
        limited = run(fakes, n, True, tmp, "sm")
    print(
        f"calls per round: {n} (best of 5 rounds), fake driver, entry points via "
        "cuGetProcAddress_v2"
    )
    print(f"{'call':32} {'no shim ns':>11} {'shim ns':>9} {'added ns':>9} {'ratio':>6}")
    for key, label, with_shim in (
        ("alloc_free_ns", "cuMemAlloc_v2+cuMemFree_v2", shim),
        ("launch_ns", "cuLaunchKernel (no SM limit)", shim),
        ("launch_ns", "cuLaunchKernel (SM limit 50 %)", limited),
    ):
        b, s = base[key], with_shim[key]
        print(f"{label:32} {b:11.1f} {s:9.1f} {s - b:9.1f} {s / b:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
