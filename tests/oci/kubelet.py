"""What kubelet and containerd make of a device plugin's ``ContainerAllocateResponse``.

This is the pure half of the harness (no runc): it turns the plugin's responses into
the options a container is started with, following the code paths below. What was
relied on, and where it was read:

- **Merging responses** (kubelet ``pkg/kubelet/cm/devicemanager/pod_devices.go``,
  ``deviceRunContainerOptions``): kubelet walks every cached response of the
  container (one per resource) and keeps the *first* value of each env name, each
  mount's ``container_path``, each device's ``container_path`` and each annotation key;
  a later clash is skipped (and logged). CDI device names are de-duplicated.
  Mounts keep ``read_only``; ``SELinuxRelabel`` is false.
- **Env order** (kubelet ``pkg/kubelet/kubelet_pods.go``, ``GenerateRunContainerOptions``):
  ``opts`` comes from ``containerManager.GetResources`` (the device plugin's options)
  and the pod's own env is appended after it (``opts.Envs = append(opts.Envs, envs...)``).
  containerd (CRI ``container_create_linux.go``) sets ``HOSTNAME``, then the image's env,
  then the CRI env in that order, each through ``oci.WithEnv`` whose
  ``replaceOrAppendEnvValues`` replaces an existing name in place and appends a new one:
  a later value wins. So image < device plugin < pod.
- **Mounts** (containerd CRI ``pkg/cri/opts/spec_linux.go``, ``WithMounts``): each CRI
  mount becomes a ``bind`` mount with options ``rbind``, the propagation (kubelet sends
  ``PROPAGATION_PRIVATE`` for device plugin mounts → ``rprivate``) and ``ro``/``rw``; the
  host path's symlinks are resolved; CRI mounts are applied after the runtime's default
  mounts, sorted (stably) by the number of path components of the destination, and a
  default mount with the same destination as a CRI mount is dropped. containerd
  *creates a missing host path as a directory*; the harness refuses instead (a missing
  file such as the shim library would otherwise silently become an empty directory).
- **Devices** (same file, ``WithDevices``): the host path's symlinks are resolved, it
  must be a device node (``devices.DeviceFromPath``), and it becomes a ``linux.devices``
  entry at the container path (same type/major/minor/mode/owner) plus a
  ``linux.resources.devices`` allow rule with the plugin's permissions, after the
  default deny-all rule. A host path that does not exist, or is not a device node, is an
  error (as in containerd).
- **CDI devices** are passed by kubelet as CRI ``CDIDevices`` and resolved by the runtime
  from CDI spec files. We have none: the names are recorded on the container and not
  applied. **Annotations** go to the CRI container config; the harness copies them into
  the OCI spec's annotations (runc ignores them).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vgpud.plugin._pb import v1beta1 as pb


class HarnessError(RuntimeError):
    """The harness cannot build or run the container it was asked for."""


@dataclass(frozen=True)
class Bind:
    """A bind mount of ``host`` at ``container``."""

    host: Path
    container: str
    read_only: bool = True

    @classmethod
    def same(cls, path: str | os.PathLike[str], *, read_only: bool = False) -> Bind:
        """``path`` on the host at the same path in the container (read-write by default)."""
        p = Path(path).absolute()
        return cls(p, str(p), read_only)


@dataclass(frozen=True)
class DeviceSpec:
    """A device node the plugin asked for (``host`` must be a device node)."""

    host: Path
    container: str
    permissions: str = "rw"


@dataclass(frozen=True)
class DeviceRunOptions:
    """kubelet's ``DeviceRunContainerOptions``: the merged plugin responses of a container."""

    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Bind, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    cdi_devices: tuple[str, ...] = ()

    @classmethod
    def from_responses(cls, *responses: pb.ContainerAllocateResponse) -> DeviceRunOptions:
        """Merge responses the way kubelet does (first wins on a clash)."""
        envs: dict[str, str] = {}
        mounts: dict[str, Bind] = {}
        devices: dict[str, DeviceSpec] = {}
        annotations: dict[str, str] = {}
        cdi: dict[str, None] = {}
        for r in responses:
            for k, v in r.envs.items():
                envs.setdefault(k, v)
            for m in r.mounts:
                _absolute("mount", m.container_path, m.host_path)
                mounts.setdefault(m.container_path,
                                  Bind(Path(m.host_path), m.container_path, bool(m.read_only)))
            for d in r.devices:
                _absolute("device", d.container_path, d.host_path)
                devices.setdefault(d.container_path,
                                   DeviceSpec(Path(d.host_path), d.container_path, d.permissions))
            for k, v in r.annotations.items():
                annotations.setdefault(k, v)
            for c in r.cdi_devices:
                cdi.setdefault(c.name, None)
        return cls(tuple(envs.items()), tuple(mounts.values()), tuple(devices.values()),
                   tuple(annotations.items()), tuple(cdi))


def _absolute(kind: str, container_path: str, host_path: str) -> None:
    if not container_path.startswith("/") or not host_path.startswith("/"):
        raise HarnessError(f"{kind} {container_path!r} -> {host_path!r}: the device plugin "
                           f"must give absolute paths")


def layered_env(*layers: Iterable[tuple[str, str]] | Mapping[str, str]) -> dict[str, str]:
    """containerd's ``replaceOrAppendEnvValues`` over the layers in order: a later value
    replaces an earlier one in place, a new name is appended."""
    out: dict[str, str] = {}
    for layer in layers:
        items = layer.items() if isinstance(layer, Mapping) else layer
        for k, v in items:
            if not k or "=" in k:
                raise HarnessError(f"invalid environment variable name {k!r}")
            out[k] = v
    return out


def ordered_mounts(mounts: Iterable[Bind]) -> list[Bind]:
    """containerd's ``orderedMounts``: stable sort by the destination's depth."""
    return sorted(mounts, key=lambda m: os.path.normpath(m.container).count("/"))


@dataclass(frozen=True)
class DeviceNode:
    """A resolved device: what goes into ``linux.devices`` and the device cgroup."""

    container: str
    host: Path
    kind: str  # "c" or "b"
    major: int
    minor: int
    mode: int
    uid: int
    gid: int
    permissions: str = "rw"


def resolve_device(d: DeviceSpec) -> DeviceNode:
    """containerd's ``WithDevices`` for one device; a clear error when it cannot be had."""
    if not d.permissions or set(d.permissions) - set("rwm"):
        raise HarnessError(f"device {d.container}: permissions {d.permissions!r} must be "
                           f"one or more of r, w, m")
    host = Path(os.path.realpath(d.host))
    try:
        st = host.stat()
    except FileNotFoundError:
        raise HarnessError(f"device {d.container}: host path {d.host} does not exist "
                           f"(the fake GPU has no /dev nodes; pass an existing device such "
                           f"as /dev/null as a stand-in)") from None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        raise HarnessError(f"device {d.container}: host path {d.host} is not a device node")
    return DeviceNode(d.container, host, kind, os.major(st.st_rdev), os.minor(st.st_rdev),
                      stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, d.permissions)
