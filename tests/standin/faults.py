"""Fault injection and request accounting for the API stand-in.

A ``FaultRule`` matches requests by ``verb`` (Kubernetes verbs: ``get``, ``list``,
``watch``, ``create``, ``update``, ``patch``, ``delete``) and ``resource`` (the
counter name: ``pods``, ``pods/binding``, ``pods/status``, ``nodes``, ``events``,
``events.events.k8s.io``, ``leases``…); ``"*"`` matches anything. A matching
request first waits ``latency`` seconds, then, if ``status`` is set, fails with that
HTTP status and a proper ``Status`` body (``429`` carries ``Retry-After``). A rule
fires for the next ``times`` matching requests (``None``: forever), each with
probability ``fraction`` (seeded, so runs repeat). With ``after`` the request is
carried out first and only its answer replaced by the failure: a lost response
(not for watches, which just fail).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def reason_for(code: int) -> str:
    return _REASONS.get(code, "InternalError" if code >= 500 else "BadRequest")


@dataclass
class FaultRule:
    verb: str = "*"
    resource: str = "*"
    status: int | None = None
    times: int | None = None
    fraction: float = 1.0
    latency: float = 0.0
    message: str = "injected fault"
    retry_after: int = 1
    after: bool = False  # carry the request out, then answer with the failure
    hits: int = field(default=0, init=False)

    def matches(self, verb: str, resource: str) -> bool:
        return self.verb in ("*", verb) and self.resource in ("*", resource)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FaultRule:
        known = {
            "verb": str,
            "resource": str,
            "status": int,
            "times": int,
            "fraction": float,
            "latency": float,
            "message": str,
            "retryAfter": int,
            "after": bool,
        }
        unknown = set(data) - set(known)
        if unknown:
            raise ValueError(f"unknown fault rule fields: {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, typ in known.items():
            if data.get(key) is not None:
                kwargs["retry_after" if key == "retryAfter" else key] = typ(data[key])
        return cls(**kwargs)


@dataclass(frozen=True)
class Decision:
    latency: float
    rule: FaultRule | None  # the rule whose status to answer with, if any


class Faults:
    """The active fault rules, in the order added; the first failing match wins."""

    def __init__(self, seed: int = 0) -> None:
        self.rules: list[FaultRule] = []
        self._random = random.Random(seed)

    def add(self, rule: FaultRule) -> FaultRule:
        if rule.status is not None and not 400 <= rule.status <= 599:
            raise ValueError(f"fault status must be an HTTP error code, got {rule.status}")
        if not 0.0 <= rule.fraction <= 1.0:
            raise ValueError(f"fault fraction must be within [0, 1], got {rule.fraction}")
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def decide(self, verb: str, resource: str) -> Decision:
        latency = 0.0
        failing: FaultRule | None = None
        for rule in list(self.rules):
            if not rule.matches(verb, resource):
                continue
            if rule.fraction < 1.0 and self._random.random() >= rule.fraction:
                continue
            if rule.status is not None and failing is not None:
                continue
            rule.hits += 1
            latency += rule.latency
            if rule.status is not None:
                failing = rule
            if rule.times is not None and rule.hits >= rule.times:
                self.rules.remove(rule)
        return Decision(latency, failing)


class RequestCounter(Counter[tuple[str, str]]):
    """Requests seen, keyed by ``(verb, resource)``."""

    def as_json(self) -> dict[str, int]:
        return {f"{verb} {resource}": n for (verb, resource), n in sorted(self.items())}
