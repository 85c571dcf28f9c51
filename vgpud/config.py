"""The daemon settings: one frozen model, loaded from a YAML/JSON file, the
environment and command-line flags (in that order of precedence, last wins), and
validated once. Errors name the key and say what was wrong.

Keys are camelCase as in HAMi's chart (``deviceSplitCount``, ``defaultMem`` …).
Environment overrides use ``VGPUD_`` plus the key in upper snake case
(``VGPUD_DEVICE_SPLIT_COUNT=4``) and apply to top-level scalar keys only.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from vgpud.core.model import ComputePolicy, Defaults, Policy, Preset
from vgpud.core.requests import PRESETS, PresetError, check_presets, renamed
from vgpud.core.translate import Mode
from vgpud.files import read_bounded

MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """The settings are invalid; ``str()`` is a message for a person."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


# How a node's MIG instances are offered (NVIDIA's names and meaning): "none" ignores
# them (a GPU in MIG mode is advertised unhealthy), "single" shares each instance like a
# GPU (vGPU slices inside it), "mixed" offers each instance whole under its profile's
# resource (nvidia.com/mig-1g.10gb).
MigStrategy = Literal["none", "single", "mixed"]


class NodeConfig(_Model):
    """Per-node overrides (matched by node name)."""

    name: str = Field(min_length=1)
    deviceSplitCount: int | None = Field(default=None, ge=1, le=1024)
    deviceMemoryScaling: float | None = Field(default=None, gt=0, le=100)
    deviceCoreScaling: float | None = Field(default=None, gt=0, le=100)
    migStrategy: MigStrategy | None = None


class FeatureGates(_Model):
    CorePlugin: bool = False
    MemoryPlugin: bool = False
    # GPUTopology: the node's NVLink pairs are published with its GPUs (off: none are, and
    # a pod's link topology mode finds no links on this node)
    GPUTopology: bool = True


class PluginSettings(_Model):
    visibleDevices: Literal["env", "cdi", "device-specs"] = "env"
    migStrategy: MigStrategy = "none"
    # GPUs that come and go: the devices are discovered again this often, and at once
    # after an event that says a GPU fell off the bus; a GPU that is gone stays
    # advertised unhealthy this long before it is dropped
    rediscoverSeconds: float = Field(default=60.0, gt=0, le=86400)
    goneLingerSeconds: float = Field(default=5.0, ge=0, le=3600)
    featureGates: FeatureGates = FeatureGates()
    shimHostDir: str = "/usr/local/vgpud"
    metricsListen: str = "0.0.0.0:9394"
    # the watchdog (vgpud/node/watchdog.py): a container over its memory limit (by NVML,
    # beyond the tolerance) for longer than the grace period is reported and killed (a
    # hard limit; `warn` only reports)
    overLimitAction: Literal["warn", "kill"] = "kill"
    overLimitGraceSeconds: float = Field(default=10.0, ge=0, le=3600)
    overLimitToleranceMiB: int = Field(default=32, ge=0, le=1 << 20)
    watchdogIntervalSeconds: float = Field(default=2.0, gt=0, le=600)
    # priority across the containers of one GPU (vgpud/core/arbitration.py): while a
    # higher nvidia.com/vgpu-priority is active on a GPU, lower ones are held to this
    # share of its SMs (0 would starve them: their heartbeats and timeouts would fail)
    priorityFloorPercent: int = Field(default=5, ge=1, le=100)
    # a container counts as active this long after NVML last saw it use the SMs
    priorityHoldSeconds: float = Field(default=1.0, ge=0, le=600)
    arbitrationPeriodSeconds: float = Field(default=0.2, ge=0.05, le=10)


class SchedulerGates(_Model):
    # Reschedule: a controller in `vgpud scheduler` gets the pods kubelet refused at
    # admission (vgpud/scheduling/reschedule.py) placed again.
    Reschedule: bool = True
    # SerialBindNode: binds to the same node one at a time (VGPU-Manager's gate of that
    # name); off, binds to one node run concurrently.
    SerialBindNode: bool = False
    # GPUTopology: a pod's nvidia.com/device-topology-mode link (or link-strict) places
    # its GPUs by NVLink; off, the link modes are ignored (NUMA modes still hold)
    GPUTopology: bool = True


class SchedulerSettings(_Model):
    featureGates: SchedulerGates = SchedulerGates()
    # Bare pods (no controller) are recreated under a new name only when this is on: see
    # vgpud/scheduling/reschedule.py and docs/install.md for why it is off by default.
    rescheduleBarePods: bool = False
    # A pod's lineage is rescheduled at most this many times, then left with an event.
    rescheduleMaxAttempts: int = Field(default=3, ge=1, le=100)
    rescheduleQPS: float = Field(default=1.0, gt=0, le=100)  # deletions/recreations per s


