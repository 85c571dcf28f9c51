"""The rendered manifests as objects, and what the code itself asks of the API server.

``Manifests`` wraps one rendered YAML stream (the committed ``manifests/vgpud.yaml`` or
a fresh ``helm template``). ``api_needs`` reads vgpud's source (AST, no imports) and
lists the (resource, verb) pairs each role's code can issue, so RBAC is checked against
the code rather than against a second hand-written list.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from kubernetes_asyncio.client import AdmissionregistrationV1Api, CoordinationV1Api, CoreV1Api

from vgpud.core.model import Defaults
from vgpud.core.requests import PRESETS
from vgpud.kube import resources

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "vgpud.yaml"
SCHEDULER_CONFIG = ROOT / "manifests" / "kube-scheduler-config.yaml"
CHART = ROOT / "helm" / "vgpud"
# the chart's default scheduler.migProfiles: the MIG profile resources it manages
MIG_PROFILES: list[str] = yaml.safe_load((CHART / "values.yaml").read_text())["scheduler"][
    "migProfiles"]

Rule = tuple[str, str, tuple[str, ...]]  # (apiGroup, resource, resourceNames)


@dataclass(frozen=True)
class Manifests:
    text: str
    docs: tuple[dict[str, Any], ...]

    @classmethod
    def parse(cls, text: str) -> Manifests:
        docs = tuple(d for d in yaml.safe_load_all(text) if d)
        return cls(text, docs)

    @classmethod
    def committed(cls) -> Manifests:
        return cls.parse(MANIFEST.read_text())

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def workload(self, kind: str, name: str | None = None) -> dict[str, Any]:
        """The Deployment/DaemonSet ``name``; without a name, the only one of its kind."""
        if name is not None:
            return self.one(kind, name)
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}: name it"
        return found[0]

    def pod_spec(self, kind: str, name: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = self.workload(kind, name)["spec"]["template"]["spec"]
        return spec

    def container(self, kind: str, name: str) -> dict[str, Any]:
        """The container ``name`` of the one workload of ``kind`` that has it."""
        found: list[dict[str, Any]] = [
            c for w in self.of_kind(kind) for c in w["spec"]["template"]["spec"]["containers"]
            if c["name"] == name]
        assert len(found) == 1, f"expected one {kind} container {name}, found {len(found)}"
        return found[0]

    def configmap_file(self, name: str, key: str) -> str:
        return str(self.one("ConfigMap", name)["data"][key])

    def scheduler_config(self) -> dict[str, Any]:
        found = [yaml.safe_load(d["data"]["config.yaml"]) for d in self.of_kind("ConfigMap")
                 if "config.yaml" in (d.get("data") or {})]
        assert len(found) == 1
        cfg: dict[str, Any] = found[0]
        return cfg

    def rules(self, kind: str, name: str) -> dict[Rule, set[str]]:
        """A (Cluster)Role's rules as {(group, resource, resourceNames): verbs}."""
        out: dict[Rule, set[str]] = {}
        for r in self.one(kind, name).get("rules") or []:
            names = tuple(sorted(r.get("resourceNames") or ()))
            for g in r.get("apiGroups") or [""]:
                for res in r.get("resources") or []:
                    out.setdefault((g, res, names), set()).update(r.get("verbs") or [])
        return out


def flag(args: list[str], name: str) -> str | None:
    """The value of ``--name=value`` in a container's args/command, or None."""
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def cli_params(args: list[str]) -> dict[str, Any]:
    """Parse a container's args (``[role, --flag=value, ...]``) with vgpud's own CLI, the
    way the container's entrypoint will; raises a usage error ("No such option") on an
    unknown flag. (typer carries its own copy of click, hence the duck typing.)"""
    import typer.main

    from vgpud.cli import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    role, *rest = args
    ctx = commands[role].make_context(role, list(rest))
    return dict(ctx.params)


def cel_matches(expression: str, obj: dict[str, Any]) -> bool:
    """Evaluate a webhook matchCondition (CEL) with ``object`` bound to ``obj``, as the API
    server does for a CREATE (cel-python, the `test` extra; the caller skips without it)."""
    import celpy
    from celpy.adapter import json_to_cel

    env = celpy.Environment()
    program = env.program(env.compile(expression))
    result = program.evaluate({"object": json_to_cel(obj)})
    assert isinstance(result, celpy.celtypes.BoolType), f"{expression!r} gave {result!r}"
    return bool(result)


