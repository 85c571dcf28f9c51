"""Scenario files for ``vgpud simulate``: parsed and validated at the edge.

A scenario (YAML or JSON; a YAML file may hold several documents, run one after
the other, each on a fresh cluster)::

    name: seed-003                      # optional
    config: {resourcePreset: hami}      # the daemon's config keys
    nodes:
      - name: gpu-node-1
        labels: {gpu: "on"}
        config: {deviceSplitCount: 4}   # per-node overrides (split, scaling)
        gpus:
          - {model: Tesla V100-PCIE-32GB, memory: 32768, count: 2, numa: 0,
             nvlink: true}              # nvlink: the GPUs of this entry are all linked
          - {model: NVIDIA A100-SXM4-80GB, memory: 81920,
             migInstances: [1g.10gb, 1g.10gb, 3g.40gb]}  # in MIG mode, with these
                                        # instances (or {profile: 1g.10gb, memory: 9728});
                                        # offered by the node's plugin.migStrategy
    priorityClasses: {urgent: 1000}     # optional: PriorityClass values by name
    workload:                           # in arrival order
      - replicas: 10
        at: 0                           # optional arrival time, seconds
        duration: 60                    # optional: the pods leave after this long
        pod: {apiVersion: v1, kind: Pod, metadata: {name: vgpu-test}, spec: {...}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vgpud.config import ConfigError, Settings, parse_settings
from vgpud.core.model import MIG_PROFILE, Gpu, Node, NodeInventory, offered
from vgpud.files import read_bounded

MAX_SCENARIO_BYTES = 16 << 20
MAX_PODS = 1_000_000


class ScenarioError(ValueError):
    """The scenario file is invalid; ``str()`` says where."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MigSpec(_Model):
    profile: str
    memory: int | None = Field(default=None, ge=1, le=1 << 24,
                               description="MiB; default: 95 % of the profile's GB")

    @model_validator(mode="after")
    def _name(self) -> MigSpec:
        if not MIG_PROFILE.match(self.profile):
            raise ValueError(f"{self.profile!r} is not a MIG profile name (like 1g.10gb)")
        return self

    @property
    def slices(self) -> int:
        """Compute slices of its GPU instance (the ``<g>g`` part)."""
        return int(self.profile.split("g.")[0].split(".")[-1])

    @property
    def mib(self) -> int:
        if self.memory is not None:
            return self.memory
        gb = int(self.profile.split("g.")[-1].split("gb")[0])
        return gb * 1024 * 95 // 100  # what an A100 80GB's 1g.10gb has: 9728 MiB


