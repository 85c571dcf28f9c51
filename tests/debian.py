"""Installing the real parts the tests use from Debian packages (runc, prometheus,
chromium + chromium-driver) when they are missing: ``apt-get install`` as root, and
``apt-get update`` then again if that fails. The callers prove the part works and turn
:class:`NotInstallable` into their own "unavailable" error, which their fixtures turn
into a skip with the reason (or a failure where CI requires the part)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import NoReturn

import pytest


def unavailable(what: str, required: str, why: Exception) -> NoReturn:
    """A fixture's part cannot be had: skip with the reason, or fail with it when the
    environment variable ``required`` is set (CI, where a skip would hide a broken
    setup)."""
    if os.environ.get(required, "") not in ("", "0"):
        pytest.fail(f"{required} is set but {what} is unusable: {why}")
    pytest.skip(f"no usable {what}: {why}")


class NotInstallable(RuntimeError):
    """apt-get could not provide the packages; ``str()`` says why, with its output."""


def apt_install(packages: Sequence[str], installed: Callable[[], bool], *,
                timeout: float = 900) -> None:
    """Install ``packages`` until ``installed()`` holds, or raise :class:`NotInstallable`."""
    names = " ".join(packages)
    apt = shutil.which("apt-get")
    if apt is None:
        raise NotInstallable(f"{names} not installed, and there is no apt-get to install it")
    if os.geteuid() != 0:
        raise NotInstallable(f"{names} not installed, and we are not root, so apt-get cannot "
                             f"install it (apt-get install {names})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-q", "--no-install-recommends", *packages]
    log = ""
    for step in ([install], [[apt, "update", "-q"], install]):
        for cmd in step:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                   timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                log += f"$ {' '.join(cmd)} -> timed out after {timeout:.0f} s\n"
                break
            log += f"$ {' '.join(cmd)} -> {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
            if r.returncode != 0:
                break
        else:
            if installed():
                return
    raise NotInstallable(f"apt-get could not install {names}:\n{log}")