class DraSettings(_Model):
    """The webhook's side of DRA (vgpud/core/translate.py): which vGPU pods it rewrites
    into ResourceClaims for kube-scheduler, and the chart's DeviceClass names; and whether
    the scheduler watches vgpud's ResourceSlices and ResourceClaims to show the DRA nodes
    on its status page (the chart's ``dra.enabled``, which grants it that)."""

    enabled: bool = False
    # off | selected (pods whose nodeSelector names vgpud.io/node-mode: dra) | always
    translate: Mode = "off"
    vgpuClass: str = Field(default="vgpu.vgpud.io", min_length=1)
    gpuClass: str = Field(default="gpu.vgpud.io", min_length=1)


class OpsSettings(_Model):
    """The ops ports (vgpud/ops.py): the scheduler's status page, its JSON API and /metrics,
    the plugin's and the webhook's /metrics. /healthz and /readyz are always open (kubelet's
    probes carry no token) and never limited."""

    # a file holding the bearer token those endpoints then ask for ("Authorization: Bearer
    # <token>"); empty: no token is asked. Read at start and again when the file changes.
    tokenFile: str = ""
    # requests from the pod's own loopback need no token: `kubectl port-forward` arrives
    # there, authorised by the API server (pods/portforward). Turn off under a service mesh
    # whose sidecar forwards every connection from loopback.
    trustLoopback: bool = True
    # per client address: requests per second, and how many may come at once; past that
    # the answer is 429 with Retry-After
    clientQPS: float = Field(default=20.0, gt=0, le=10000)
    clientBurst: int = Field(default=100, ge=1, le=100000)
    # status pages, API pages and scrapes rendered at once (each yields to filter and bind
    # between chunks; more at once would each add their chunk to a verb's wait); four times
    # as many wait their turn (5 s at most), 429 beyond
    maxConcurrentRenders: int = Field(default=2, ge=1, le=64)


class ResourceNames(_Model):
    """One preset's resource names, renamed as its own system allows: HAMi's chart keys
    (``resourceName`` the vGPU count, ``resourceMem``, ``resourceMemPercentage``,
    ``resourceCores``, ``resourcePriority``), and ``domain``, which moves every name of
    the preset to another domain (Volcano's and VGPU-Manager's ``<domain>/vgpu-*``; TKE's
    vendor domain, ``inspur.com`` for ``inspur.com/vcuda-core``). ``domain`` applies
    first, single names over it; "" drops ``resourceMemPercentage`` or
    ``resourcePriority``. TKE has two names: ``resourceName`` (vcuda-core) and
    ``resourceMem`` (vcuda-memory)."""

    domain: str | None = None
    resourceName: str | None = None
    resourceMem: str | None = None
    resourceMemPercentage: str | None = None
    resourceCores: str | None = None
    resourcePriority: str | None = None

    def preset(self, base: Preset) -> Preset:
        """``base`` under these names (:class:`PresetError` when Kubernetes or the
        preset refuses one)."""
        names = {f: getattr(self, key) for f, key in _KEYS.items()}
        return renamed(base, domain=self.domain, labels=_KEYS,
                       names={f: n for f, n in names.items() if n is not None})


# the preset's fields (vgpud.core.requests.RENAMEABLE) by the settings' keys (HAMi's)
_KEYS = {"number": "resourceName", "memory": "resourceMem", "cores": "resourceCores",
         "memory_percent": "resourceMemPercentage", "priority": "resourcePriority"}


