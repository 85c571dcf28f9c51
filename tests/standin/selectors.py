"""Label and field selectors of the API stand-in, compiled to predicates.

Label selectors follow the Kubernetes grammar: ``a=b``, ``a==b``, ``a!=b``, ``a``,
``!a``, ``a in (x,y)``, ``a notin (x,y)``, comma-separated (all must hold).

Field selectors accept ``path=value``, ``path==value`` and ``path!=value``. As on
the real server only some fields are selectable per resource (``FIELDS`` below); a
missing field compares as the empty string, so ``spec.nodeName=`` selects unbound
pods. Anything else is a ``SelectorError`` (the server answers 400).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_COMMON = frozenset({"metadata.name", "metadata.namespace"})
FIELDS: dict[str, frozenset[str]] = {
    "pods": _COMMON
    | {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "nodes": _COMMON | {"spec.unschedulable"},
    "events": _COMMON
    | {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
}


class SelectorError(ValueError):
    """A selector the server cannot parse or does not support."""


def _always(_: Mapping[str, Any]) -> bool:
    return True


_LABEL_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_LABEL_CMP = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")
_LABEL_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


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
        return True

    return matches


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if isinstance(node, bool):
        return "true" if node else "false"
    if node is None:
        return ""
    if isinstance(node, Mapping):
        return ""
    return str(node)


def field_selector(selector: str | None, plural: str) -> Predicate:
    """Compile a field selector for resource ``plural`` into a predicate over objects."""
    if not selector or not selector.strip():
        return _always
    allowed = FIELDS.get(plural, _COMMON)
    terms: list[tuple[str, str, bool]] = []  # (path, value, negate)
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
            raise SelectorError(f"invalid field selector term {term!r}: expected path=value")
        path, value = path.strip(), value.strip()
        if path not in allowed:
            raise SelectorError(f'field label not supported: "{path}" for {plural}')
        terms.append((path, value, negate))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, p) == v) != neg for p, v, neg in terms)

    return matches
