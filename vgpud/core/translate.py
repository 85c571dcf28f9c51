"""vGPU requests as DRA claims: what the webhook does to a pod headed to DRA nodes.

A user keeps the pod spec of the device-plugin path (``nvidia.com/vgpu-number``,
``-memory``, ``-cores``); on a cluster whose GPU nodes (or some of them) run vgpud's DRA
driver, the webhook rewrites such a pod into the DRA form kube-scheduler allocates by
itself (issue 26, item 3):

- each GPU container's ask becomes a claim made from a ResourceClaimTemplate of its
  shape, ``vgpud-<n>x<memory>mi-<cores>c`` in the pod's namespace: ``n`` devices of the
  ``vgpu`` DeviceClass, each consuming ``<memory>Mi`` of device memory and ``<cores>``
  % of its SMs (capacity requests, the slices' consumable capacity); a whole GPU (all of
  its memory, 100 % of the cores) is ``n`` devices of the ``gpu`` class. Pods of one
  shape share the template (a template holds no pod's state);
- the pod lists the claim (``spec.resourceClaims``, one per GPU container,
  ``vgpud-<container>``), the container names it in ``resources.claims``, and the vGPU
  resources leave its requests and limits (nothing on a DRA node advertises them);
- the scheduler stays the pod's own (kube-scheduler allocates DRA claims; vgpud's
  extender ignores DRA nodes).

Which pods: ``mode`` ``always`` (every GPU pod: a cluster whose GPU nodes are all DRA),
``selected`` (a pod whose ``nodeSelector`` names ``vgpud.io/node-mode: dra``), ``off``.

Pure: :func:`translate` returns the patch and the templates to make, or why it cannot
(a share of memory by percent, or a MIG profile, has no capacity request to become).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from vgpud.core.dra import MODE_DRA, NODE_MODE_LABEL
from vgpud.core.model import ContainerRequest, Defaults
from vgpud.core.patch import PatchOp, pointer
from vgpud.core.requests import (
    RequestError,
    enabled_presets,
    parse_pod,
    parse_quantity,
    preset_of,
)

Mode = Literal["off", "selected", "always"]  # which pods are translated
TEMPLATE_API = "resource.k8s.io/v1"
WHOLE = 100  # cores of a whole GPU


@dataclass(frozen=True, slots=True)
class Classes:
    """The chart's DeviceClass names (``dra.deviceClasses``)."""

    vgpu: str = "vgpu.vgpud.io"
    gpu: str = "gpu.vgpud.io"


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """One container's ask: ``number`` devices of ``memory`` MiB (None: the whole GPU)
    and ``cores`` % each."""

    number: int
    memory: int | None
    cores: int

    @property
    def whole(self) -> bool:
        return self.memory is None

    @property
    def template_name(self) -> str:
        if self.whole:
            return f"vgpud-{self.number}x-whole"
        return f"vgpud-{self.number}x{self.memory}mi-{self.cores}c"

    def template(self, namespace: str, classes: Classes) -> dict[str, Any]:
        """The ResourceClaimTemplate of this shape in ``namespace``."""
        exactly: dict[str, Any] = {"deviceClassName": classes.gpu if self.whole else classes.vgpu,
                                   "allocationMode": "ExactCount", "count": self.number}
        if not self.whole:
            exactly["capacity"] = {"requests": {"memory": f"{self.memory}Mi",
                                                "cores": str(self.cores)}}
        return {"apiVersion": TEMPLATE_API, "kind": "ResourceClaimTemplate",
                "metadata": {"name": self.template_name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "vgpud-webhook"}},
                "spec": {"spec": {"devices": {"requests": [{"name": "vgpu",
                                                            "exactly": exactly}]}}}}


    def made(self, template: Mapping[str, Any], classes: Classes) -> bool:
        """Whether a stored template is this shape's: its one request asks what
        :meth:`template` asks (quantities compared by value: the API server stores
        ``4096Mi`` as ``4Gi``; fields it defaults are not compared)."""
        def essence(doc: Mapping[str, Any]) -> tuple[Any, ...] | None:
            try:
                (req,) = doc["spec"]["spec"]["devices"]["requests"]
                exactly = req["exactly"]
                capacity = (exactly.get("capacity") or {}).get("requests") or {}
                amounts = tuple(sorted((k, parse_quantity(v, k)) for k, v in capacity.items()))
                return (req.get("name"), exactly.get("deviceClassName"),
                        exactly.get("allocationMode", "ExactCount"), exactly.get("count", 1),
                        amounts, bool(exactly.get("selectors")),
                        bool(exactly.get("adminAccess")))
            except (KeyError, TypeError, ValueError, AttributeError, RequestError):
                return None
        want = essence(self.template("", classes))
        return want is not None and essence(template) == want


