"""The patch formats of the API stand-in, as pure functions over JSON values.

- ``application/merge-patch+json``: RFC 7386. Only the containers along patched
  paths are copied; untouched sub-trees are shared with the input (stored objects
  are never mutated in place, so sharing is safe).
- ``application/strategic-merge-patch+json``: **merge-patch semantics with list
  replacement**. The real server merges some lists by key (containers by name,
  conditions by type) and understands ``$patch`` directives; the stand-in does not
  (a ``$patch``/``$retainKeys``/``$setElementOrder`` key is rejected with 422 so a
  caller relying on them notices).
- ``application/json-patch+json``: RFC 6902 (add, remove, replace, move, copy,
  test). A malformed patch is a ``PatchError(400)``; an operation that cannot apply
  (missing path, failed ``test``) is ``PatchError(422)``, which the server answers as
  kube-apiserver does: ``422 Invalid`` with the bare message ``REJECTED`` and empty
  ``details`` (the reason is not passed on there either).
- ``application/apply-patch+yaml``: minimal server-side apply: the applied
  configuration is merged like a merge patch (no field ownership, nothing removed).
"""

from __future__ import annotations

import copy
from typing import Any

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
CONTENT_TYPES = (MERGE, STRATEGIC, JSON_PATCH, APPLY)
# kube-apiserver's answer to a JSON patch that does not apply (NewGenericServerResponse)
REJECTED = "the server rejected our request due to an error in our request"


class PatchError(ValueError):
    """A patch that cannot be applied; ``code`` is the HTTP status to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch, copying only what changes."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_DIRECTIVES = ("$patch", "$retainKeys", "$setElementOrder", "$deleteFromPrimitiveList")


def _check_directives(patch: Any) -> None:
    if isinstance(patch, dict):
        for key, value in patch.items():
            if key.startswith(_DIRECTIVES):
                raise PatchError(
                    422, f"strategic merge directive {key!r} is not supported by the stand-in"
                )
            _check_directives(value)
    elif isinstance(patch, list):
        for item in patch:
            _check_directives(item)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch, approximated as a merge patch with list replacement."""
    _check_directives(patch)
    return merge_patch(target, patch)


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(400, f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(422, f"path {path!r} does not exist")
    return node


def _get(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(422, f"path {path!r} does not exist")


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(422, f"index out of range in {path!r}")
    else:
        raise PatchError(422, f"cannot add at {path!r}")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise PatchError(422, "cannot remove the whole document")
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(422, f"path {path!r} does not exist")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch to a deep copy of ``target``."""
    if not isinstance(operations, list):
        raise PatchError(400, "a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(400, f"malformed JSON patch operation {op!r}")
        kind, path = op["op"], op["path"]
        parts = _pointer(path)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(400, f"operation {kind!r} needs a value")
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif kind == "remove":
            doc = _remove(doc, parts, path)
        elif kind == "replace":
            _get(doc, parts, path)
            doc = _remove(doc, parts, path) if parts else doc
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = copy.deepcopy(_get(doc, source, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, source, op.get("from", ""))
            doc = _add(doc, parts, value, path)
        elif kind == "test":
            if _get(doc, parts, path) != op["value"]:
                raise PatchError(422, f"testing value {path!r} failed: test failed")
        else:
            raise PatchError(400, f"unknown JSON patch operation {kind!r}")
    return doc