# Sample containers' resources (besides every preset's names, alone and mixed).
OTHER_RESOURCES = [{}, {"cpu": "1"}, {"memory": "1Gi", "ephemeral-storage": "1Gi"},
                   {"example.com/fpga": "1"}, {"nvidia.com/vgpu": "1"},
                   {"nvidia.com/mig-1g.5gb": "1"}, {"nvidia.com/mig-3g.40gb": "0"},
                   {"example.com/mig-1g.5gb": "1"}, {"nvidia.com/migrate": "1"}]
PRESET_FIELDS = ("number", "memory", "cores", "memory_percent", "priority")


def sample_pods(extra: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
    """Pods whose one GPU-ish container (or init container) names each resource of every
    preset (and each of ``extra``: renamed ones), in its limits or its requests, with and
    without other resources; and pods with no such container."""
    names = sorted({getattr(p, f) for p in PRESETS.values() for f in PRESET_FIELDS}
                   - {None} | set(extra))
    resources: list[dict[str, Any]] = list(OTHER_RESOURCES)
    resources += [{n: "1"} for n in names] + [{"cpu": "1", n: "1"} for n in names]
    main = {"name": "main", "image": "cuda"}
    yield {"spec": {"containers": [main]}}
    yield {"spec": {"containers": [{**main, "resources": {}}], "initContainers": []}}
    for res in resources:
        for part in ("limits", "requests"):
            gpu = {"name": "gpu", "image": "cuda", "resources": {part: res}}
            yield {"spec": {"containers": [main, gpu]}}
            yield {"spec": {"initContainers": [gpu], "containers": [main]}}
        both = {"name": "gpu", "image": "cuda", "resources": {"limits": {"cpu": "1"},
                                                              "requests": res}}
        yield {"spec": {"containers": [both]}}


def load_render() -> ModuleType:
    """manifests/render.py (a script, not a package module): helm, pinned, and the chart."""
    name = "vgpud_render"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "manifests" / "render.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def match_condition(hook: dict[str, Any]) -> str:
    (cond,) = hook["matchConditions"]
    assert cond["name"]
    expression: str = cond["expression"]
    return expression


def check_match_condition(expression: str, preset: str, compat: tuple[str, ...],
                          defaults: Defaults | None = None) -> None:
    """The expression selects exactly the pods the webhook's code acts on
    (vgpud/core/admission.py is_gpu_pod) under ``defaults`` (the settings' renamed
    presets; else the built-in ones of ``preset`` and ``compat``): none is admitted
    without it, no other is sent."""
    from vgpud.core.admission import is_gpu_pod

    defaults = defaults or Defaults(preset=preset, compat_presets=compat)
    renamed = {n for p in defaults.presets for n in p.names}
    matched = 0
    for pod in sample_pods(renamed):
        want = is_gpu_pod(pod, defaults)
        assert cel_matches(expression, pod) is want, (want, pod)
        matched += want
    assert matched  # the samples do hold GPU pods


def helm_define(text: str, name: str) -> str:
    """The body of ``{{- define "name" -}} ... {{- end -}}`` in a template file."""
    m = re.search(r'\{\{-? define "' + re.escape(name) + r'" -?\}\}\n?(.*?)\{\{-? end -?\}\}',
                  text, re.S)
    assert m, f"no define {name!r}"
    return m.group(1)


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])


GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")


def seconds(duration: str) -> float:
    """A Go duration ("1m30s", "60s") in seconds."""
    assert GO_DURATION.match(duration), f"{duration!r} is not a Go duration"
    unit = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * unit[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)",
                                                             duration))


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) selects ``labels``."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        present = e["key"] in labels
        op = e["operator"]
        if op == "In" and not (present and labels[e["key"]] in e["values"]):
            return False
        if op == "NotIn" and present and labels[e["key"]] in e["values"]:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


# -- NetworkPolicies ----------------------------------------------------------------------

Peers = list[dict[str, Any]] | None  # a rule's `from`; None: every source


@dataclass(frozen=True)
class PodPort:
    workload: str
    labels: dict[str, str]
    container: str
    name: str
    number: int


def pod_ports(m: Manifests) -> list[PodPort]:
    """Every container port of every workload the chart runs, with its pods' labels."""
    out = []
    for kind in ("Deployment", "DaemonSet"):
        for w in m.of_kind(kind):
            tpl = w["spec"]["template"]
            for c in tpl["spec"]["containers"]:
                for p in c.get("ports") or []:
                    out.append(PodPort(f"{kind}/{w['metadata']['name']}", tpl["metadata"]["labels"],
                                       c["name"], p["name"], p["containerPort"]))
    return out


