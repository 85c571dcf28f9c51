"""A real Prometheus for the tests, and the PromQL the chart ships.

:func:`obtain_tools` finds ``prometheus`` and ``promtool`` or installs Debian's
``prometheus`` package with apt-get (root only), as ``tests/oci`` obtains runc, and
proves both run. :class:`Prometheus` runs one server on a loopback port over a config
the test writes, and answers its HTTP API (``/api/v1/query``, targets, rules, alerts).

:func:`dashboard_queries` and :func:`rule_queries` list every PromQL expression in
``helm/vgpud/dashboards/*.json`` (every target of every panel, rows included, and the
template variables' queries) and ``helm/vgpud/rules/vgpud.rules.yaml`` (each rule's
expression, and the ``query "..."`` calls in its annotations), each with where it
came from.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import yaml

from tests.debian import NotInstallable, apt_install
from tests.e2e.cluster import stop_process

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "helm" / "vgpud" / "dashboards"
RULES = ROOT / "helm" / "vgpud" / "rules" / "vgpud.rules.yaml"


class PrometheusUnavailable(RuntimeError):
    """prometheus/promtool cannot be had or cannot run here; ``str()`` says why."""


@dataclass(frozen=True)
class Tools:
    prometheus: str
    promtool: str
    version: str


def _find(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/bin", "/usr/local/bin", "/bin"):
        p = Path(d, name)
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def install_prometheus(timeout: float = 600) -> None:
    """``apt-get install prometheus`` (:func:`tests.debian.apt_install`). The package's
    own service (port 9090), where it starts one, is not what the tests use."""
    try:
        apt_install(["prometheus"], lambda: bool(_find("prometheus") and _find("promtool")),
                    timeout=timeout)
    except NotInstallable as e:
        raise PrometheusUnavailable(str(e)) from None


def obtain_tools(*, install: bool = True) -> Tools:
    """prometheus and promtool, installed when missing, each shown to run."""
    if _find("prometheus") is None or _find("promtool") is None:
        if not install:
            raise PrometheusUnavailable("prometheus/promtool are not installed")
        install_prometheus()
    prom, tool = _find("prometheus"), _find("promtool")
    if prom is None or tool is None:
        raise PrometheusUnavailable("the prometheus package did not provide prometheus and "
                                    "promtool")
    versions = []
    for exe in (prom, tool):
        r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60,
                           check=False)
        if r.returncode != 0:
            raise PrometheusUnavailable(f"{exe} --version failed: {r.stderr.strip()}")
        versions.append((r.stdout or r.stderr).splitlines()[0])
    return Tools(prom, tool, versions[0])


# -- one server ----------------------------------------------------------------------------


class Prometheus:
    """``prometheus`` on 127.0.0.1:``port`` with ``config``, its data and log in ``root``."""

    def __init__(self, tools: Tools, root: Path, config: Mapping[str, Any], port: int) -> None:
        self.tools, self.root, self.port = tools, root, port
        self.config_file = root / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(dict(config)))
        self.log_file = root / "prometheus.log"
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen(
                [self.tools.prometheus, f"--config.file={self.config_file}",
                 f"--storage.tsdb.path={self.root / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                cwd=self.root, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")[-4000:]

    async def api(self, s: aiohttp.ClientSession, path: str, **params: str) -> Any:
        """``data`` of a successful API answer; AssertionError with Prometheus's error
        otherwise."""
        async with s.get(f"{self.url}{path}", params=params) as r:
            doc = await r.json()
        assert doc.get("status") == "success", f"{path} {params}: {doc}"
        return doc["data"]

    async def query(self, s: aiohttp.ClientSession, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (a scalar becomes one sample without labels)."""
        data = await self.api(s, "/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return list(data["result"])

    async def until(self, s: aiohttp.ClientSession, what: str, check: Any,
                    within: float = 30.0) -> Any:
        """Poll ``await check(s)`` until it returns something true; fail after ``within``
        seconds naming ``what``, with the server's log."""
        deadline = time.monotonic() + within
        last: Any = None
        while True:
            assert self.proc is not None and self.proc.poll() is None, \
                f"prometheus exited:\n{self.log()}"
            with contextlib.suppress(aiohttp.ClientError):  # not listening (yet), or 503
                last = await check(s)
                if last:
                    return last
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not after {within:.0f} s (last: {last!r})\n"
                                     f"{self.log()}")
            await anyio.sleep(0.1)


# -- the chart's PromQL ---------------------------------------------------------------------

@dataclass(frozen=True)
class Query:
    where: str  # "vgpud-node.json: panel 'Memory per GPU' target B"
    expr: str
    label: str | None = None  # a template variable's query: the label it lists


LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<metric>.+),\s*)?(?P<label>\w+)\)\s*$", re.S)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])  # a row's panels


def dashboard_queries(path: Path) -> Iterator[Query]:
    board = json.loads(path.read_text())
    for p in _panels(board.get("panels") or []):
        for t in p.get("targets") or []:
            yield Query(f"{path.name}: panel {p['title']!r} target {t['refId']}", t["expr"])
    for v in board.get("templating", {}).get("list", []):
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = LABEL_VALUES.match(q)
        assert m and m["metric"], f"{path.name}: variable {v['name']}: {q!r} is not " \
                                  "label_values(<series>, <label>)"
        yield Query(f"{path.name}: variable ${v['name']}", m["metric"], m["label"])


ANNOTATION_QUERY = re.compile(r'\bquery\s+"((?:[^"\\]|\\.)*)"')
# A rule's condition: its expression compared with a constant (arithmetic of numbers).
THRESHOLD = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*[-+*/()\d.\s]+$")


def rule_queries(path: Path) -> Iterator[tuple[dict[str, Any], Query]]:
    doc = yaml.safe_load(path.read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            name = r.get("alert") or r.get("record")
            yield r, Query(f"{path.name}: {name} expr", r["expr"])
            for key, text in (r.get("annotations") or {}).items():
                for q in ANNOTATION_QUERY.findall(text):
                    yield r, Query(f"{path.name}: {name} annotation {key}",
                                   json.loads(f'"{q}"'))


def without_threshold(expr: str) -> str:
    """The series a condition compares (``x > 900`` → ``x``); ``expr`` if none."""
    return THRESHOLD.sub("", expr.strip())
