"""The Containerfile (it cannot be built here: no container engine) against the repo:
what it copies exists, the shim lands where the plugin looks, the user matches the chart."""

from __future__ import annotations

import re
import shlex
import tomllib

from tests.deploy.rendered import ROOT, Manifests
from vgpud.node.shim import _VERSIONED, IMAGE_LIB_DIR

TEXT = (ROOT / "Containerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", TEXT)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def test_every_path_copied_from_the_build_context_exists() -> None:
    copies = [shlex.split(a) for i, a in instructions() if i in ("COPY", "ADD")]
    local = [c for c in copies if not any(x.startswith("--from=") for x in c)]
    assert local, "expected COPY instructions from the build context"
    for args in local:
        *sources, _dest = [a for a in args if not a.startswith("--")]
        for src in sources:
            path = ROOT / src
            assert path.exists(), f"Containerfile copies {src}, which is not in the repository"
            if src.endswith("/"):
                assert path.is_dir(), src


def test_wheel_stage_copies_what_the_build_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = next(s for s in stages() if "AS wheel" in s[0][1])
    copied = {x.rstrip("/") for i, a in wheel if i == "COPY" for x in shlex.split(a)[:-1]}
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= set(project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])
    needed |= set(project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"])
    assert needed <= copied


def test_shim_is_built_with_make_and_installed_where_the_plugin_finds_it() -> None:
    shim = next(s for s in stages() if "AS shim" in s[0][1])
    assert any(i == "RUN" and "make -C csrc" in a for i, a in shim)
    final = stages()[-1]
    (copy,) = [shlex.split(a) for i, a in final if i == "COPY" and "--from=shim" in a]
    src, dest = copy[-2], copy[-1]
    assert dest.rstrip("/") == str(IMAGE_LIB_DIR)
    version = re.search(r"^VERSION\s*:=\s*(\S+)", (ROOT / "csrc" / "Makefile").read_text(), re.M)
    assert version, "csrc/Makefile defines VERSION"
    built = f"libvgpu.so.{version.group(1)}"
    assert _VERSIONED.match(built)
    assert re.fullmatch(src.split("/")[-1].replace(".", r"\.").replace("*", ".*"), built)


def test_image_user_is_the_deployments_and_entrypoint_is_the_cli() -> None:
    final = stages()[-1]
    (user,) = [a for i, a in final if i == "USER"]
    uid = int(user.split(":")[0])
    assert uid != 0
    for name in ("vgpud-scheduler", "vgpud-webhook"):
        spec = Manifests.committed().pod_spec("Deployment", name)
        assert spec["securityContext"]["runAsUser"] == uid, name
    (entry,) = [a for i, a in final if i == "ENTRYPOINT"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert entry == '["vgpud"]' and "vgpud" in project["project"]["scripts"]


def test_final_image_is_python_311_slim() -> None:
    (arg,) = [a for i, a in instructions() if i == "ARG" and a.startswith("PYTHON_IMAGE=")]
    assert re.search(r"python:3\.11-slim", arg)
    assert stages()[-1][0] == ("FROM", "${PYTHON_IMAGE}")
