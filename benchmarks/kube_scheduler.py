"""What the benchmarks take from kube-scheduler: how many candidate nodes it sends."""

from __future__ import annotations


def feasible_to_find(n: int, percentage: int = 0) -> int:
    """kube-scheduler's numFeasibleNodesToFind: how many names reach the extender.

    Below 100 nodes, all; otherwise percentageOfNodesToScore, whose default (0) is
    adaptive, 50 % minus 1 % per 125 nodes, at least 5 %; never fewer than 100 nodes.
    """
    if n < 100 or percentage >= 100:
        return n
    if percentage <= 0:
        percentage = max(5, 50 - n // 125)
    return max(100, n * percentage // 100)
