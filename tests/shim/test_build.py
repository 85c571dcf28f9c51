"""Build-level checks: C unit tests, the ABI against the official headers, the
exported symbol set, no constructors, and the state-file layout vs the Python view."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

from vgpud.node import usage_state

from .conftest import CSRC, PROGS, ROOT, Built


def test_c_unit_tests_pass(built: Built) -> None:
    p = subprocess.run(["make", "-s", "-C", str(PROGS), "check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"\d+ checks, 0 failures", p.stdout)


def _official_include() -> Path:
    import nvidia  # the nvidia-cuda-runtime / nvidia-nvml-dev wheels

    for base in nvidia.__path__:
        inc = Path(base) / "cu13" / "include"
        if (inc / "cuda.h").exists() and (inc / "nvml.h").exists():
            return inc
    raise AssertionError("official cuda.h / nvml.h not found in the nvidia wheels")


def test_declarations_match_official_headers(tmp_path: Path) -> None:
    probe = PROGS / "abi_probe.c"
    ours, official = tmp_path / "ours", tmp_path / "official"
    flags = ["-std=gnu11", "-Wall", "-Werror", f"-I{CSRC / 'src'}"]
    subprocess.run(
        ["gcc", *flags, f"-I{CSRC / 'include'}", str(probe), "-o", str(ours)], check=True
    )
    # the official build also _Static_asserts every hooks.def prototype
    subprocess.run(
        [
            "gcc",
            *flags,
            "-DVG_PROBE_OFFICIAL",
            f"-I{_official_include()}",
            str(probe),
            "-o",
            str(official),
        ],
        check=True,
    )
    a = subprocess.run([str(ours)], capture_output=True, text=True, check=True).stdout
    b = subprocess.run([str(official)], capture_output=True, text=True, check=True).stdout
    assert a.count("\n") > 80
    assert a == b


def _hook_names() -> set[str]:
    text = (CSRC / "src/hooks.def").read_text()
    return set(re.findall(r"^HOOK\(\w+, (\w+),", text, re.M))


def test_exports_exactly_the_hooks(built: Built) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(built.lib)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    assert exported == _hook_names() | {"dlsym", "dlmopen", "dlerror"}
    assert "cuMemAlloc_v2" in exported and "cuGetProcAddress_v2" in exported


def test_no_constructors_and_versioned_file(built: Built) -> None:
    real = built.lib.resolve()
    assert re.fullmatch(r"libvgpu\.so\.\d+\.\d+\.\d+", real.name)
    out = subprocess.run(
        ["readelf", "-W", "-S", str(real)], capture_output=True, text=True, check=True
    ).stdout
    sizes = [
        int(m.group(1), 16)
        for m in re.finditer(r"\.init_array\s+INIT_ARRAY\s+\S+\s+\S+\s+(\S+)", out)
    ]
    assert sizes in ([], [8])  # only the compiler's frame_dummy, nothing of ours
    dyn = subprocess.run(
        ["readelf", "-W", "-d", str(real)], capture_output=True, text=True, check=True
    ).stdout
    assert f"[{real.name}]" in dyn  # soname = the versioned name


LAYOUT_PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include "vgpu_state_abi.h"
#define P(k, T, f) printf(k " %s %zu %zu\n", #f, offsetof(T, f), sizeof(((T *)0)->f));
#define H(f) P("header", vg_state_header, f)
#define S(f) P("slot", vg_state_slot, f)
int main(void) {
  printf("const magic %llu\nconst version %u\nconst max_devices %d\nconst max_slots %d\n",
         (unsigned long long)VG_STATE_MAGIC, VG_STATE_VERSION, VG_MAX_DEVICES, VG_MAX_SLOTS);
  printf("const header_size %zu\nconst slot_size %zu\nconst file_size %zu\n",
         sizeof(vg_state_header), sizeof(vg_state_slot), sizeof(vg_state_file));
  printf("const file_name %s\n", VG_STATE_FILE);
  H(magic) H(version) H(header_size) H(slot_size) H(max_slots) H(max_devices)
  H(device_count) H(generation) H(limit) H(core_limit) H(used) H(spilled) H(sm_tokens)
  H(sm_refill) H(sm_rate) H(lock)
  S(pid) S(host_pid) S(start_time) S(last_seen) S(used) S(context) S(spilled)
  return 0;
}
"""


def test_state_layout_matches_python_view(tmp_path: Path) -> None:
    import struct

    src = tmp_path / "layout.c"
    src.write_text(LAYOUT_PROBE)
    exe = tmp_path / "layout"
    subprocess.run(
        [
            "gcc",
            "-std=gnu11",
            "-Wall",
            "-Werror",
            f"-I{CSRC / 'include'}",
            str(src),
            "-o",
            str(exe),
        ],
        check=True,
    )
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    consts: dict[str, str] = {}
    fields: dict[tuple[str, str], tuple[int, int]] = {}
    for line in lines.splitlines():
        kind, name, *rest = line.split()
        if kind == "const":
            consts[name] = rest[0]
        else:
            fields[(kind, name)] = (int(rest[0]), int(rest[1]))
    assert int(consts["magic"]) == usage_state.MAGIC
    assert int(consts["version"]) == usage_state.VERSION
    assert int(consts["max_devices"]) == usage_state.MAX_DEVICES
    assert int(consts["max_slots"]) == usage_state.MAX_SLOTS
    assert int(consts["header_size"]) == usage_state.HEADER_SIZE
    assert int(consts["slot_size"]) == usage_state.SLOT_SIZE
    assert int(consts["file_size"]) == usage_state.FILE_SIZE
    assert consts["file_name"] == usage_state.STATE_FILE
    for kind, table in (("header", usage_state.HEADER_FIELDS), ("slot", usage_state.SLOT_FIELDS)):
        c_names = {n for (k, n) in fields if k == kind}
        assert set(table) == c_names, (kind, set(table) ^ c_names)
        for name, (offset, fmt) in table.items():
            assert fields[(kind, name)] == (offset, struct.calcsize(fmt)), (kind, name)


