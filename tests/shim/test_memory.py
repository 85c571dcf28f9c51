"""Memory limits, as a workload sees them, against the fake driver, with the
ASan/UBSan build of the shim."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from vgpud.node.usage_state import read_usage

from .conftest import Registration, Shim

OOM = 2
MIB = 1 << 20
VIAS = ["direct", "dlsym", "default", "next", "proc", "ptsz", "proc1", "procself"]


def by_op(out: list[dict], op: str) -> list[dict]:
    return [o for o in out if o["op"] == op]


@pytest.mark.parametrize("via", VIAS)
def test_limit_is_exact_whatever_the_way_to_the_driver(shim: Shim, via: str) -> None:
    limit = 1_000_000
    shim.config(device__0__memory_limit=str(limit))
    out, _ = shim.run(
        "resolve",
        "ctx",
        "alloc",
        600_000,
        "alloc",
        400_000,
        "alloc",
        1,
        "info",
        "total",
        "nvml",
        "free",
        0,
        "info",
        "nvml",
        via=via,
    )
    assert out[0]["missing"] == (2 if via == "proc1" else 0)  # Ex/instantiate are 12.x/11.4
    allocs = by_op(out, "alloc")
    assert [a["rc"] for a in allocs] == [0, 0, OOM]  # exactly at the limit, then refused
    info = by_op(out, "info")
    assert (info[0]["total"], info[0]["free"]) == (limit, 0)
    assert (info[1]["total"], info[1]["free"]) == (limit, 600_000)
    assert by_op(out, "total")[0]["total"] == limit
    nvml = by_op(out, "nvml")
    for n, used in zip(nvml, (limit, 400_000), strict=True):
        assert (n["total"], n["used"], n["free"]) == (limit, used, limit - used)
        assert (n["total2"], n["used2"], n["free2"]) == (limit, used, limit - used)


# (ops that allocate, bytes the shim must charge). Stream-ordered allocations are
# charged as their pool's reserved size (the fake's pools grow in 2 MiB pieces), and
# given back when the pool releases it, at a sync point.
PATHS = {
    "alloc": (["alloc", 65536], 65536),
    "pitch": (["pitch", 1000, 10], 1024 * 10),
    "managed": (["managed", 65536], 65536),
    "async": (["async", 65536], 2 * MIB),
    "pool": (["pool", 65536], 2 * MIB),
    "vmm": (["vmm", 2 * MIB], 2 * MIB),
    "array": (["array", 100, 10], 100 * 10 * 4),
    "array3d": (["array3d", 10, 10, 10], 10 * 10 * 10 * 4),
    "mipmap": (["mipmap", 8, 8, 4], (64 + 16 + 4 + 1) * 4),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("via", ["dlsym", "proc"])
def test_every_allocation_path_is_charged_and_released(shim: Shim, path: str, via: str) -> None:
    ops, charged = PATHS[path]
    limit = charged + 100
    shim.config(device__0__memory_limit=str(limit))
    out, _ = shim.run("ctx", *ops, "info", "alloc", 101, "alloc", 100, "free", 0, "sync",
                      "info", via=via)
    assert out[1]["rc"] == 0, out[1]
    info = by_op(out, "info")
    assert info[0]["free"] == limit - charged
    assert [a["rc"] for a in by_op(out, "alloc")][-2:] == [OOM, 0]
    assert by_op(out, "free")[0]["rc"] == 0
    assert info[1]["free"] == limit - 100  # the path's bytes came back, the 100 are held


def test_path_refused_when_over_limit(shim: Shim) -> None:
    shim.config(device__0__memory_limit=str(MIB))
    out, _ = shim.run(
        "ctx",
        "vmm",
        2 * MIB,
        "async",
        2 * MIB,
        "pool",
        2 * MIB,
        "managed",
        2 * MIB,
        "pitch",
        4096,
        512,
        "array3d",
        512,
        512,
        2,
        "info",
    )
    assert [o["rc"] for o in out[1:-1]] == [OOM] * 6
    assert out[-1]["free"] == MIB


def test_vmm_host_location_is_not_device_memory(shim: Shim) -> None:
    shim.config(device__0__memory_limit=str(MIB))
    out, _ = shim.run("ctx", "vmmhost", 2 * MIB, "info")
    assert out[1]["rc"] != OOM  # whatever the driver says, the shim did not refuse it
    assert out[2]["free"] == MIB


def test_null_arguments_never_crash_and_keep_driver_codes(shim: Shim) -> None:
    shim.config(device__0__memory_limit=str(MIB))
    with_shim, _ = shim.run("ctx", "nulls")
    without, _ = shim.run("ctx", "nulls", preload=False)
    a, b = with_shim[1], without[1]
    for key in (
        "alloc",
        "totalmem",
        "create_nh",
        "create_np",
        "array",
        "pitch",
        "launchex",
        "async",
        "free0",
    ):
        assert a[key] == b[key], key
    # NVML with a NULL device: an error either way (the shim may have initialised NVML,
    # so UNINITIALIZED can become INVALID_ARGUMENT)
    assert a["nvmlmem"] != 0 and b["nvmlmem"] != 0
    assert a["alloc"] != 0 and a["totalmem"] != 0
    # cuMemGetInfo with NULL outputs: success, and the non-NULL one still filled (HC#333)
    assert (a["info_nn"], a["info_fn"], a["info_nt"]) == (0, 0, 0)
    assert a["total"] == MIB and a["free"] == MIB


def test_no_config_file_uses_env(shim: Shim) -> None:
    env = {
        "VGPUD_CONFIG": "",  # standalone: no /etc/vgpud, no config named
        "VGPUD_MEMORY_LIMIT": "1m",
        "VGPUD_MEMORY_LIMIT_1": "2m",
        "VGPUD_STATE_DIR": str(shim.state_dir),
    }
    out, _ = shim.run("ctx", "alloc", MIB, "alloc", 1, "info", env=env)
    assert [o["rc"] for o in out] == [0, 0, OOM, 0] and out[3]["total"] == MIB
    out, _ = shim.run("ctx", "alloc", 2 * MIB, "alloc", 1, "info", env=env, dev=1)
    assert [o["rc"] for o in out] == [0, 0, OOM, 0] and out[3]["total"] == 2 * MIB


def test_a_named_config_that_is_missing_denies(shim: Shim) -> None:
    """Issue 9 item 3: VGPUD_CONFIG=/nonexistent used to fall back to the environment,
    i.e. no limit at all. A config that was named and is not there denies."""
    env = {"VGPUD_CONFIG": "/nonexistent/config", "VGPUD_MEMORY_LIMIT": "64g"}
    out, err = shim.run("ctx", "alloc", 16 << 30, "alloc", 4096, "info", env=env)
    assert [o["rc"] for o in out[1:3]] == [OOM, OOM]
    assert (out[3]["total"], out[3]["free"]) == (0, 0)
    assert "missing" in err and "refused" in err


@pytest.mark.parametrize(
    "text",
    [
        "version=1\ndevice.0.memory_limit=12x\n",
        "device.0.memory_limit=1048576\n",
        "version=9\ndevice.0.memory_limit=1048576\n",
        "version=1\ndevice.0.memory_limit=1048576\n\x00\x01garbage\n",
        "version=1\ndevice.0.core_limit=30\n",
    ],
)
def test_garbled_config_denies_and_ignores_env(shim: Shim, text: str) -> None:
    shim.config(text)
    env = {"VGPUD_MEMORY_LIMIT": "1g"}  # must not lift anything
    out, err = shim.run("ctx", "alloc", 4096, "info", "total", env=env)
    assert out[1]["rc"] == OOM
    assert (out[2]["total"], out[2]["free"]) == (0, 0)
    assert out[3]["total"] == 0
    lines = [line for line in err.splitlines() if "rejected" in line]
    assert len(lines) == 1 and "config" in lines[0] and "refused" in lines[0]


def test_unreadable_config_denies(shim: Shim) -> None:
    (shim.tmp / "config").mkdir()
    out, err = shim.run("ctx", "alloc", 4096)
    assert out[1]["rc"] == OOM
    assert "rejected" in err


def test_oversubscription_spills_only_when_the_gpu_is_full_and_only_so_far(shim: Shim) -> None:
    """Issue 9 item 8: spilling was unbounded, and a spilled pitched allocation returned
    success without its pitch. A 2 MiB GPU, a container of 8 MiB of which 2 may spill."""
    env = {"FAKECUDA_DEVICES": "2", "FAKECUDA_CTX_MIB": "0"}
    shim.config(device__0__memory_limit=str(8 * MIB), device__0__oversubscribe="1",
                device__0__spill_limit=str(2 * MIB))
    out, _ = shim.run("ctx", "alloc", 2 * MIB,  # on the device: it is full now
                      "pitch", 1000, 10,       # spilled, with its pitch
                      "alloc", MIB,            # spilled
                      "alloc", MIB,            # more than 2 MiB spilled: refused
                      "info", "physical", env=env)
    assert [o["rc"] for o in out[1:5]] == [0, 0, 0, OOM]
    assert out[2]["pitch"] == 1024
    spilled = 10 * 1024 + MIB
    assert (out[5]["total"], out[5]["free"]) == (8 * MIB, 8 * MIB - 2 * MIB - spilled)
    assert out[6]["bytes"] == 2 * MIB  # only what fits is on the device
    # without oversubscription a full GPU is a full GPU
    shim.config(device__0__memory_limit=str(8 * MIB))
    out, _ = shim.run("ctx", "alloc", 2 * MIB, "alloc", MIB, env=env)
    assert [o["rc"] for o in out[1:]] == [0, OOM]


def _spawn_hold(
    shim: Shim, *ops: str | int, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        shim.cmd(*ops, "hold"),
        env=shim.env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    for line in p.stdout:
        if '"hold"' in line:
            return p
    raise AssertionError(p.stderr.read() if p.stderr else "no output")


def test_limit_is_shared_by_processes_and_dead_usage_reclaimed(shim: Shim) -> None:
    shim.config(device__0__memory_limit="1000000")
    holder = _spawn_hold(shim, "ctx", "alloc", 600_000)
    try:
        snap = read_usage(shim.state_dir)
        assert snap.used(0) == 600_000 and snap.devices[0].limit == 1_000_000
        assert [p.pid for p in snap.processes] == [holder.pid]
        out, _ = shim.run("ctx", "alloc", 600_000, "alloc", 400_000, "info")
        assert [o["rc"] for o in out] == [0, OOM, 0, 0]
        assert out[3]["free"] == 0
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert read_usage(shim.state_dir).used(0) == 600_000  # until someone reclaims it
    out, _ = shim.run("ctx", "alloc", 600_000, "info")
    assert out[1]["rc"] == 0 and out[2]["free"] == 400_000
    snap = read_usage(shim.state_dir)
    assert snap.used(0) == 0 and snap.processes == ()


def test_context_memory_is_charged_through_registration(shim: Shim,
                                                        registration: Registration) -> None:
    """Issue 9 item 1: the host PID comes from the plugin (registration), not from a
    host /proc; with it, the context's memory is measured and charged, and NVML shows
    the process under its own PID."""
    offset = 100000
    registration.offset = offset
    shim.config(device__0__memory_limit=str(1 << 30), register=str(registration.path))
    env = {"FAKECUDA_CTX_MIB": "300", "FAKECUDA_HOST_PID_OFFSET": str(offset)}
    p = subprocess.Popen(shim.cmd("ctx", "alloc", MIB, "info", "nvml"), env=shim.env(env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr
    out = [json.loads(x) for x in stdout.splitlines()]
    ctx = 300 * MIB
    assert out[2]["free"] == (1 << 30) - ctx - MIB
    nvml = out[3]
    assert nvml["used"] == ctx + MIB
    assert registration.requests[0].startswith(f"vgpud-register 1 pid={p.pid} ")
    assert nvml["procs"] == [[p.pid, ctx + MIB]]  # its own PID, not the host's


def test_without_pid_mapping_context_is_not_guessed(shim: Shim) -> None:
    shim.config(device__0__memory_limit=str(1 << 30))
    env = {"FAKECUDA_CTX_MIB": "300", "FAKECUDA_HOST_PID_OFFSET": "100000"}
    t0 = time.monotonic()
    out, _ = shim.run("ctx", "alloc", MIB, "info", env=env)
    assert out[2]["free"] == (1 << 30) - MIB  # NVML never saw "our" pid: nothing charged
    assert time.monotonic() - t0 < 30


# The fake driver's first MIG device on GPU 0 (tests/fakes/CONTRACT.md): a 1g.10gb GPU
# instance at placement 0 has GPU-instance id 7, its one compute instance id 0.
MIG_UUID = "MIG-fa4ecda1-0000-4007-8000-000000000000"
MIG_GPU = {"FAKECUDA_DEVICES": "81920", "FAKECUDA_MIG": "0",
           "FAKECUDA_MIG_LAYOUT": "0:1g.10gb", "CUDA_VISIBLE_DEVICES": MIG_UUID}


def test_a_vgpu_slice_inside_a_mig_instance_is_limited_by_its_mig_uuid(shim: Shim) -> None:
    """migStrategy single: the limits file names the instance's MIG UUID; the shim finds
    it by cuDeviceGetUuid_v2 (v1 would give the GPU's), and holds the slice inside the
    instance's own 9728 MiB."""
    limit = 4000 * MIB
    shim.config(device__0__uuid=MIG_UUID, device__0__memory_limit=str(limit))
    out, _ = shim.run("ctx", "alloc", 3000 * MIB, "alloc", 1000 * MIB, "alloc", 1, "info",
                      "total", env=MIG_GPU)
    assert [a["rc"] for a in by_op(out, "alloc")] == [0, 0, OOM]
    assert (by_op(out, "info")[0]["total"], by_op(out, "info")[0]["free"]) == (limit, 0)
    assert by_op(out, "total")[0]["total"] == limit
    # without the shim the instance, not the 80 GiB GPU, bounds the process
    shim.config(device__0__uuid="GPU-fa4ecda0-0000-4000-8000-000000000000",
                device__0__memory_limit=str(limit))
    raw, _ = shim.run("ctx", "total", "alloc", 9728 * MIB, "alloc", 1, env=MIG_GPU,
                      preload=False)
    assert by_op(raw, "total")[0]["total"] == 9728 * MIB
    assert [a["rc"] for a in by_op(raw, "alloc")] == [0, OOM]
