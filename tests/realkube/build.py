"""Build (or find) the real Kubernetes components vgpud's tests run against.

    python tests/realkube/build.py [--cache DIR] [--force]

From the official Go modules at one pinned version, through the wrapper modules beside this
file (``go/kube``: k8s.io/kubernetes with every staging module replaced by its published
release, plus ``vgpud-fake-cri``; ``go/etcd``: etcd's server):

    etcd  kube-apiserver  kube-scheduler  kube-controller-manager  kubelet  vgpud-fake-cri

They are cached by version and by the wrapper modules' contents, outside the work tree
(``$VGPUD_REALKUBE_CACHE``, else ``$XDG_CACHE_HOME/vgpud/realkube``, else
``~/.cache/vgpud/realkube``), so a second run costs a few seconds. Progress goes to stderr
while it builds. **Contract: the last line of output is the absolute directory holding the
six executables.** Exit status 3 with the reason on stderr where they cannot be built here
(no Go, or one too old); 1 when a build fails.

Go is for test infrastructure only: nothing here is part of vgpud.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"
GO_MINIMUM = (1, 26)

HERE = Path(__file__).resolve().parent
KUBE_MODULE = HERE / "go" / "kube"
ETCD_MODULE = HERE / "go" / "etcd"

# (executable, module directory, package)
TARGETS: tuple[tuple[str, Path, str], ...] = (
    ("kube-apiserver", KUBE_MODULE, "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kube-scheduler", KUBE_MODULE, "k8s.io/kubernetes/cmd/kube-scheduler"),
    ("kube-controller-manager", KUBE_MODULE, "k8s.io/kubernetes/cmd/kube-controller-manager"),
    ("kubelet", KUBE_MODULE, "k8s.io/kubernetes/cmd/kubelet"),
    ("vgpud-fake-cri", KUBE_MODULE, "./cmd/vgpud-fake-cri"),
    ("etcd", ETCD_MODULE, "./cmd/etcd"),
)
EXECUTABLES = tuple(name for name, _, _ in TARGETS)


class Unavailable(RuntimeError):
    """The components cannot be built on this machine (``str()`` says why)."""


def _say(message: str) -> None:
    print(f"[realkube] {message}", file=sys.stderr, flush=True)


def default_cache() -> Path:
    if env := os.environ.get("VGPUD_REALKUBE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vgpud" / "realkube"


def _sources_digest() -> str:
    """What decides the executables: the pinned versions and every file of the wrappers."""
    h = hashlib.sha256(f"{KUBERNETES_VERSION} {ETCD_VERSION}".encode())
    for module in (KUBE_MODULE, ETCD_MODULE):
        for path in sorted(module.rglob("*")):
            if path.is_file():
                h.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise Unavailable("no Go toolchain on PATH (the real Kubernetes components are built "
                          f"from their Go modules; Go {'.'.join(map(str, GO_MINIMUM))}+ "
                          "is needed)")
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                         check=False, env=_go_env()).stdout.strip()
    m = re.match(r"go(\d+)\.(\d+)", out)
    if m is None or (int(m[1]), int(m[2])) < GO_MINIMUM:
        raise Unavailable(f"Go {out or '(unknown version)'} is older than "
                          f"{'.'.join(map(str, GO_MINIMUM))}, which k8s.io/kubernetes "
                          f"{KUBERNETES_VERSION} needs")
    return go


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")  # never download a toolchain behind our back
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -mod=readonly").strip()  # the committed go.sum
    env["CGO_ENABLED"] = "0"
    return env


def _ldflags(name: str) -> str:
    if name == "etcd":
        return "-s -w"
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    version = {
        "gitVersion": KUBERNETES_VERSION, "gitMajor": major, "gitMinor": minor,
        "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in version.items()]
    return " ".join(flags)


def _build_one(go: str, name: str, module: Path, package: str, out_dir: Path) -> None:
    """``go build`` one executable, printing a progress line every few packages."""
    started = time.monotonic()
    cmd = [go, "build", "-v", "-trimpath", "-ldflags", _ldflags(name),
           "-o", str(out_dir / name), package]
    proc = subprocess.Popen(cmd, cwd=module, env=_go_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: list[str] = []
    last = started
    for compiled, line in enumerate(proc.stdout, 1):
        tail = [*tail[-40:], line.rstrip()]
        now = time.monotonic()
        if now - last >= 30:
            _say(f"  {name}: {compiled} packages compiled, {now - started:.0f} s")
            last = now
    if proc.wait() != 0:
        raise RuntimeError(f"go build {package} failed (in {module}):\n" + "\n".join(tail))
    _say(f"  {name}: built in {time.monotonic() - started:.0f} s")


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One build at a time per cache (parallel test sessions, CI)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def complete(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in EXECUTABLES)


_failed: dict[Path, Exception] = {}  # per cache, in this process: a failure is not retried


def ensure(cache: Path | None = None, *, force: bool = False) -> Path:
    """The directory holding the six executables, building them when missing.

    Raises :class:`Unavailable` where they cannot be built here, ``RuntimeError`` when a
    build fails (once per process: asking again raises the same error)."""
    cache = cache or default_cache()
    if cache in _failed and not force:
        raise _failed[cache]
    try:
        return _ensure(cache, force=force)
    except (Unavailable, RuntimeError) as e:
        _failed[cache] = e
        raise


def _ensure(cache: Path, *, force: bool) -> Path:
    target = cache / f"kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}-{_sources_digest()}"
    if complete(target) and not force:
        return target
    go = _go()
    with _locked(cache):
        if complete(target) and not force:  # another process built it while we waited
            return target
        started = time.monotonic()
        _say(f"building Kubernetes {KUBERNETES_VERSION} and etcd {ETCD_VERSION} from the Go "
             f"modules into {target} (cold: tens of minutes on 2 cores; cached afterwards)")
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=cache))
        try:
            for name, module, package in TARGETS:
                _build_one(go, name, module, package, staging)
            if target.exists():
                shutil.rmtree(target)
            staging.chmod(0o755)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _say(f"built all six in {time.monotonic() - started:.0f} s")
        for stale in cache.glob("kubernetes-*"):  # earlier versions or wrapper contents
            if stale != target and complete(stale):
                shutil.rmtree(stale, ignore_errors=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None,
                        help="cache directory (default: $VGPUD_REALKUBE_CACHE or "
                             "~/.cache/vgpud/realkube)")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        directory = ensure(args.cache, force=args.force)
    except Unavailable as e:
        _say(f"cannot build the real Kubernetes components here: {e}")
        return 3
    except RuntimeError as e:
        _say(str(e))
        return 1
    _say(f"ready in {time.monotonic() - started:.1f} s")
    print(directory.resolve(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