class Settings(_Model):
    deviceSplitCount: int = Field(default=10, ge=1, le=1024)
    deviceMemoryScaling: float = Field(default=1.0, gt=0, le=100)
    deviceCoreScaling: float = Field(default=1.0, gt=0, le=100)
    defaultMem: int = Field(default=0, ge=0, le=1 << 24)
    defaultCores: int = Field(default=0, ge=0, le=100)
    defaultGPUNum: int = Field(default=1, ge=1, le=64)
    resourcePreset: str = "vgpu-manager"
    compatPresets: tuple[str, ...] = ()
    # the enabled presets' names changed, by preset (ResourceNames): webhook, scheduler
    # and plugin all read pods under these names, the plugin registers the number name
    resourceNames: dict[str, ResourceNames] = Field(default_factory=dict)
    nodeSchedulerPolicy: Policy = Policy.BINPACK
    deviceSchedulerPolicy: Policy = Policy.BINPACK
    computePolicy: ComputePolicy = ComputePolicy.FIXED
    schedulerName: str = Field(default="vgpu-scheduler", min_length=1)
    # a container that could lift its own limits (privileged: it sees every GPU of its
    # node; CAP_SYS_ADMIN or seccomp Unconfined: it can mount over /etc/ld.so.preload) is
    # refused a vGPU by the webhook and again by the scheduler, unless this is on
    allowPrivilegedGPUPods: bool = False
    assumeTTLSeconds: float = Field(default=120.0, gt=0, le=86400)
    kubeQPS: float = Field(default=1000.0, gt=0)
    kubeBurst: int = Field(default=2000, ge=1)
    logLevel: Literal["debug", "info", "warning", "error"] = "info"
    logFormat: Literal["console", "json"] = "console"
    nodeConfigs: tuple[NodeConfig, ...] = ()
    plugin: PluginSettings = PluginSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    dra: DraSettings = DraSettings()
    ops: OpsSettings = OpsSettings()

    @field_validator("resourcePreset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        if v not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; choose one of {', '.join(sorted(PRESETS))}")
        return v

    @field_validator("compatPresets")
    @classmethod
    def _known_presets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            cls._known_preset(name)
        return v

    @field_validator("resourceNames")
    @classmethod
    def _renamed(cls, v: dict[str, ResourceNames],
                 info: ValidationInfo) -> dict[str, ResourceNames]:
        preset = info.data.get("resourcePreset")
        compat = info.data.get("compatPresets")
        if preset is None or compat is None:
            return v  # those failed: they say why
        enabled = list(dict.fromkeys((preset, *compat)))
        for name in v:
            if name not in PRESETS:
                raise ValueError(f"unknown preset {name!r}; choose one of "
                                 f"{', '.join(sorted(PRESETS))}")
            if name not in enabled:
                raise ValueError(f"{name}: the preset is not enabled (resourcePreset or "
                                 "compatPresets): its names would not be read")
        try:
            check_presets(_table(v, enabled))
        except PresetError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("deviceMemoryScaling", "deviceCoreScaling")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("nodeConfigs")
    @classmethod
    def _unique_nodes(cls, v: tuple[NodeConfig, ...]) -> tuple[NodeConfig, ...]:
        names = [n.name for n in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"node {sorted(dup)[0]!r} is configured twice")
        return v

    def defaults(self) -> Defaults:
        """The core's view of these settings."""
        return Defaults(
            split=self.deviceSplitCount,
            memory_scaling=self.deviceMemoryScaling,
            core_scaling=self.deviceCoreScaling,
            default_mem=self.defaultMem,
            default_cores=self.defaultCores,
            default_gpu_num=self.defaultGPUNum,
            node_policy=self.nodeSchedulerPolicy,
            device_policy=self.deviceSchedulerPolicy,
            compute_policy=self.computePolicy,
            preset=self.resourcePreset,
            compat_presets=self.compatPresets,
            presets=tuple(r.preset(PRESETS[n]) for n, r in self.resourceNames.items()),
            assume_ttl=self.assumeTTLSeconds,
        )

    def preset_named(self, name: str) -> Preset:
        """The built-in preset ``name`` under the names ``resourceNames`` gives it."""
        return _table(self.resourceNames, (name,))[0]

    def presets(self) -> tuple[Preset, ...]:
        """The enabled presets (resourcePreset first, then compatPresets, each once),
        under the names ``resourceNames`` gives them."""
        return _table(self.resourceNames, dict.fromkeys((self.resourcePreset,
                                                          *self.compatPresets)))

    def for_node(self, name: str) -> tuple[int, float, float]:
        """(split count, memory scaling, core scaling) for one node, overrides applied."""
        split, mem, core = self.deviceSplitCount, self.deviceMemoryScaling, self.deviceCoreScaling
        for n in self.nodeConfigs:
            if n.name == name:
                split = n.deviceSplitCount or split
                mem = n.deviceMemoryScaling or mem
                core = n.deviceCoreScaling or core
        return split, mem, core

    def mig_strategy_for(self, name: str) -> MigStrategy:
        """``plugin.migStrategy``, or the node's override."""
        for n in self.nodeConfigs:
            if n.name == name and n.migStrategy is not None:
                return n.migStrategy
        return self.plugin.migStrategy


def _table(names: Mapping[str, ResourceNames], enabled: Iterable[str]) -> tuple[Preset, ...]:
    return tuple(names[n].preset(PRESETS[n]) if n in names else PRESETS[n] for n in enabled)


