"""A limits file the plugin wrote makes the shim enforce the assigned memory.

The plugin configures a container (1000 MiB on GPU 0) through the fake kubelet; then
a small driver-API program runs under the shim (``LD_PRELOAD``) on the fake
``libcuda.so.1`` with ``VGPUD_CONFIG`` pointing at that file, and allocates 300 MiB
at a time. The shim and the fake driver come from the shim tests' session build
(:func:`tests.shim.conftest.built`): a build that fails fails the test, never skips it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.fakekubelet import FakePod
from tests.plugin.harness import node_harness, placement
from tests.shim.conftest import Built
from vgpud.node.allocations import AllocationStore

pytestmark = pytest.mark.anyio

PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
typedef int (*init_t)(unsigned); typedef int (*get_t)(int *, int);
typedef int (*ctx_t)(void **, unsigned, int); typedef int (*alloc_t)(unsigned long long *, size_t);
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("{\"error\": \"dlopen\"}\n"); return 2; }
    init_t init = (init_t)dlsym(h, "cuInit"); get_t get = (get_t)dlsym(h, "cuDeviceGet");
    ctx_t ctx = (ctx_t)dlsym(h, "cuCtxCreate_v2");
    alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    int dev = 0; void *c = 0; unsigned long long p = 0;
    printf("{\"init\": %d}\n", init(0)); printf("{\"get\": %d}\n", get(&dev, 0));
    printf("{\"ctx\": %d}\n", ctx(&c, 0, dev));
    for (int i = 0; i < 5; i++) printf("{\"alloc\": %d}\n", alloc(&p, (size_t)300 << 20));
    return 0;
}
"""


def _program(tmp: Path) -> Path:
    prog = tmp / "alloc"
    (tmp / "alloc.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-o", str(prog), str(tmp / "alloc.c"), "-ldl"], check=True)
    return prog


async def test_shim_enforces_a_limits_file_the_plugin_wrote(built: Built, tmp_path: Path
                                                             ) -> None:
    lib, fakes, prog = built.lib, built.fakes, _program(tmp_path)
    async with node_harness(1) as h:
        h.add_pod("p1", {"main": 1}, placement({"main": [(0, 1000, 0)]}))
        a = await h.kubelet_call(h.kubelet.run, FakePod("default", "p1", [("main", 1)]))
        alloc = AllocationStore(h.state_dir).path(a.ids["main"])
        config = alloc / "etc" / "config"
        # the container sees its state directory at the config's state_dir; point it at
        # one of the test's (the harness's goes with it; a state directory named but
        # missing refuses the GPU)
        state = tmp_path / "state"
        state.mkdir()
        text = config.read_text().replace("state_dir=/var/run/vgpud", f"state_dir={state}")
        local = tmp_path / "config"
        local.write_text(text)
    env = {**os.environ, "LD_LIBRARY_PATH": str(fakes), "LD_PRELOAD": str(lib),
           "VGPUD_CONFIG": str(local), "FAKECUDA_DEVICES": "24576", "FAKECUDA_CTX_MIB": "0"}
    done = await anyio.run_process([str(prog)], env=env, check=False)
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    allocs = [line for line in stdout.splitlines() if '"alloc"' in line]
    assert len(allocs) == 5, stdout + stderr
    # 1000 MiB: three 300 MiB allocations fit, the fourth is refused (2 = OUT_OF_MEMORY)
    assert allocs[:3] == ['{"alloc": 0}'] * 3
    assert allocs[3:] == ['{"alloc": 2}'] * 2
