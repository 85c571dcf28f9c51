"""Label and field selectors of the API stand-in, compiled to predicates.

Label selectors follow the Kubernetes grammar: ``a=b``, ``a==b``, ``a!=b``, ``a``,
``!a``, ``a in (x,y)``, ``a notin (x,y)``, ``a>1``, ``a<1`` (whole numbers),
comma-separated (all must hold).

Field selectors accept ``path=value``, ``path==value`` and ``path!=value``. As on
the real server only some fields are selectable per resource (``FIELDS`` below, as
kube-apiserver 1.37's ``*ToSelectableFields``: a cluster-scoped resource has no
``metadata.namespace``), each read as that server reads it: a missing field is the empty
string (``spec.nodeName=`` selects unbound pods), a pod's ``spec.hostNetwork`` and a
node's ``spec.unschedulable`` are ``false`` unless set, an Event's ``source`` is
``source.component``. Anything else is a ``SelectorError`` (the server answers 400) with
kube-apiserver's message. Not copied: ``status.podIPs`` (selectable there, never used
here), and the wording of newer resources' refusals (leases say ``"x" is not a known
field selector: only "metadata.name", "metadata.namespace"`` there).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

Getter = Callable[[Mapping[str, Any]], str]


def _at(path: str) -> Getter:
    parts = path.split(".")

    def get(obj: Mapping[str, Any]) -> str:
        node: Any = obj
        for part in parts:
            if not isinstance(node, Mapping) or part not in node:
                return ""
            node = node[part]
        if isinstance(node, bool):
            return "true" if node else "false"
        if node is None or isinstance(node, Mapping | list):
            return ""
        return str(node)

    return get


def _flag(path: str) -> Getter:
    at = _at(path)
    return lambda obj: at(obj) or "false"


def _fields(*paths: str, **special: Getter) -> dict[str, Getter]:
    return {**{p: _at(p) for p in paths}, **special}


_NAME = ("metadata.name",)
_NAMESPACED = ("metadata.name", "metadata.namespace")
FIELDS: dict[str, dict[str, Getter]] = {
    "pods": _fields(
        *_NAMESPACED, "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
        "spec.serviceAccountName", "status.phase", "status.podIP", "status.nominatedNodeName",
        **{"spec.hostNetwork": _flag("spec.hostNetwork")}),
    "nodes": _fields(*_NAME, **{"spec.unschedulable": _flag("spec.unschedulable")}),
    "namespaces": _fields(*_NAME, "status.phase"),
    "events": _fields(
        *_NAMESPACED, "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
        "involvedObject.fieldPath", "reason", "reportingComponent", "type",
        source=_at("source.component")),
    "secrets": _fields(*_NAMESPACED, "type"),
}


class SelectorError(ValueError):
    """A selector the server cannot parse or does not support."""


def _always(_: Mapping[str, Any]) -> bool:
    return True


_LABEL_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_LABEL_CMP = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_LABEL_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")
_LABEL_ORDER = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*([<>])\s*([^\s]*)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def label_selector(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """Compile a label selector into a predicate over a labels mapping."""
    if not selector or not selector.strip():
        return _always
    reqs: list[tuple[str, str, frozenset[str]]] = []  # (key, op, values)
    for term in _split_terms(selector):
        if m := _LABEL_SET.match(term):
            if m.group(1):
                raise SelectorError(f"unable to parse requirement: {term!r}")
            values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
            reqs.append((m.group(2), m.group(3), values))
        elif m := _LABEL_ORDER.match(term):
            if not re.fullmatch(r"[+-]?[0-9]+", m.group(3)):
                raise SelectorError(
                    f"for 'Gt', 'Lt' operators, the value must be an integer: {term!r}")
            reqs.append((m.group(1), "gt" if m.group(2) == ">" else "lt",
                         frozenset({m.group(3)})))
        elif m := _LABEL_CMP.match(term):
            op = "!=" if m.group(2) == "!=" else "in"
            reqs.append((m.group(1), "notin" if op == "!=" else "in", frozenset({m.group(3)})))
        elif m := _LABEL_EXISTS.match(term):
            reqs.append((m.group(2), "!" if m.group(1) else "exists", frozenset()))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")

    def matches(labels: Mapping[str, str]) -> bool:
        for key, op, values in reqs:
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and labels.get(key) in values:
                return False
            if op == "exists" and key not in labels:
                return False
            if op == "!" and key in labels:
                return False
            if op in ("gt", "lt"):
                have = labels.get(key)
                if have is None or not re.fullmatch(r"[+-]?[0-9]+", have):
                    return False
                (bound,) = values
                if (int(have) > int(bound)) if op == "gt" else (int(have) < int(bound)):
                    continue
                return False
        return True

    return matches


def field_selector(selector: str | None, plural: str, namespaced: bool = True) -> Predicate:
    """Compile a field selector for resource ``plural`` into a predicate over objects."""
    if not selector or not selector.strip():
        return _always
    allowed = FIELDS.get(plural) or _fields(*(_NAMESPACED if namespaced else _NAME))
    terms: list[tuple[Getter, str, bool]] = []  # (getter, value, negate)
    for term in _split_terms(selector):
        if "!=" in term:
            path, value = term.split("!=", 1)
            negate = True
        elif "==" in term:
            path, value = term.split("==", 1)
            negate = False
        elif "=" in term:
            path, value = term.split("=", 1)
            negate = False
        else:
            raise SelectorError(f"invalid selector: '{selector}'; can't understand '{term}'")
        path, value = path.strip(), value.strip()
        if path not in allowed:
            raise SelectorError(f"field label not supported: {path}")
        terms.append((allowed[path], value, negate))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((get(obj) == v) != neg for get, v, neg in terms)

    return matches
