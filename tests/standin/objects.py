"""What kube-apiserver does to an object on its way into storage, where vgpud can see it:
defaults, quantities in canonical form, names, and the validations a vgpud write could
fail. Checked against kube-apiserver 1.37.2 (tests/realkube/test_standin_agrees.py).

- **Names** (create): ``metadata.name`` or ``generateName`` is required; a name must be
  a DNS-1123 subdomain (a namespace's a DNS-1123 label), except an Event's, which may
  be anything. ``generateName`` gets five characters of kube-apiserver's alphabet,
  the prefix cut to 58 characters first (``names.SimpleNameGenerator``).
- **Pods** (``SetDefaults_Pod``, ``SetDefaults_Container``, ``ValidateResourceRequirements``):
  ``restartPolicy: Always``, ``terminationGracePeriodSeconds: 30``, ``dnsPolicy:
  ClusterFirst``, ``schedulerName: default-scheduler``, ``securityContext: {}``,
  ``enableServiceLinks: true``; per container ``imagePullPolicy`` (``Always`` for an
  untagged or ``:latest`` image, else ``IfNotPresent``), ``terminationMessagePath``,
  ``terminationMessagePolicy``, ``resources: {}``, and **requests copied from limits**
  for every resource with a limit and no request. Every quantity is canonical
  (``quantity.py``); a request for an extended resource (a name with a domain other
  than ``kubernetes.io``) needs a limit equal to it, and both must be whole numbers.
  ``status.phase: Pending`` at create.
- **Nodes** (``SetDefaults_NodeStatus``): ``status.allocatable`` is a copy of
  ``status.capacity`` when the node has none; both canonical, extended resources whole.
- **Events** (``legacyValidateEvent``): without an ``eventTime``, an Event's namespace
  must be its ``involvedObject.namespace``, or ``default`` (or empty) when that is empty.
- **Leases**: ``acquireTime``/``renewTime`` are ``MicroTime`` values, exactly six
  fractional digits (``RFC3339Micro``), else the object cannot be decoded (400).

Not copied (no vgpud code reads or writes them; say so here when one starts to):
admission plugins (the ServiceAccount volume and ``serviceAccountName``, the default
tolerations, ``priority``/``preemptionPolicy`` from ``priorityClassName`` — the real
Priority plugin refuses a pod that sets ``priority`` itself, tests here set it to stand
for a class —, the not-ready taint on new nodes), ``status.qosClass``, ``managedFields``,
the rest of pod and node validation (pod spec immutability included: tests move pods
between nodes with the in-process patch), and a Secret's per-type required keys.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Mapping
from typing import Any

from tests.standin.errors import FieldErrors, StoreError
from tests.standin.quantity import QuantityError, canonical, value_of

Obj = dict[str, Any]

DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. "
    "'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
    "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
    "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
# k8s.io/apiserver pkg/storage/names: utilrand.String's alphabet, 5 characters, the
# prefix cut to 63 - 5
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATED_PREFIX = 58
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"


def name_problem(name: str, *, label: bool = False) -> str | None:
    """Why ``name`` is no DNS-1123 subdomain (label), or None."""
    limit, pattern, message = ((63, DNS1123_LABEL, LABEL_MESSAGE) if label
                               else (253, DNS1123_SUBDOMAIN, SUBDOMAIN_MESSAGE))
    if len(name) > limit:
        return f"must be no more than {limit} characters"
    if not pattern.fullmatch(name):
        return message
    return None


def generate_name(prefix: str) -> str:
    base = prefix[:_MAX_GENERATED_PREFIX]
    return base + "".join(secrets.choice(_ALPHABET) for _ in range(5))


def check_name(kind: str, plural: str, meta: Mapping[str, Any]) -> None:
    """``ValidateObjectMeta``'s name rules at create (``generateName`` already applied)."""
    if plural == "events":
        return
    name = str(meta.get("name"))
    label = plural == "namespaces"
    errors = FieldErrors()
    generated = meta.get("generateName")
    if generated:
        problem = name_problem(str(generated)[:_MAX_GENERATED_PREFIX] + "x", label=label)
        if problem is not None:
            errors.invalid("metadata.generateName", generated, problem)
    problem = name_problem(name, label=label)
    if problem is not None:
        errors.invalid("metadata.name", name, problem)
    errors.raise_if_any(kind, name)


