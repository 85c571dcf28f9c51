"""Which kubelet resources a node's plugin serves, and what one device ID of each means.
Pure: no I/O, no async.

:func:`served` turns the settings (``resourcePreset`` and ``compatPresets``, under the
names ``resourceNames`` gives them: ``Settings.presets()``) into one
:class:`ServedResource` per distinct resource name: the preset's *number* name
(``nvidia.com/vgpu-number``, HAMi's ``nvidia.com/gpu``, Volcano's
``volcano.sh/vgpu-number``, TKE's ``tencent.com/vcuda-core``, or the name the settings
give it, like ``inspur.com/vcuda-core``). Each is registered with
kubelet on its own socket. The presets' memory, cores and percentage names are *not*
registered: they are scheduler-managed extended resources (kube-scheduler is told
``ignoredByScheduler``), and kubelet's admission drops the extended resources no node
advertises before it checks what fits (``removeMissingExtendedResources`` in
kubernetes ``pkg/kubelet/lifecycle/predicate.go``), while its device manager allocates
only the resources a plugin registered. So such a name costs nothing on the node.

The unit of an ID (:attr:`ServedResource.per_gpu`, :mod:`vgpud.node.ids`):

- ``1`` — one ID is one vGPU. A container's IDs lie on distinct GPUs, and its share of
  each is what the assignment grants there (memory, cores). Each GPU is advertised
  ``split`` times (``deviceSplitCount``).
- ``100`` — TKE's ``tencent.com/vcuda-core``: one ID is 1 % of one GPU, so a container
  holding N IDs of one GPU has N % of it (``vcuda-core: 30`` is 30 IDs of one GPU,
  ``200`` is 100 IDs of each of two GPUs). Each GPU is advertised
  ``max(100, 100 × deviceCoreScaling)`` times: as many IDs as the scheduler lets
  cores be granted on it, so kubelet never runs out of a GPU's IDs before the
  scheduler runs out of its cores (and kube-scheduler's own count of
  ``tencent.com/vcuda-core`` agrees with the oversubscribed capacity); never fewer
  than 100, so a whole-GPU request always finds its IDs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vgpud.core.model import DeviceGrant, Preset
from vgpud.core.requests import PRESETS
from vgpud.node.allocations import DEFAULT_RESOURCE
from vgpud.node.ids import PERCENT_IDS, VGPU_IDS, ids_for

DEFAULT_SOCKET = "vgpud-vgpu-number.sock"  # the name before several resources: kept on upgrade


@dataclass(frozen=True, slots=True)
class ServedResource:
    """One resource this node's plugin registers with kubelet."""

    name: str  # the kubelet resource name
    socket: str  # the socket's file name in kubelet's device-plugin directory
    replicas: int  # IDs advertised per GPU
    per_gpu: int = VGPU_IDS  # IDs that make up one GPU's whole share (see the module doc)
    profile: str = ""  # a MIG profile resource: one ID per instance of this profile

    @property
    def percent(self) -> bool:
        """An ID is a percentage of one GPU, not a vGPU."""
        return self.per_gpu > VGPU_IDS

    def ids_for(self, grant: DeviceGrant) -> int:
        """How many IDs of this resource a container holds on ``grant``'s GPU."""
        return ids_for(self.per_gpu, grant)


def socket_for(resource: str) -> str:
    """The socket's file name: ``vgpud-<resource, '/' as '-'>.sock``; the default
    resource keeps the name it had when it was the only one."""
    if resource == DEFAULT_RESOURCE:
        return DEFAULT_SOCKET
    return f"vgpud-{resource.replace('/', '-')}.sock"


def _preset(p: str | Preset) -> Preset:
    return PRESETS[p] if isinstance(p, str) else p


def mig_resources(preset: str | Preset, compat: Iterable[str | Preset],
                  profiles: Iterable[str]) -> tuple[ServedResource, ...]:
    """One resource per MIG profile the node offers whole (``migStrategy: mixed``) and
    per preset that names MIG resources: ``nvidia.com/mig-1g.10gb``, one ID per
    instance. A preset is given by its built-in name or as a (renamed) :class:`Preset`."""
    out: dict[str, ServedResource] = {}
    for p in (preset, *compat):
        prefix = _preset(p).mig
        if prefix is None:
            continue
        for prof in sorted(set(profiles)):
            res = f"{prefix}{prof}"
            out.setdefault(res, ServedResource(res, socket_for(res), 1, VGPU_IDS, profile=prof))
    return tuple(out.values())


def served(preset: str | Preset, compat: Iterable[str | Preset] = (), *, split: int,
           core_scaling: float = 1.0, profiles: Iterable[str] = (),
           ) -> tuple[ServedResource, ...]:
    """The resources to register: ``preset``'s first, then each of ``compat``, one per
    distinct resource name, then the MIG profile resources of ``profiles``
    (:func:`mig_resources`). ``split`` and ``core_scaling`` are this node's settings; a
    preset is given by its built-in name or as a (renamed) :class:`Preset`."""
    out: dict[str, ServedResource] = {}
    compat = tuple(compat)
    for p in map(_preset, (preset, *compat)):
        number = p.number
        if number in out:
            continue
        if p.tke:
            out[number] = ServedResource(number, socket_for(number),
                                         max(PERCENT_IDS, round(PERCENT_IDS * core_scaling)),
                                         PERCENT_IDS)
        else:
            out[number] = ServedResource(number, socket_for(number), split, VGPU_IDS)
    return (*out.values(), *mig_resources(preset, compat, profiles))
