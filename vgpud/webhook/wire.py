"""``AdmissionReview`` (``admission.k8s.io/v1``) in and out, as the API server sends it.

:func:`parse_review` turns a body into a :class:`Review` or raises :class:`WireError`
with what was wrong, whatever the body holds (not JSON, not UTF-8, nested past
:data:`vgpud.core.codec.MAX_DEPTH`: :func:`vgpud.core.codec.load_json` decodes it); the
server answers it with a 400, and the API server then applies the webhook's
``failurePolicy``. :func:`answer` builds the response review: the
request's ``uid``, ``allowed``, a ``status`` with the denial message, a base64
JSON patch and warnings.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpud.core.admission import Verdict
from vgpud.core.codec import CodecError, load_json
from vgpud.core.patch import PatchOp

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MAX_WARNING = 256  # the API server truncates longer warnings; keep ours whole


class WireError(ValueError):
    """A body that is not an ``AdmissionReview`` v1 request; ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class Review:
    uid: str
    operation: str
    group: str
    kind: str
    namespace: str
    obj: Mapping[str, Any] | None
    dry_run: bool = False  # the API server persists nothing: side effects are skipped

    @property
    def is_pod_create(self) -> bool:
        return self.group == "" and self.kind == "Pod" and self.operation == "CREATE"


def parse_review(raw: bytes) -> Review:
    try:
        doc = load_json(raw, "the body")
    except CodecError as e:
        raise WireError(str(e)) from None
    if not isinstance(doc, dict):
        raise WireError("the body is not a JSON object")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise WireError(f"expected apiVersion {API_VERSION} kind {KIND}, got "
                        f"{doc.get('apiVersion')!r} {doc.get('kind')!r} (set "
                        "admissionReviewVersions: [v1] on the webhook configuration)")
    req = doc.get("request")
    if not isinstance(req, dict):
        raise WireError("request is missing or not an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise WireError("request.uid is missing")
    kind = req.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str):
        raise WireError("request.kind is missing or not a GroupVersionKind")
    operation = req.get("operation")
    if not isinstance(operation, str):
        raise WireError("request.operation is missing")
    obj = req.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise WireError("request.object is not an object")
    review = Review(uid=uid, operation=operation, group=str(kind.get("group") or ""),
                    kind=kind["kind"], namespace=str(req.get("namespace") or ""), obj=obj,
                    dry_run=req.get("dryRun") is True)
    if review.is_pod_create and obj is None:
        raise WireError("request.object is null for a Pod CREATE")
    return review


def answer(uid: str, verdict: Verdict, patch: Sequence[PatchOp] = ()) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": verdict.message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(
            json.dumps(list(patch), separators=(",", ":")).encode()).decode()
    if verdict.warnings:
        response["warnings"] = [w[:MAX_WARNING] for w in verdict.warnings]
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
