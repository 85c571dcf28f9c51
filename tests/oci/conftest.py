"""Fixtures of the OCI container tests.

- ``runc`` (session): a :class:`~tests.oci.runtime.Runc` that has run a trivial
  container here; runc is installed with apt-get when missing (root only). When runc
  cannot be had or cannot run containers the tests are skipped with the reason, or
  fail with it when ``VGPUD_OCI_REQUIRED=1`` (for CI, where a skip would hide a broken
  setup).
- ``node`` (function): a :class:`~tests.oci.runtime.Node`; closing it at teardown
  deletes the test's containers and cgroups and fails the test if any are left.
- ``compile_c`` (session): ``compile_c(source, *gcc_flags) -> Path`` of the binary, in a
  session temp dir (one build per source and flags).
- ``probe`` (session): the directory holding the selftests' ``probe`` program, to pass as
  ``driver=`` (it is then ``/opt/fakecuda/probe`` in the container).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.debian import unavailable
from tests.oci.runtime import Node, Runc, RuncUnavailable, obtain_runc

PROGS = Path(__file__).resolve().parent / "progs"


@pytest.fixture(scope="session")
def runc() -> Runc:
    try:
        return obtain_runc()
    except RuncUnavailable as e:
        unavailable("runc", "VGPUD_OCI_REQUIRED", e)


@pytest.fixture
def node(runc: Runc) -> Iterator[Node]:
    n = Node(runc)
    yield n
    n.close()


@pytest.fixture(scope="session")
def compile_c(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    gcc = shutil.which("gcc") or shutil.which("cc")
    out_dir = tmp_path_factory.mktemp("oci-bin")
    built: dict[tuple[str, ...], Path] = {}

    def compile_(source: Path, *flags: str) -> Path:
        if gcc is None:
            pytest.skip("no C compiler (gcc/cc) to build the container test programs")
        key = (str(source), *flags)
        if key not in built:
            d = out_dir / str(len(built))
            d.mkdir()
            exe = d / source.stem
            r = subprocess.run([gcc, "-O1", "-Wall", "-Werror", "-o", str(exe), str(source),
                                *flags], capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"compiling {source} failed:\n{r.stdout}{r.stderr}")
            built[key] = exe
        return built[key]

    return compile_


@pytest.fixture(scope="session")
def probe(compile_c: Callable[..., Path]) -> Path:
    return compile_c(PROGS / "probe.c").parent