def test_python_view_rejects_foreign_files(tmp_path: Path) -> None:
    import pytest

    bad = tmp_path / "usage.v1"
    bad.write_bytes(b"\0" * usage_state.FILE_SIZE)
    with pytest.raises(usage_state.StateFileError, match="not a version-1"):
        usage_state.read_usage(tmp_path)
    bad.write_bytes(b"short")
    with pytest.raises(usage_state.StateFileError, match="shorter"):
        usage_state.read_usage(bad)
    with pytest.raises(usage_state.StateFileError):
        usage_state.read_usage(tmp_path / "missing")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", str(ROOT / "tests/shim")]))


def _file_dependencies(tmp_path: Path) -> dict[str, dict[str, set[str]]]:
    """Which of the shim's files each file calls (or reads a global of): from the
    objects' symbol tables, so a declaration without a use is no dependency."""
    defined: dict[str, str] = {}
    wanted: dict[str, set[str]] = {}
    for src in sorted((CSRC / "src").glob("*.c")):
        obj = tmp_path / f"{src.stem}.o"
        subprocess.run(["gcc", "-std=gnu11", "-fPIC", "-fvisibility=hidden",
                        f"-I{CSRC / 'include'}", f"-I{CSRC / 'src'}", "-c", str(src),
                        "-o", str(obj)], check=True)
        wanted[src.stem] = set()
        for line in subprocess.run(["nm", str(obj)], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRCV":
                defined[parts[2]] = src.stem
            elif len(parts) == 2 and parts[0] == "U":
                wanted[src.stem].add(parts[1])
    deps: dict[str, dict[str, set[str]]] = {f: {} for f in wanted}
    for f, names in wanted.items():
        for name in names:
            g = defined.get(name)
            if g is not None and g != f:
                deps[f].setdefault(g, set()).add(name)
    return deps


def test_the_shim_files_depend_one_way(tmp_path: Path) -> None:
    """No cycle between the shim's files (the allocation table, the real entry points
    and the context accounting each sit below the hooks that use them), and real.c,
    the bottom, calls no other file."""
    deps = _file_dependencies(tmp_path)
    assert {"real", "allocations", "contexts", "hooks", "dispatch"} <= deps.keys()
    assert deps["real"] == {}, deps["real"]
    done: set[str] = set()

    def visit(f: str, path: list[str]) -> None:
        if f in path:
            cycle = [*path[path.index(f):], f]
            steps = [f"{a} -> {b} ({', '.join(sorted(deps[a][b]))})"
                     for a, b in itertools.pairwise(cycle)]
            raise AssertionError("a cycle between the shim's files: " + "; ".join(steps))
        if f in done:
            return
        for g in sorted(deps[f]):
            visit(g, [*path, f])
        done.add(f)

    for f in sorted(deps):
        visit(f, [])


def test_the_fakes_share_no_header_with_the_shim() -> None:
    """The fake driver and NVML (tests/fakes: the libraries and their own test programs)
    declare the ABI themselves: none of their sources reaches a header of the shim
    (csrc/include, csrc/src), and their build names no include path, so a mistake in the
    shim's declarations cannot be mirrored by the fakes and go unseen."""
    fakes = ROOT / "tests/fakes"
    shim_headers = {p.name for d in ("include", "src") for p in (CSRC / d).iterdir()
                    if p.suffix in (".h", ".def")}
    sources = sorted(p for p in fakes.rglob("*") if p.suffix in (".c", ".h")
                     and "build" not in p.relative_to(fakes).parts)
    assert len(sources) > 20
    for src in sources:
        text = src.read_text()
        for inc in re.findall(r'^\s*#\s*include\s*"([^"]+)"', text, re.M):
            target = (src.parent / inc).resolve()
            assert target.is_file(), f"{src}: #include \"{inc}\" is not beside it"
            assert target.is_relative_to(fakes), f"{src}: #include \"{inc}\" leaves tests/fakes"
        for inc in re.findall(r"^\s*#\s*include\s*<([^>]+)>", text, re.M):
            assert Path(inc).name not in shim_headers, f"{src}: #include <{inc}> is the shim's"
    build = (fakes / "Makefile").read_text() + (fakes / "build.py").read_text()
    assert "csrc" not in build and not re.search(r"(^|\s)-I", build)


def test_the_c_test_programs_are_one_tree() -> None:
    """The shim's C test programs live in tests/shim/progs; csrc holds the shim only."""
    assert not (CSRC / "tests").exists()
    assert {"abi_probe.c", "test_unit.c", "drv.c", "bench.c"} <= {
        p.name for p in PROGS.glob("*.c")}
