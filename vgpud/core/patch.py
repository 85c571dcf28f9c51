"""RFC 6902 JSON-patch operations and RFC 6901 pointers, as admission writes them."""

from __future__ import annotations

from typing import Any

PatchOp = dict[str, Any]


def pointer(*parts: object) -> str:
    """An RFC 6901 JSON pointer (``/`` and ``~`` in resource names escaped)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