def _rule_admits(rule: dict[str, Any], port: PodPort) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    return any(p.get("protocol", "TCP") == "TCP" and p.get("port") in (port.name, port.number)
               for p in ports)


def admitted_from(m: Manifests, port: PodPort) -> list[Peers]:
    """The `from` of every ingress rule, of every NetworkPolicy selecting the port's pods,
    that admits traffic to it (an empty list: nothing does)."""
    out: list[Peers] = []
    for np in m.of_kind("NetworkPolicy"):
        spec = np["spec"]
        if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
            continue
        if not selector_matches(spec["podSelector"], port.labels):
            continue
        out += [rule.get("from") or None for rule in spec.get("ingress") or []
                if _rule_admits(rule, port)]
    return out


def isolated(m: Manifests, labels: dict[str, str]) -> bool:
    """Whether some NetworkPolicy for Ingress selects pods with ``labels`` (they then take
    only what the policies admit)."""
    return any("Ingress" in np["spec"].get("policyTypes", ["Ingress"])
               and selector_matches(np["spec"]["podSelector"], labels)
               for np in m.of_kind("NetworkPolicy"))


def check_network_policies(m: Manifests, ops_from: list[dict[str, Any]],
                           webhook_from: list[dict[str, Any]]) -> None:
    """Every pod of the chart is isolated; the webhook's HTTPS port takes ``webhook_from``
    (every source when empty) and every other port ``ops_from`` only (nobody when empty);
    every policy selects pods of the chart and names ports those pods have."""
    ports = pod_ports(m)
    assert ports
    for p in ports:
        assert isolated(m, p.labels), f"{p.workload}: no NetworkPolicy selects its pods"
        got = admitted_from(m, p)
        if (p.container, p.name) == ("webhook", "https"):
            want: list[Peers] = [webhook_from or None]
        else:
            want = [ops_from] if ops_from else []
        assert got == want, f"{p.workload} {p.container}:{p.name} is admitted from {got}"
    for np in m.of_kind("NetworkPolicy"):
        name = np["metadata"]["name"]
        mine = [p for p in ports if selector_matches(np["spec"]["podSelector"], p.labels)]
        assert mine, f"NetworkPolicy {name} selects no pod of the chart"
        for rule in np["spec"].get("ingress") or []:
            for rp in rule.get("ports") or []:
                assert rp["port"] in {p.name for p in mine} | {p.number for p in mine}, (
                    f"NetworkPolicy {name} admits port {rp['port']}, which its pods lack")


# -- what the code asks of the API server ---------------------------------------------------

VGPUD = ROOT / "vgpud"
_API = {name for api in (CoreV1Api, CoordinationV1Api, AdmissionregistrationV1Api)
        for name in dir(api)
        if not name.startswith("_") and not name.endswith("_with_http_info")}
_VERBS = {"read": "get", "list": "list", "patch": "patch", "create": "create",
          "replace": "update", "delete": "delete"}
# kubernetes_asyncio's object part of a method name -> the RBAC resource.
_RESOURCES = {"pod": "pods", "pod_binding": "pods/binding", "node": "nodes",
              "node_status": "nodes/status", "event": "events", "lease": "leases",
              "secret": "secrets",
              "mutating_webhook_configuration": "mutatingwebhookconfigurations",
              "validating_webhook_configuration": "validatingwebhookconfigurations"}


class UnmappedCall(AssertionError):
    pass


def _as_rbac(method: str) -> tuple[str, str]:
    verb, _, rest = method.partition("_")
    rest = rest.removeprefix("namespaced_").removesuffix("_for_all_namespaces")
    if verb not in _VERBS or rest not in _RESOURCES:
        raise UnmappedCall(f"API call {method}: add it to tests/deploy/rendered.py and to the "
                           "chart's RBAC")
    return _RESOURCES[rest], _VERBS[verb]


def _trees(paths: list[Path]) -> Iterator[ast.AST]:
    for p in paths:
        yield ast.parse(p.read_text(), str(p))


def _api_methods(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in _API}


_RAW_VERBS = {("GET", "object"): "get", ("GET", "collection"): "list",
              ("POST", "collection"): "create", ("POST", "binding"): "create",
              ("PUT", "object"): "update", ("PATCH", "object"): "patch",
              ("DELETE", "object"): "delete"}


