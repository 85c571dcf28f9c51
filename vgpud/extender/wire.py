"""kube-scheduler's extender v1 wire format (k8s.io/kube-scheduler/extender/v1).

The Go types have no json tags, so the keys are the Go field names: ``Pod``,
``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``; ``Host``/``Score``; ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``.
Requests are parsed here into frozen values; anything malformed raises
:class:`WireError` with a message for a person.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypedDict

from vgpud.core.codec import CodecError, load_json


class WireError(ValueError):
    """A request body that is not what kube-scheduler sends."""


class FilterResultJson(TypedDict, total=False):
    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class BindingResultJson(TypedDict):
    Error: str


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Filter and prioritize input: the pod and its candidate nodes."""

    pod: dict[str, Any]
    node_names: tuple[str, ...]
    nodes: dict[str, dict[str, Any]] | None  # full Node objects, when not nodeCacheCapable

    @property
    def uid(self) -> str:
        return str((self.pod.get("metadata") or {}).get("uid") or "")

    @property
    def key(self) -> str:
        meta = self.pod.get("metadata") or {}
        return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


@dataclass(frozen=True, slots=True)
class BindingArgs:
    name: str
    namespace: str
    uid: str
    node: str


def _body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise WireError("empty request body; expected a JSON object")
    try:
        doc = load_json(raw, "the request body")
    except CodecError as e:
        raise WireError(str(e)) from None
    if not isinstance(doc, dict):
        raise WireError(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


def parse_extender_args(raw: bytes) -> ExtenderArgs:
    doc = _body(raw)
    pod = doc.get("Pod")
    if not isinstance(pod, dict):
        raise WireError("missing 'Pod' (the pod being scheduled)")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise WireError("'Pod.metadata.name' is missing")
    names = doc.get("NodeNames")
    nodes_doc = doc.get("Nodes")
    full: dict[str, dict[str, Any]] | None = None
    if names is not None:
        # map() keeps the check at C speed: 12,500 names when every node is a candidate
        if not isinstance(names, list) or not all(map(isinstance, names, repeat(str))):
            raise WireError("'NodeNames' must be a list of node names")
        node_names = tuple(names)
    elif nodes_doc is not None:
        if not isinstance(nodes_doc, dict) or not isinstance(nodes_doc.get("items", []), list):
            raise WireError("'Nodes' must be a NodeList object with 'items'")
        full = {}
        for item in nodes_doc.get("items") or []:
            name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
            if not isinstance(name, str):
                raise WireError("a node in 'Nodes.items' has no metadata.name")
            full[name] = item
        node_names = tuple(full)
    else:
        raise WireError("neither 'NodeNames' nor 'Nodes' was given")
    return ExtenderArgs(pod=pod, node_names=node_names, nodes=full)


def parse_binding_args(raw: bytes) -> BindingArgs:
    doc = _body(raw)
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        v = doc.get(key, "")
        if not isinstance(v, str):
            raise WireError(f"'{key}' must be a string")
        values[key] = v
    for key in ("PodName", "Node"):
        if not values[key]:
            raise WireError(f"'{key}' is missing")
    return BindingArgs(values["PodName"], values["PodNamespace"] or "default",
                       values["PodUID"], values["Node"])


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """``ExtenderPreemptionArgs``: the preemptor and, per node, kube-scheduler's victims
    (uids; with namespace, name and labels when it sent whole pods) and its count of
    PodDisruptionBudget violations among them."""

    pod: dict[str, Any]
    victims: dict[str, tuple[tuple[str, ...], int]]
    known: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]]

    @property
    def key(self) -> str:
        meta = self.pod.get("metadata") or {}
        return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"

    @property
    def priority(self) -> int:
        p = (self.pod.get("spec") or {}).get("priority")
        return p if isinstance(p, int) and not isinstance(p, bool) else 0


def _count(v: Any, where: str) -> int:
    if v is None:
        return 0
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise WireError(f"'{where}.NumPDBViolations' must be a count")
    return v


def parse_preemption_args(raw: bytes) -> PreemptionArgs:
    doc = _body(raw)
    pod = doc.get("Pod")
    if not isinstance(pod, dict) or not isinstance((pod.get("metadata") or {}).get("name"), str):
        raise WireError("missing 'Pod' (the preemptor) or its metadata.name")
    victims: dict[str, tuple[tuple[str, ...], int]] = {}
    known: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {}
    meta = doc.get("NodeNameToMetaVictims")
    full = doc.get("NodeNameToVictims")
    for field, table in (("NodeNameToMetaVictims", meta), ("NodeNameToVictims", full)):
        if table is None:
            continue
        if not isinstance(table, dict):
            raise WireError(f"'{field}' must map node names to victims")
        for node, v in table.items():
            if v is None:
                v = {}
            if not isinstance(v, dict) or not isinstance(v.get("Pods") or [], list):
                raise WireError(f"'{field}.{node}' must be an object with 'Pods'")
            uids = []
            for p in v.get("Pods") or []:
                if not isinstance(p, dict):
                    raise WireError(f"'{field}.{node}.Pods' holds a non-object")
                if field == "NodeNameToMetaVictims":
                    uid = p.get("UID")
                else:
                    m = p.get("metadata") or {}
                    uid = m.get("uid")
                    labels = m.get("labels") or {}
                    if isinstance(uid, str) and isinstance(labels, dict):
                        known[uid] = (str(m.get("namespace") or "default"),
                                      str(m.get("name") or ""),
                                      tuple(sorted((str(a), str(b)) for a, b in labels.items())))
                if not isinstance(uid, str) or not uid:
                    raise WireError(f"a victim on node {node!r} has no uid")
                uids.append(uid)
            victims[node] = (tuple(uids), _count(v.get("NumPDBViolations"), f"{field}.{node}"))
    return PreemptionArgs(pod=pod, victims=victims, known=known)


def preemption_result(victims: dict[str, tuple[tuple[str, ...], int]]) -> dict[str, Any]:
    """``ExtenderPreemptionResult``: always the meta form (kube-scheduler maps the uids
    back to the pods in its own cache)."""
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": n}
        for node, (uids, n) in victims.items()}}


class RawJson(str):
    """A response body already rendered as JSON."""


_SAFE_NAMES = re.compile(r"[a-z0-9.\-]*")  # DNS-1123 subdomains need no JSON escaping


def host_priorities(names: list[str], scores: list[int]) -> RawJson:
    """``[{"Host": name, "Score": n}, ...]`` rendered directly (names escaped when needed)."""
    if _SAFE_NAMES.fullmatch("".join(names)):
        return RawJson("[" + ",".join(f'{{"Host":"{n}","Score":{s}}}'
                                      for n, s in zip(names, scores, strict=True)) + "]")
    return RawJson("[" + ",".join(f'{{"Host":{json.dumps(n)},"Score":{s}}}'
                                  for n, s in zip(names, scores, strict=True)) + "]")


def filter_result(args: ExtenderArgs, feasible: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> FilterResultJson:
    out: FilterResultJson = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable,
                             "Error": error}
    if args.nodes is not None:
        out["Nodes"] = {"items": [args.nodes[n] for n in feasible]}
        out["NodeNames"] = None
    else:
        out["NodeNames"] = feasible
    return out
