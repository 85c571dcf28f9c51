"""The stand-in's refusals and the ``Status`` bodies kube-apiserver answers them with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]


class StoreError(Exception):
    """A request the stand-in refuses; rendered by the HTTP layer as a ``Status``."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = None if details is None else dict(details)


def status_body(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> Obj:
    """A ``metav1.Status`` as kube-apiserver writes it: empty ``message`` and ``reason``
    left out (``omitempty``), ``details`` only when given (an empty one too, as the
    JSON-patch refusal has it)."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
    }
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = dict(details)
    body["code"] = code
    return body


class FieldErrors:
    """``field.ErrorList``: what failed validation, rendered as ``errors.NewInvalid``."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str, str]] = []  # (cause type, field, ErrorBody)

    def invalid(self, field: str, value: object, detail: str) -> None:
        shown = value if isinstance(value, int) and not isinstance(value, bool) else (
            '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"')
        self.errors.append(("FieldValueInvalid", field, f"Invalid value: {shown}: {detail}"))

    def required(self, field: str, detail: str = "") -> None:
        body = f"Required value: {detail}" if detail else "Required value"
        self.errors.append(("FieldValueRequired", field, body))

    def raise_if_any(self, kind: str, name: str, *, group: str = "") -> None:
        if not self.errors:
            return
        messages = list(dict.fromkeys(f"{f}: {body}" for _, f, body in self.errors))
        text = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
        details: Obj = {"name": name}
        if group:
            details["group"] = group
        details["kind"] = kind
        details["causes"] = [{"reason": t, "message": body, "field": f}
                             for t, f, body in self.errors]
        raise StoreError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)
