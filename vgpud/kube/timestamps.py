"""RFC 3339 timestamps as the Kubernetes API writes them, both ways.

The API has two forms: ``Time`` in whole seconds (``2026-01-02T03:04:05Z``: events,
the status page, placements) and ``MicroTime`` with six fraction digits
(``2026-01-02T03:04:05.678901Z``: a Lease's ``renewTime``, which the API server refuses
in the seconds form). Both are written in UTC whatever zone ``when`` carries. Here, not
in the core, because this is the API's format (the kube layer never imports the core); the
roles use it for what they write (placements, the status page) too.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(when: datetime) -> str:
    """``when`` as an API ``Time``: UTC, whole seconds, ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(when: datetime) -> str:
    """``when`` as an API ``MicroTime``: UTC, microseconds, ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    """A timestamp the API wrote (either form); ``ValueError`` if it is not one."""
    return datetime.fromisoformat(text)
