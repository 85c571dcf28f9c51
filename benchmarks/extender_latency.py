"""What the benchmarks read from the extender's own latency histogram."""

from __future__ import annotations


def served(metrics: str) -> dict[str, tuple[float, float]]:
    """p50 and p99 upper bounds (ms) per verb from ``vgpud_extender_request_duration_seconds``
    in a /metrics text: time spent serving, without the client's or the machine's queueing.
    A verb never called (its series start at 0) is left out."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    for line in metrics.splitlines():
        if line.startswith("vgpud_extender_request_duration_seconds_bucket{"):
            labels, value = line.rsplit(" ", 1)
            parts = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1:-1].split(","))
            le = parts["le"].strip('"')
            buckets.setdefault(parts["verb"].strip('"'), []).append(
                (float("inf") if le == "+Inf" else float(le), float(value)))
    out = {}
    for verb, bs in buckets.items():
        bs.sort()
        total = bs[-1][1]
        if not total:
            continue

        def q(frac: float, bs: list[tuple[float, float]] = bs, total: float = total) -> float:
            return next(le for le, n in bs if n >= frac * total) * 1000

        out[verb] = (q(0.5), q(0.99))
    return out