def _snake_upper(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", key).upper()


ENV_KEYS = {f"VGPUD_{_snake_upper(k)}": k for k, f in Settings.model_fields.items()
            if k not in ("nodeConfigs", "plugin", "scheduler", "ops", "compatPresets",
                         "resourceNames")}


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML or JSON settings file into a mapping (not yet validated)."""
    p = Path(path)
    data = read_bounded(p, f"config file {p}", limit=MAX_CONFIG_BYTES, error=ConfigError)
    try:
        doc = json.loads(data) if p.suffix == ".json" else yaml.safe_load(data)
    except (ValueError, yaml.YAMLError) as e:
        kind = "JSON" if p.suffix == ".json" else "YAML"
        raise ConfigError(f"config file {p} is not valid {kind}: {e}") from e
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {p}: expected a mapping of settings, "
                          f"got {type(doc).__name__}")
    return doc


def parse_settings(doc: Mapping[str, Any], *, source: str = "config") -> Settings:
    """Validate a mapping of settings; raise :class:`ConfigError` naming each bad key."""
    try:
        return Settings.model_validate(dict(doc))
    except ValidationError as e:
        raise ConfigError(_explain(e, source)) from None


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """File, then ``VGPUD_*`` environment, then flags; validated once."""
    doc: dict[str, Any] = read_config_file(path) if path is not None else {}
    source = str(path) if path is not None else "settings"
    for var, key in ENV_KEYS.items():
        if env is not None and var in env:
            doc[key] = env[var]
            source = f"{source} (with {var})"
    for key, value in (overrides or {}).items():
        if value is not None:
            doc[key] = value
    return parse_settings(doc, source=source)


def _explain(e: ValidationError, source: str) -> str:
    lines = [f"invalid {source}:"]
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling; keys are camelCase, e.g. deviceSplitCount)"
        got = err.get("input")
        shown = "" if err["type"] in ("extra_forbidden", "missing") else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


# -- --feature-gates ---------------------------------------------------------------------
# Each gate by the names users bring: VGPU-Manager's first names (seed 000), its newer ones,
# and where it lives in the settings ("plugin" or "scheduler" featureGates; a gate both
# commands read is in both).
GATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "CorePlugin": ("CorePlugin", ("plugin",)),
    "GPUCoreResourcePlugin": ("CorePlugin", ("plugin",)),
    "MemoryPlugin": ("MemoryPlugin", ("plugin",)),
    "GPUMemoryResourcePlugin": ("MemoryPlugin", ("plugin",)),
    "Reschedule": ("Reschedule", ("scheduler",)),
    "AllocationFailureReschedule": ("Reschedule", ("scheduler",)),
    "SerialBindNode": ("SerialBindNode", ("scheduler",)),
    "SerializedNodeBind": ("SerialBindNode", ("scheduler",)),
    "GPUTopology": ("GPUTopology", ("plugin", "scheduler")),
    "TopologyAwareGPUAllocation": ("GPUTopology", ("plugin", "scheduler")),
}


def with_feature_gates(settings: Settings, spec: str | None,
                       command: str) -> tuple[Settings, list[str]]:
    """``settings`` with the gates of a ``--feature-gates=A=true,B=false`` flag applied
    (over the settings file), and notes for the gates that act in the other command
    (``command`` is "plugin" or "scheduler"). Unknown names and values are a
    :class:`ConfigError` naming the known ones."""
    if not spec or not spec.strip():
        return settings, []
    updates: dict[str, dict[str, bool]] = {"plugin": {}, "scheduler": {}}
    notes = []
    for item in spec.split(","):
        name, sep, value = item.strip().partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or value not in ("true", "false"):
            raise ConfigError(f"--feature-gates: {item.strip()!r} is not NAME=true or "
                              f"NAME=false")
        if name not in GATES:
            raise ConfigError(f"--feature-gates: unknown gate {name!r} (known: "
                              f"{', '.join(sorted(GATES))})")
        field, where = GATES[name]
        for component in where:
            updates[component][field] = value == "true"
        if command not in where:
            notes.append(f"{name} acts in `vgpud {where[0]}`, not here: set it there")
    plugin = settings.plugin.model_copy(update={"featureGates": settings.plugin.featureGates
                                                .model_copy(update=updates["plugin"])})
    scheduler = settings.scheduler.model_copy(update={
        "featureGates": settings.scheduler.featureGates.model_copy(update=updates["scheduler"])})
    return settings.model_copy(update={"plugin": plugin, "scheduler": scheduler}), notes