@dataclass(frozen=True, slots=True)
class Translation:
    ops: tuple[PatchOp, ...]
    shapes: tuple[Shape, ...]  # the templates the patch names, each once


def headed_to_dra(pod: Mapping[str, Any], mode: Mode) -> bool:
    if mode == "always":
        return True
    if mode != "selected":
        return False
    spec = pod.get("spec")
    selector = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    return isinstance(selector, Mapping) and selector.get(NODE_MODE_LABEL) == MODE_DRA


def shape_of(c: ContainerRequest) -> Shape:
    """The claim shape of a container's ask; :class:`RequestError` where none fits."""
    if c.profile:
        raise RequestError(
            f"container {c.name!r}: a MIG profile ({c.profile}) is not translated into a "
            f"DRA claim; ask for it with a ResourceClaim of the mig DeviceClass")
    if c.memory is not None:
        return Shape(c.number, c.memory, c.cores)
    if c.memory_percent == WHOLE and c.cores in (0, WHOLE):
        return Shape(c.number, None, WHOLE)
    raise RequestError(
        f"container {c.name!r}: {c.memory_percent}% of a GPU's memory has no DRA "
        f"capacity request (a claim consumes bytes); ask for vgpu-memory in MiB, or "
        f"100% for a whole GPU")


def translate(pod: Mapping[str, Any], defaults: Defaults, classes: Classes = Classes(),
              ) -> Translation:
    """The patch turning a vGPU pod's asks into claims, and the shapes it names; raises
    :class:`RequestError` with the reason when an ask has no claim to become."""
    request = parse_pod(pod, defaults)
    asks = {c.name: c for c in request.containers}
    spec = pod.get("spec")
    assert isinstance(spec, Mapping)  # parse_pod read it
    presets = enabled_presets(defaults)
    ops: list[PatchOp] = []
    claims: list[dict[str, str]] = []
    shapes: dict[Shape, None] = {}
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            name = c.get("name") if isinstance(c, Mapping) else None
            if not isinstance(name, str) or name not in asks:
                continue
            shape = shape_of(asks[name])
            shapes[shape] = None
            claim = f"vgpud-{name}"
            claims.append({"name": claim, "resourceClaimTemplateName": shape.template_name})
            resources = c.get("resources")
            for part in ("requests", "limits"):
                amounts = resources.get(part) if isinstance(resources, Mapping) else None
                ops += [{"op": "remove", "path": pointer("spec", kind, i, "resources", part, n)}
                        for n in (amounts or {}) if preset_of([n], presets) is not None]
            at = pointer("spec", kind, i, "resources")
            if not isinstance(resources, Mapping):
                ops.append({"op": "add", "path": at, "value": {"claims": [{"name": claim}]}})
            elif isinstance(resources.get("claims"), list):
                ops.append({"op": "add", "path": at + "/claims/-", "value": {"name": claim}})
            else:
                ops.append({"op": "add", "path": at + "/claims", "value": [{"name": claim}]})
    if not claims:
        return Translation((), ())
    if isinstance(spec.get("resourceClaims"), list):
        ops += [{"op": "add", "path": "/spec/resourceClaims/-", "value": c} for c in claims]
    else:
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": claims})
    return Translation(tuple(ops), tuple(shapes))
