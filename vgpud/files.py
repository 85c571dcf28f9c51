"""Reading a small file someone gave us (a setting, a scenario, a token), with the error
its reader raises.

``read_bounded`` reads at most ``limit`` bytes and raises the caller's own error type
(``ConfigError``, ``ScenarioError``, ``FakeDevicesError``) when the file cannot be read
or is larger than that, with one wording: ``cannot read <what>: <why>`` and
``<what> is larger than <limit> bytes``. Parsing what was read stays with each reader.
"""

from __future__ import annotations

import os
from pathlib import Path


def read_bounded(path: str | os.PathLike[str], what: str, *, limit: int,
                 error: type[Exception]) -> bytes:
    """The bytes of ``path``; ``error`` if it cannot be read or holds more than ``limit``.
    ``what`` names the file in the message (``f"config file {path}"``)."""
    try:
        with Path(path).open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read {what}: {e.strerror or e}") from e
    if len(data) > limit:
        raise error(f"{what} is larger than {limit} bytes")
    return data