def _raw_need(call: ast.Call) -> tuple[str, str]:
    """``kube.request("POST", PODS.object_path(n, ns) + "/binding", ...)`` and the like:
    the (resource, verb) a raw request on a ``vgpud.kube.resources`` path needs."""
    where = ast.unparse(call)
    if not call.args or not isinstance(call.args[0], ast.Constant) or len(call.args) < 2:
        raise UnmappedCall(f"raw API request {where}: give the method and a resource path")
    method, path, sub = str(call.args[0].value), call.args[1], ""
    if isinstance(path, ast.BinOp) and isinstance(path.op, ast.Add) and isinstance(
            path.right, ast.Constant):
        path, sub = path.left, str(path.right.value).strip("/")
    if not (isinstance(path, ast.Call) and isinstance(path.func, ast.Attribute)
            and isinstance(path.func.value, ast.Name)
            and path.func.attr in ("object_path", "collection_path")):
        raise UnmappedCall(f"raw API request {where}: build its path with a Resource of "
                           "vgpud/kube/resources.py so that RBAC can be checked")
    plural = getattr(resources, path.func.value.id).plural
    kind = "binding" if sub == "binding" else path.func.attr.removesuffix("_path")
    verb = _RAW_VERBS.get((method, kind))
    if verb is None or sub not in ("", "binding", "status"):
        raise UnmappedCall(f"raw API request {where}: map it to RBAC")
    return (f"{plural}/{sub}" if sub else plural), verb


def _raw_needs(node: ast.AST) -> set[tuple[str, str]]:
    """Raw requests: ``kube.request(...)``, and ``functools.partial(kube.request, ...)``
    read as the call it makes."""
    out = set()
    for c in ast.walk(node):
        if not isinstance(c, ast.Call):
            continue
        if _called_name(c) == "request" and _on_kube(c):
            out.add(_raw_need(c))
        elif (_called_name(c) == "partial" and c.args and isinstance(c.args[0], ast.Attribute)
              and c.args[0].attr == "request"
              and _on_kube(ast.Call(func=c.args[0], args=[], keywords=[]))):
            out.add(_raw_need(ast.Call(func=c.args[0], args=c.args[1:], keywords=c.keywords)))
    return out


def _kube_classes() -> dict[str, set[str]]:
    """API methods used inside each class of vgpud/kube (PodWriter, LeaderElector, ...)."""
    out: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    for tree in _trees(sorted((VGPUD / "kube").glob("*.py"))):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out[node.name] = _api_methods(node) | {
                    f"raw:{r}:{v}" for r, v in _raw_needs(node)}
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    for name in out:  # a subclass can issue what its bases issue
        todo = list(bases[name])
        while todo:
            base = todo.pop()
            if base in out:
                out[name] |= out[base]
                todo += bases[base]
    return out


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Subscript):  # Informer[NodeInfo](...)
        f = f.value
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _on_kube(call: ast.Call) -> bool:
    """``kube.request(...)`` / ``self.kube.watch_lines(...)``: a raw call on a KubeClient."""
    f = call.func
    if not isinstance(f, ast.Attribute):
        return False
    v = f.value
    return (isinstance(v, ast.Name) and v.id == "kube") or (
        isinstance(v, ast.Attribute) and v.attr == "kube")


def api_needs(*packages: str) -> set[tuple[str, str]]:
    """(resource, verb) pairs the code of ``vgpud/<package>`` (each of them: a role and
    the packages it runs) can issue: its own calls of the generated API, the vgpud.kube
    classes it constructs, and its informers."""
    files = []
    for package in packages:
        assert (VGPUD / package).is_dir(), f"vgpud/{package}/ does not exist (yet)"
        files += [p for p in sorted((VGPUD / package).rglob("*.py")) if "_pb" not in p.parts]
    package = "+".join(packages)
    classes = _kube_classes()
    methods: set[str] = set()
    needs: set[tuple[str, str]] = set()
    for tree in _trees(files):
        methods |= _api_methods(tree)
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = _called_name(call)
            if name == "Informer":
                res = call.args[1]
                assert isinstance(res, ast.Name), "Informer resource must be a constant"
                plural = getattr(resources, res.id).plural
                needs |= {(plural, "list"), (plural, "watch")}
            elif name in classes:
                methods |= classes[name]
            elif name in ("request", "partial"):
                needs |= _raw_needs(call)
            elif name == "watch_lines" and _on_kube(call):
                raise UnmappedCall(f"raw watch in vgpud/{package}: map it to RBAC")
    raw = {m for m in methods if m.startswith("raw:")}
    return needs | {_as_rbac(m) for m in methods - raw} | {
        (m.split(":")[1], m.split(":")[2]) for m in raw}
