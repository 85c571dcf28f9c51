"""Regenerate the kubelet gRPC bindings (betterproto2, grpclib): the device-plugin API in
``vgpud/plugin/_pb`` (the device-plugin adapter's alone), PodResources in
``vgpud/node/_pb`` (the node runtime's, for any adapter), and the DRA kubelet plugin's
APIs (``dra/v1``, ``dra/v1beta1``, ``pluginregistration/v1``) in ``vgpud/dra/_pb`` (the DRA
adapter's alone).

    python protos/generate.py           # rewrite them all
    python protos/generate.py --check   # exit 1 if the committed code differs

Generation runs protoc (from grpcio-tools) with the betterproto2 compiler plugin into a
temporary directory, then compares or copies it. The plugin executable
``protoc-gen-python_betterproto2`` lives next to the Python interpreter, which protoc
only finds through ``PATH``, so that directory is put first on it.

Also used by the tests' fake kubelet: :func:`generate_grpcio` writes plain grpcio
stubs (``*_pb2.py``, ``*_pb2_grpc.py``) for the same protos into a directory.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
FILES = ("deviceplugin/v1beta1/api.proto", "podresources/v1/api.proto")  # the fake kubelet's
DRA_FILES = ("dra/v1/api.proto", "dra/v1beta1/api.proto", "pluginregistration/v1/api.proto")
# where each proto's betterproto2 code goes (one protoc run, one message pool, per target)
TARGETS = {ROOT / "vgpud" / "plugin" / "_pb": ("deviceplugin/v1beta1/api.proto",),
           ROOT / "vgpud" / "node" / "_pb": ("podresources/v1/api.proto",),
           ROOT / "vgpud" / "dra" / "_pb": DRA_FILES}
INIT_DOC = '"""Generated kubelet gRPC bindings (betterproto2 + grpclib). Do not edit: run\n' \
           '``python protos/generate.py``."""\n'


def _protoc(args: list[str], files: tuple[str, ...] = FILES) -> None:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", *args,
           *(str(PROTOS / f) for f in files)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"protoc failed ({done.returncode}):\n{done.stderr}")


def generate_betterproto(out: Path, files: tuple[str, ...] = FILES) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _protoc([f"--python_betterproto2_out={out}",
             "--python_betterproto2_opt=client_generation=async,server_generation=async"],
            files)
    (out / "__init__.py").write_text(INIT_DOC)


def generate_grpcio(out: Path, files: tuple[str, ...] = FILES) -> None:
    """grpcio stubs for the tests' fake kubelet (a different gRPC implementation)."""
    out.mkdir(parents=True, exist_ok=True)
    _protoc([f"--python_out={out}", f"--grpc_python_out={out}"], files)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _drift(fresh: Path, committed: Path) -> list[str]:
    a, b = _files(fresh), _files(committed) if committed.exists() else set()
    problems = [f"missing: {f}" for f in sorted(a - b)]
    problems += [f"not generated (stale): {f}" for f in sorted(b - a)]
    for f in sorted(a & b):
        if not filecmp.cmp(fresh / f, committed / f, shallow=False):
            diff = difflib.unified_diff(
                (committed / f).read_text().splitlines(), (fresh / f).read_text().splitlines(),
                f"committed/{f}", f"generated/{f}", lineterm="", n=1)
            problems.append(f"differs: {f}\n" + "\n".join(list(diff)[:40]))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail when the committed code differs from a fresh generation")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (target, files) in enumerate(TARGETS.items()):
            fresh = Path(tmp) / str(i) / "_pb"
            generate_betterproto(fresh, files)
            where = target.relative_to(ROOT)
            if args.check:
                problems = _drift(fresh, target)
                if problems:
                    print(f"{where} is out of date; run python protos/generate.py",
                          file=sys.stderr)
                    print("\n".join(problems), file=sys.stderr)
                    return 1
                print(f"{where} is up to date")
                continue
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(fresh, target)
            print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
