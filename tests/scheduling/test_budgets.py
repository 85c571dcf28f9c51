"""PodDisruptionBudgets as the scheduler reads them from the API (policy/v1)."""

from __future__ import annotations

from typing import Any

from vgpud.scheduling.projections import project_budget


def pdb(selector: Any = None, *, allowed: int = 0, **spec: Any) -> dict[str, Any]:
    if selector is not None:
        spec["selector"] = selector
    return {"metadata": {"namespace": "team", "name": "b"}, "spec": spec,
            "status": {"disruptionsAllowed": allowed, "disruptedPods": {"gone": "t"}}}


def test_an_empty_selector_selects_every_pod_of_its_namespace() -> None:
    b = project_budget(pdb({}, minAvailable=1))
    assert b.selects("team", "a", {"app": "x"}) and b.selects("team", "bare", {})
    assert not b.selects("other", "a", {"app": "x"})
    assert not b.selects("team", "gone", {})  # already counted by the API


def test_a_missing_or_unreadable_selector_selects_nothing() -> None:
    assert not project_budget(pdb(None)).selects("team", "a", {"app": "x"})
    bad = {"matchExpressions": [{"key": "app", "operator": "Near", "values": ["x"]}]}
    assert not project_budget(pdb(bad)).selects("team", "a", {"app": "x"})


def test_labels_and_expressions_select_as_the_api_defines() -> None:
    b = project_budget(pdb({"matchLabels": {"app": "db"},
                            "matchExpressions": [{"key": "canary",
                                                  "operator": "DoesNotExist"}]}, allowed=2))
    assert b.disruptions_allowed == 2
    assert b.selects("team", "a", {"app": "db"})
    assert not b.selects("team", "a", {"app": "db", "canary": "1"})
    assert not b.selects("team", "a", {})
