"""The exceptions of the Kubernetes layer, mapped once at the client boundary.

Every failure that leaves ``vgpud.kube`` is a ``KubeError``; kubernetes_asyncio's
``ApiException`` and aiohttp's errors never escape. The tree::

    KubeError
    ├── ConfigError            no usable kubeconfig / in-cluster configuration
    ├── ApiError               the API server answered with a failure (status, reason)
    │   ├── BadRequest         400
    │   ├── Unauthorized       401
    │   ├── Forbidden          403
    │   ├── NotFound           404
    │   ├── Conflict           409 stale resourceVersion, already bound, ...
    │   │   └── AlreadyExists  409 with reason AlreadyExists (create of an existing name)
    │   ├── Gone               410 resourceVersion or continue token too old: re-list
    │   ├── Invalid            422
    │   ├── TooManyRequests    429 (also an Unavailable; carries retry_after)
    │   └── ServerError        5xx (also an Unavailable)
    └── Unavailable            transient: retrying after a backoff may succeed
        ├── TooManyRequests    (see above)
        ├── ServerError        (see above)
        └── ConnectionFailed   no answer at all: refused, reset, timed out

``error_for_status`` builds the right class from an HTTP status and a ``Status``
body; ``from_api_exception`` converts kubernetes_asyncio's exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class KubeError(Exception):
    """Base of every error raised by ``vgpud.kube``."""


class ConfigError(KubeError):
    """No configuration to reach the API server could be loaded."""


class Unavailable(KubeError):
    """The API server could not serve the request now; retrying later may work."""


class ApiError(KubeError):
    """The API server answered with a failure ``Status``."""

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        *,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}
        self.retry_after = retry_after
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")


class BadRequest(ApiError):
    """400: the request was malformed."""


class Unauthorized(ApiError):
    """401: the credentials were refused."""


class Forbidden(ApiError):
    """403: RBAC does not allow this request."""


class NotFound(ApiError):
    """404: the object (or resource) does not exist."""


class Conflict(ApiError):
    """409: a precondition failed (stale resourceVersion, pod already bound, ...)."""


class AlreadyExists(Conflict):
    """409 AlreadyExists: an object of that name exists."""


class Gone(ApiError):
    """410: the resourceVersion or continue token is too old; re-list."""


class Invalid(ApiError):
    """422: the object failed validation (or a JSON-patch ``test`` failed)."""


class TooManyRequests(ApiError, Unavailable):
    """429: the server throttled us; ``retry_after`` seconds if it said."""


class ServerError(ApiError, Unavailable):
    """5xx: the server failed; usually transient."""


class ConnectionFailed(Unavailable):
    """No HTTP answer: connection refused or reset, or the request timed out."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_for_status(
    status: int,
    body: bytes | str | Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    """The ``ApiError`` subclass for an HTTP status and its (``Status``) body."""
    parsed: Mapping[str, Any] = {}
    if isinstance(body, Mapping):
        parsed = body
    elif body:
        try:
            loaded = json.loads(body)
        except ValueError:
            loaded = None
        if isinstance(loaded, Mapping):
            parsed = loaded
        else:
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
            parsed = {"message": text[:500]}
    reason = str(parsed.get("reason") or "")
    message = str(parsed.get("message") or "")
    details = parsed.get("details") if isinstance(parsed.get("details"), Mapping) else None
    retry_after: float | None = None
    if headers is not None:
        raw_retry = headers.get("Retry-After")
        if raw_retry:
            try:
                retry_after = float(raw_retry)
            except ValueError:
                retry_after = None
    cls: type[ApiError]
    if status == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    elif status >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(status, ApiError)
    return cls(status, reason, message, details=details, retry_after=retry_after)


def from_api_exception(exc: Any) -> KubeError:
    """Convert a kubernetes_asyncio ``ApiException``."""
    status = int(getattr(exc, "status", 0) or 0)
    if status == 0:
        return ConnectionFailed(str(getattr(exc, "reason", exc)))
    body = getattr(exc, "body", None)
    headers = getattr(exc, "headers", None)
    error = error_for_status(status, body, headers)
    if not error.message and not error.reason:
        error = type(error)(status, str(getattr(exc, "reason", "") or ""), "")
    return error