class GpuSpec(_Model):
    model: str = Field(min_length=1)
    memory: int = Field(ge=1, le=1 << 24, description="physical MiB")
    count: int = Field(default=1, ge=1, le=64)
    numa: int = Field(default=0, ge=-1, le=1024)
    uuid: str | None = None
    nvlink: bool = False
    healthy: bool = True
    mig: bool = False
    migInstances: tuple[MigSpec, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _profiles(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("migInstances"), list):
            data = {**data, "migInstances": [{"profile": m} if isinstance(m, str) else m
                                             for m in data["migInstances"]]}
        return data

    @model_validator(mode="after")
    def _uuid_single(self) -> GpuSpec:
        if self.uuid is not None and self.count != 1:
            raise ValueError("uuid can only be given for an entry with count 1")
        if sum(m.slices for m in self.migInstances) > 7:
            raise ValueError("MIG instances of more than the GPU's 7 compute slices")
        if sum(m.mib for m in self.migInstances) > self.memory:
            raise ValueError("MIG instances with more memory than the GPU has")
        return self


class NodeSpec(_Model):
    name: str = Field(min_length=1, max_length=253)
    labels: dict[str, str] = {}
    config: dict[str, Any] = {}
    gpus: tuple[GpuSpec, ...] = ()


class WorkItem(_Model):
    replicas: int = Field(default=1, ge=0, le=100_000)
    at: float = Field(default=0.0, ge=0)
    duration: float | None = Field(default=None, gt=0)
    pod: dict[str, Any]


class Scenario(_Model):
    name: str = "scenario"
    config: dict[str, Any] = {}
    nodes: tuple[NodeSpec, ...] = Field(min_length=1)
    workload: tuple[WorkItem, ...] = ()
    # PriorityClass name -> value, for pods that name one (spec.priorityClassName)
    priorityClasses: dict[str, int] = {}

    @model_validator(mode="after")
    def _unique(self) -> Scenario:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("two nodes share a name")
        if sum(w.replicas for w in self.workload) > MAX_PODS:
            raise ValueError(f"more than {MAX_PODS} pods")
        return self


def settings_of(s: Scenario) -> Settings:
    try:
        return parse_settings(s.config, source=f"scenario {s.name!r} config")
    except ConfigError as e:
        raise ScenarioError(str(e)) from None


def build_nodes(s: Scenario, settings: Settings) -> list[Node]:
    """Nodes with their inventories, as each node's plugin would report them."""
    nodes = []
    for spec in s.nodes:
        try:
            node_settings = parse_settings({**settings.model_dump(mode="json"), **spec.config},
                                           source=f"node {spec.name!r} config")
        except ConfigError as e:
            raise ScenarioError(str(e)) from None
        split, mem_scale, core_scale = node_settings.for_node(spec.name)
        strategy = node_settings.mig_strategy_for(spec.name)
        gpus: list[Gpu] = []
        index = 0
        for entry in spec.gpus:
            uuids = [entry.uuid or f"GPU-{spec.name}-{index + i}" for i in range(entry.count)]
            for i, uuid in enumerate(uuids):
                links = tuple(u for u in uuids if u != uuid) if entry.nvlink else ()
                mig = entry.mig or bool(entry.migInstances)
                gpus.append(Gpu(uuid=uuid, index=index + i, model=entry.model,
                                memory=entry.memory, split=split, numa=entry.numa, links=links,
                                healthy=entry.healthy, mig=mig))
                for k, m in enumerate(entry.migInstances):
                    g = offered(Gpu(uuid=f"MIG-{uuid}-{k}", index=index + i,
                                    model=f"{entry.model} MIG {m.profile}", memory=m.mib,
                                    split=split, numa=entry.numa, healthy=entry.healthy,
                                    profile=m.profile, parent=uuid), strategy)
                    if g is not None:
                        gpus.append(g)
            index += entry.count
        if len({g.uuid for g in gpus}) != len(gpus):
            raise ScenarioError(f"node {spec.name!r}: two GPUs share a uuid")
        nodes.append(Node(spec.name, NodeInventory(tuple(gpus), mem_scale, core_scale),
                          tuple(sorted(spec.labels.items()))))
    return nodes


def load_scenarios(path: str | Path) -> list[Scenario]:
    p = Path(path)
    data = read_bounded(p, f"scenario {p}", limit=MAX_SCENARIO_BYTES, error=ScenarioError)
    try:
        docs = [d for d in yaml.safe_load_all(data) if d is not None]
    except yaml.YAMLError as e:
        raise ScenarioError(f"scenario {p} is not valid YAML: {e}") from e
    if not docs:
        raise ScenarioError(f"scenario {p} is empty")
    out = []
    for i, doc in enumerate(docs):
        where = f"{p}" + (f" (document {i + 1})" if len(docs) > 1 else "")
        if not isinstance(doc, dict):
            raise ScenarioError(f"{where}: expected a mapping with nodes and workload")
        try:
            out.append(Scenario.model_validate(doc))
        except ValidationError as e:
            lines = [f"invalid scenario {where}:"]
            for err in e.errors():
                loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "extra_forbidden":
                    msg = "unknown key"
                lines.append(f"  {loc}: {msg}")
            raise ScenarioError("\n".join(lines)) from None
    return out
