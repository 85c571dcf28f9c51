"""The CDI specs ``vgpud dra`` writes, read by the CDI library the container runtimes use
(``tags.cncf.io/container-device-interface`` v1.1.0, as containerd and CRI-O resolve the
CDI device IDs kubelet hands them): the spec loads without errors, every ID the plugin
answered resolves, and a container given several devices of one claim gets each mount once
(CDI replaces an edit of a container path it already has) and every GPU's device node.

``cdicheck/`` is a small Go program over that library, built once per checkout into the
user's cache; where Go cannot build it the test skips with the reason (fails when
``VGPUD_REALKUBE_REQUIRED`` is set), as the real-component tests do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.core.test_claims import claim, result
from tests.debian import unavailable
from tests.dra.conftest import REF, UID, MemoryClaims, preparer
from vgpud.dra import cdi
from vgpud.node.vendors import Nvidia

pytestmark = pytest.mark.anyio
HERE = Path(__file__).resolve().parent / "cdicheck"
REQUIRED = "VGPUD_REALKUBE_REQUIRED"


class NoGo(RuntimeError):
    pass


def _build() -> Path:
    go = shutil.which("go")
    if go is None:
        raise NoGo("no Go toolchain on PATH")
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        h.update((HERE / name).read_bytes())
    out = Path.home() / ".cache" / "vgpud" / f"cdicheck-{h.hexdigest()[:12]}" / "cdicheck"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0",
           "GOFLAGS": (os.environ.get("GOFLAGS", "") + " -mod=readonly").strip()}
    done = subprocess.run([go, "build", "-trimpath", "-o", str(out), "."], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise NoGo(f"go build of {HERE} failed:\n{done.stderr[-2000:]}")
    return out


@pytest.fixture(scope="module")
def cdicheck() -> Path:
    try:
        return _build()
    except (NoGo, subprocess.TimeoutExpired) as e:
        unavailable("CDI library (Go)", REQUIRED, e)


async def test_the_cdi_library_resolves_the_plugins_ids_into_one_set_of_edits(
        tmp_path: Path, gpus: Nvidia, cdicheck: Path) -> None:
    p = await preparer(tmp_path, gpus, MemoryClaims(claim(
        result("gpu-0", "a"), result("gpu-1", "b", memory="8Gi", cores="50"))))
    got = await p.prepare(REF)
    ids = [i for d in got.devices for i in d.cdi_ids]
    # this host has no /dev/nvidiaN: the library stats a device node's host path, so the
    # copy it reads points them at /dev/null (the container paths stay the plugin's)
    specs = tmp_path / "cdi-for-check"
    specs.mkdir()
    doc = json.loads(cdi.spec_path(tmp_path / "cdi", UID).read_text())
    for d in doc["devices"]:
        for n in d["containerEdits"].get("deviceNodes", []):
            n["hostPath"] = "/dev/null"
    (specs / cdi.spec_path(tmp_path / "cdi", UID).name).write_text(json.dumps(doc))
    done = await anyio.run_process([str(cdicheck), str(specs), *ids, ids[0]], check=False)
    assert done.returncode == 0, done.stderr.decode()
    edits = json.loads(done.stdout)
    mounts = [m["destination"] for m in edits["mounts"]]
    assert sorted(mounts) == sorted(set(mounts)), mounts  # each once, for three IDs
    alloc = p.store.root / got.key
    by_path = {m["destination"]: m for m in edits["mounts"]}
    assert by_path["/etc/vgpud"]["source"] == str(alloc / "etc")
    assert "ro" in by_path["/etc/vgpud"]["options"]
    assert by_path["/var/run/vgpud"]["source"] == str(alloc / "state")
    assert "ro" in by_path["/etc/ld.so.preload"]["options"]
    devices = sorted(d["path"] for d in edits["devices"])
    assert devices == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0",
                       "/dev/nvidia1", "/dev/nvidiactl"], devices
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in edits["env"]


def test_an_id_the_specs_do_not_have_fails_to_resolve(tmp_path: Path, cdicheck: Path) -> None:
    done = subprocess.run([str(cdicheck), str(tmp_path), cdi.device_id(f"{UID}-gpu-0")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "unresolvable" in done.stderr, done.stderr