# -- quantities ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def is_extended(resource: str) -> bool:
    """``IsExtendedResourceName``: a domain-qualified name outside ``kubernetes.io``, not a
    quota's ``requests.`` name."""
    if "/" not in resource or resource.startswith("requests."):
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def _undecodable(kind: str, exc: QuantityError) -> StoreError:
    return StoreError(400, "BadRequest",
                      f'{kind} in version "v1" cannot be handled as a {kind}: {exc}')


def _resource_list(values: Any, kind: str, validate: bool = True) -> Any:
    """A resource list with canonical quantities; the same object when nothing changes.
    Without ``validate`` a value that is no quantity stays as it is."""
    if not isinstance(values, dict):
        return values
    out = values
    for key, raw in values.items():
        try:
            text = canonical(raw)
        except QuantityError as exc:
            if not validate:
                continue
            raise _undecodable(kind, exc) from None
        if text != raw:
            if out is values:
                out = dict(values)
            out[key] = text
    return out


@functools.lru_cache(maxsize=4096)
def _value_problem(key: str, text: str) -> str | None:
    """``ValidateResourceQuantityValue``: why ``text`` cannot be the amount of ``key``."""
    v = value_of(text)
    if v < 0:
        return "must be greater than or equal to 0"
    if is_extended(key) and v.denominator != 1:
        return "must be an integer"
    return None


@functools.lru_cache(maxsize=4096)
def _request_problem(key: str, request: str, limit: str) -> str | None:
    """Why a request of ``request`` cannot go with a limit of ``limit``."""
    if is_extended(key) and value_of(request) != value_of(limit):
        return f"must be equal to {key} limit of {limit}"
    if value_of(request) > value_of(limit):
        return f"must be less than or equal to {key} limit of {limit}"
    return None


def _check_values(values: Mapping[str, Any], path: str, errors: FieldErrors) -> None:
    for key, text in values.items():
        problem = _value_problem(key, text)
        if problem is not None:
            errors.invalid(f"{path}[{key}]", text, problem)


# -- pods ----------------------------------------------------------------------------------

# (stored objects are never mutated, so every pod may share these values)
_POD_DEFAULTS: dict[str, Any] = {
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "dnsPolicy": "ClusterFirst",
    "securityContext": {},
    "schedulerName": "default-scheduler",
    "enableServiceLinks": True,
}
_NO_RESOURCES: dict[str, Any] = {}


