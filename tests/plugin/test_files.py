"""The on-disk allocation store, the fake devices file, the shim installer, the protos."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vgpud.core.model import DeviceGrant
from vgpud.node.allocations import AllocationOwner, AllocationStore
from vgpud.node.fakegpus import FakeDevicesError, parse_fake_devices
from vgpud.node.shim import ShimError, install

ROOT = Path(__file__).resolve().parents[2]


def test_store_prepare_configure_and_reload(tmp_path: Path) -> None:
    s = AllocationStore(tmp_path)
    ids = ["GPU-a::1", "GPU-b::0"]
    a = s.prepare(ids)
    assert a.owner is None and not a.config.exists() and a.state.is_dir()
    assert s.prepare(list(reversed(ids))).dir == a.dir  # idempotent, order-insensitive
    owner = AllocationOwner("ns", "p", "c", "uid-1")
    granted = (DeviceGrant("GPU-a", 1000, 0), DeviceGrant("GPU-b", 2000, 100))
    s.configure(ids, owner, "version=1\n", granted)
    (a.state / "usage").write_text("x")
    s.configure(ids, owner, "version=1\n", granted)  # same owner again: state kept
    assert (a.state / "usage").exists()
    s.configure(ids, AllocationOwner("ns", "q", "c", "uid-2"), "version=1\n",
                granted)  # a new owner
    assert not (a.state / "usage").exists()  # ... gets a fresh state directory
    assert [x.owner for x in s.configured()] == [AllocationOwner("ns", "q", "c", "uid-2")]
    restarted = AllocationStore(tmp_path)
    assert restarted.configured() == []
    (got,) = restarted.all()
    assert got.owner == AllocationOwner("ns", "q", "c", "uid-2") and got.ids == tuple(sorted(ids))
    assert got.devices == granted  # what was granted, as values: no-limit and 100 % kept
    assert restarted.configured() == [got]
    assert got.config.read_text() == "version=1\n"
    assert not [p for p in a.etc.iterdir() if p.name.startswith(".")]  # no temp files left
    s.remove(got.key)
    assert s.configured() == [] and not a.dir.exists()


@pytest.mark.parametrize(("text", "why"), [
    ("{", "not valid YAML or JSON"),
    ("devices: 3", 'expected {"devices"'),
    ('{"devices": [{"index": 0, "memory": 10}]}', "uuid"),
    ('{"devices": [{"uuid": "a", "index": 0, "memory": -1}]}', "memory"),
    ('{"devices": [{"uuid": "a", "index": 0, "memory": 1}, {"uuid": "a", "index": 1, '
     '"memory": 1}]}', "twice"),
])
def test_fake_devices_file_errors_are_clear(text: str, why: str) -> None:
    with pytest.raises(FakeDevicesError, match=why):
        parse_fake_devices(text, "f.yaml")


def test_fake_devices_yaml() -> None:
    found, used = parse_fake_devices(
        "devices:\n- {uuid: GPU-1, index: 0, memory: 8192, numa: 1, used: 100, minor: 3}\n", "f")
    assert found[0].gpu.numa == 1 and found[0].minor == 3 and used == {"GPU-1": 100}


def test_shim_install_is_versioned_and_never_overwrites(tmp_path: Path) -> None:
    src = tmp_path / "libvgpu.so.1.2.0"
    src.write_bytes(b"one")
    files = install(src, tmp_path / "host")
    assert files.host_lib.read_bytes() == b"one"
    assert files.host_preload.read_text() == "/usr/local/vgpud/lib/libvgpu.so.1.2.0\n"
    src.write_bytes(b"two")
    install(src, tmp_path / "host")
    assert files.host_lib.read_bytes() == b"one"
    with pytest.raises(ShimError, match=r"libvgpu\.so\.<version>"):
        install(tmp_path / "libvgpu.so", tmp_path / "host")


def test_generated_protos_have_not_drifted() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
