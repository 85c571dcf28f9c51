"""The RFC 3339 forms the API server reads and writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from vgpud.kube.timestamps import parse_rfc3339, rfc3339, rfc3339_micro

WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def test_seconds_and_micro_forms() -> None:
    assert rfc3339(WHEN) == "2026-01-02T03:04:05Z"
    assert rfc3339_micro(WHEN) == "2026-01-02T03:04:05.678901Z"


def test_written_in_utc_whatever_the_zone() -> None:
    east = WHEN.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert rfc3339(east) == "2026-01-02T03:04:05Z"
    assert rfc3339_micro(east) == "2026-01-02T03:04:05.678901Z"


def test_parse_reads_both_forms_back() -> None:
    assert parse_rfc3339(rfc3339_micro(WHEN)) == WHEN
    assert parse_rfc3339(rfc3339(WHEN)) == WHEN.replace(microsecond=0)
    with pytest.raises(ValueError):
        parse_rfc3339("yesterday")