@functools.lru_cache(maxsize=1024)
def _pull_policy(image: str) -> str:
    """``SetDefaults_Container``: ``Always`` for ``:latest`` or no tag (a digest counts)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _check_requirements(limits: Any, requests: Any, path: str, errors: FieldErrors) -> None:
    """``ValidateResourceRequirements``: quantities, and a request no larger than its limit
    (equal to it, and with one, for an extended resource)."""
    lims = limits if isinstance(limits, dict) else {}
    _check_values(lims, f"{path}.limits", errors)
    if not isinstance(requests, dict):
        return
    _check_values(requests, f"{path}.requests", errors)
    for key, text in requests.items():
        if key in lims:
            problem = _request_problem(key, text, lims[key])
            if problem is not None:
                errors.invalid(f"{path}.requests", text, problem)
        elif is_extended(key):
            errors.required(f"{path}.limits", "Limit must be set for non overcommitable resources")


def _resources(res: Any, path: str, errors: FieldErrors | None) -> Any:
    if not isinstance(res, dict):
        return res
    limits = _resource_list(res.get("limits"), "Pod", errors is not None)
    requests = _resource_list(res.get("requests"), "Pod", errors is not None)
    if isinstance(limits, dict) and limits:
        missing = {k: v for k, v in limits.items()
                   if not isinstance(requests, dict) or k not in requests}
        if missing:
            requests = {**(requests if isinstance(requests, dict) else {}), **missing}
    if errors is not None:
        _check_requirements(limits, requests, path, errors)
    if limits is res.get("limits") and requests is res.get("requests"):
        return res
    out = dict(res)
    for key, value in (("limits", limits), ("requests", requests)):
        if value is not None:
            out[key] = value
    return out


def _container(c: Any, path: str, errors: FieldErrors | None) -> Any:
    if not isinstance(c, dict):
        return c
    res = c.get("resources")
    new = _NO_RESOURCES if res is None else _resources(res, path + ".resources", errors)
    if (new is res and "imagePullPolicy" in c and "terminationMessagePath" in c
            and "terminationMessagePolicy" in c):
        return c
    out = dict(c)
    out["resources"] = new
    if "imagePullPolicy" not in c:
        out["imagePullPolicy"] = _pull_policy(str(c.get("image") or ""))
    if "terminationMessagePath" not in c:
        out["terminationMessagePath"] = "/dev/termination-log"
    if "terminationMessagePolicy" not in c:
        out["terminationMessagePolicy"] = "File"
    return out


def pod(obj: Obj, *, creating: bool, validate: bool = True) -> Obj:
    """A pod with kube-apiserver's defaults; the same dict when it has them all.
    ``validate``: refuse what kube-apiserver refuses (the checks above)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = {}
    new_spec = spec
    if creating and validate and not spec.get("containers"):
        no_containers = FieldErrors()
        no_containers.required("spec.containers")
        no_containers.raise_if_any("Pod", str(meta.get("name", "")))
    errors = FieldErrors() if validate else None
    missing = [key for key in _POD_DEFAULTS if key not in spec]
    if missing:
        new_spec = dict(spec)
        for key in missing:
            new_spec[key] = _POD_DEFAULTS[key]
    for field in ("initContainers", "containers"):
        items = spec.get(field)
        if not isinstance(items, list):
            continue
        new_items = [_container(c, f"spec.{field}[{i}]" if errors is not None else "", errors)
                     for i, c in enumerate(items)]
        if any(a is not b for a, b in zip(new_items, items, strict=True)):
            if new_spec is spec:
                new_spec = dict(spec)
            new_spec[field] = new_items
    if errors is not None:
        errors.raise_if_any("Pod", str(meta.get("name", "")))
    out = obj
    if new_spec is not obj.get("spec"):
        out = dict(obj)
        out["spec"] = new_spec
    if creating:
        status = obj.get("status")
        if not isinstance(status, dict) or "phase" not in status:
            out = dict(out) if out is obj else out
            out["status"] = {**(status if isinstance(status, dict) else {}), "phase": "Pending"}
    return out


# -- nodes, events, leases -----------------------------------------------------------------


def node(obj: Obj, *, validate: bool = True) -> Obj:
    status = obj.get("status")
    if not isinstance(status, dict):
        return obj
    capacity = _resource_list(status.get("capacity"), "Node", validate)
    allocatable = _resource_list(status.get("allocatable"), "Node", validate)
    if allocatable is None and isinstance(capacity, dict):
        allocatable = dict(capacity)
    errors = FieldErrors()
    for key, values in (("capacity", capacity), ("allocatable", allocatable)):
        if validate and isinstance(values, dict):
            for resource, text in values.items():
                v = value_of(text)
                if v < 0:
                    errors.invalid(f"status.{key}.{resource}", text,
                                   "must be greater than or equal to 0")
                elif is_extended(resource) and v.denominator != 1:
                    errors.invalid(f"status.{key}.{resource}", text, "must be an integer")
    errors.raise_if_any("Node", str((obj.get("metadata") or {}).get("name", "")))
    if capacity is status.get("capacity") and allocatable is status.get("allocatable"):
        return obj
    new_status = dict(status)
    for key, values in (("capacity", capacity), ("allocatable", allocatable)):
        if values is not None:
            new_status[key] = values
    out = dict(obj)
    out["status"] = new_status
    return out


def check_event(obj: Obj, namespace: str) -> None:
    if obj.get("eventTime"):
        return  # a "new" Event: its own rules, which vgpud's Events never meet
    involved = obj.get("involvedObject") or {}
    theirs = str(involved.get("namespace") or "") if isinstance(involved, dict) else ""
    if (namespace not in ("", "default")) if not theirs else (namespace != theirs):
        errors = FieldErrors()
        errors.invalid("involvedObject.namespace", theirs, "does not match event.namespace")
        errors.raise_if_any("Event", str((obj.get("metadata") or {}).get("name", "")))


def check_lease(obj: Obj) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and _MICRO_TIME.fullmatch(value)):
            raise StoreError(
                400, "BadRequest",
                f'Lease in version "v1" cannot be handled as a Lease: parsing time "{value}" as '
                f'"{RFC3339_MICRO}": cannot parse it as RFC3339 with microseconds')
