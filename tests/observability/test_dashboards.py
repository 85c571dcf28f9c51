"""The dashboards and alert rules as files: what Grafana and the Prometheus Operator need
of them, and that every metric they name is documented. (test_prometheus.py evaluates
them against running daemons.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.observability.prometheus import (
    DASHBOARDS,
    ROOT,
    RULES,
    _panels,
    dashboard_queries,
    rule_queries,
    without_threshold,
)

BOARDS = sorted(DASHBOARDS.glob("*.json"))
DOCS = (ROOT / "docs" / "metrics.md").read_text()
METRIC = re.compile(r"\bvgpud_[a-z_]+\b")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_the_four_dashboards_are_there() -> None:
    titles = {json.loads(b.read_text())["uid"] for b in BOARDS}
    assert titles == {"vgpud-cluster", "vgpud-node", "vgpud-pod", "vgpud-scheduler"}


@pytest.mark.parametrize("board", BOARDS, ids=lambda p: p.stem)
def test_a_dashboard_takes_its_data_source_as_a_variable(board: Path) -> None:
    doc = json.loads(board.read_text())
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE, v["name"]
    panels = list(_panels(doc["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"] and p.get("description"), p["title"]
        for t in p["targets"]:
            assert t.get("datasource", DATASOURCE) == DATASOURCE, p["title"]
    # every variable a query uses is defined (or one of Grafana's own)
    used = {name for q in dashboard_queries(board)
            for name in re.findall(r"\$\{?(\w+)", q.expr)}
    assert used <= set(variables) | {"__rate_interval", "__interval", "__range"}


def test_every_metric_named_by_a_dashboard_or_rule_is_documented() -> None:
    exprs = [q.expr for b in BOARDS for q in dashboard_queries(b)]
    exprs += [q.expr for _, q in rule_queries(RULES)]
    names = {m for e in exprs for m in METRIC.findall(e)}
    assert names
    documented = set(METRIC.findall(DOCS))
    base = {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
    assert base - documented == set()


def test_alert_rules_have_what_alertmanager_routes_and_people_read() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == {"VgpudGpuUnhealthy", "VgpudContainerOverLimit",
                                            "VgpudContainerOverSmLimit",
                                            "VgpudExtenderErrors", "VgpudGpuPodPending"}
    for a in alerts:
        assert a["labels"]["severity"] in ("warning", "critical"), a["alert"]
        assert a["annotations"]["summary"] and a["annotations"]["description"], a["alert"]
        # each alert is a condition on series the evaluation test can check exist
        assert without_threshold(a["expr"]) != a["expr"].strip(), a["alert"]
