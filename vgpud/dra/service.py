"""The gRPC servicers kubelet calls: plugin registration, and DRA ``v1`` and ``v1beta1``.

:class:`RegistrationService` answers kubelet's plugin watcher (``pluginregistration/v1``):
``GetInfo`` says what the socket in ``plugins_registry`` is (type ``DRAPlugin``, the driver's
name, the endpoint of the DRA service, and the gRPC services it serves, newest first:
kubelet 1.37 takes the first of ``v1.DRAPlugin``, ``v1beta1.DRAPlugin`` it knows), and
``NotifyRegistrationStatus`` tells whether kubelet accepted it (:attr:`registered` is set
then).

:class:`DraService` (v1) and :class:`DraServiceV1beta1` translate
``NodePrepareResources`` and ``NodeUnprepareResources`` to :class:`~vgpud.dra.prepare.Preparer`
and back, one answer per claim: a claim that fails gets its message in ``error`` and
never stops the others; the call as a whole fails only when its request is malformed.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import structlog

from vgpud.dra._pb import pluginregistration as reg
from vgpud.dra._pb.k8s.io.kubelet.pkg.apis.dra import v1, v1beta1
from vgpud.dra.prepare import ClaimRef, Prepared, PrepareFailed, Preparer

log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants.go
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # dra/v1 and dra/v1beta1 DRAPluginService


class RegistrationService(reg.RegistrationBase):
    def __init__(self, driver: str, endpoint: str,
                 services: Sequence[str] = SERVICES) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.services = tuple(services)
        self.registered = anyio.Event()
        self.error = ""

    async def get_info(self, message: reg.InfoRequest) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                              supported_versions=list(self.services))

    async def notify_registration_status(
        self, message: reg.RegistrationStatus
    ) -> reg.RegistrationStatusResponse:
        if message.plugin_registered:
            log.info("dra_registered", driver=self.driver, endpoint=self.endpoint)
            self.error = ""
            self.registered.set()
        else:
            self.error = message.error
            log.error("dra_registration_refused", driver=self.driver, error=message.error)
        return reg.RegistrationStatusResponse()


async def _prepare_one(preparer: Preparer, ref: ClaimRef) -> Prepared | str:
    try:
        return await preparer.prepare(ref)
    except PrepareFailed as e:
        log.warning("dra_prepare_failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                    error=str(e))
        return str(e)
    except Exception as e:  # one claim's surprise is its own error, never the node's crash
        log.exception("dra_prepare_crashed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
        return f"{ref.where}: internal error preparing it: {type(e).__name__}: {e}"


async def _unprepare_one(preparer: Preparer, ref: ClaimRef) -> str:
    try:
        await preparer.unprepare(ref)
    except PrepareFailed as e:
        log.warning("dra_unprepare_failed", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                    error=str(e))
        return str(e)
    except Exception as e:
        log.exception("dra_unprepare_crashed", claim=f"{ref.namespace}/{ref.name}",
                      uid=ref.uid)
        return f"{ref.where}: internal error unpreparing it: {type(e).__name__}: {e}"
    return ""


def _ref(c: v1.Claim | v1beta1.Claim) -> ClaimRef:
    return ClaimRef(c.namespace, c.name, c.uid)


class DraService(v1.DraPluginBase):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def node_prepare_resources(
        self, message: v1.NodePrepareResourcesRequest
    ) -> v1.NodePrepareResourcesResponse:
        out = v1.NodePrepareResourcesResponse()
        for c in message.claims:
            got = await _prepare_one(self.preparer, _ref(c))
            out.claims[c.uid] = (v1.NodePrepareResourceResponse(error=got)
                                 if isinstance(got, str) else v1.NodePrepareResourceResponse(
                devices=[v1.Device(request_names=list(d.requests), pool_name=d.pool,
                                   device_name=d.device, cdi_device_ids=list(d.cdi_ids),
                                   share_id=d.share_id) for d in got.devices]))
        return out

    async def node_unprepare_resources(
        self, message: v1.NodeUnprepareResourcesRequest
    ) -> v1.NodeUnprepareResourcesResponse:
        out = v1.NodeUnprepareResourcesResponse()
        for c in message.claims:
            out.claims[c.uid] = v1.NodeUnprepareResourceResponse(
                error=await _unprepare_one(self.preparer, _ref(c)))
        return out


class DraServiceV1beta1(v1beta1.DraPluginBase):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (no shareID on the wire)."""

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def node_prepare_resources(
        self, message: v1beta1.NodePrepareResourcesRequest
    ) -> v1beta1.NodePrepareResourcesResponse:
        out = v1beta1.NodePrepareResourcesResponse()
        for c in message.claims:
            got = await _prepare_one(self.preparer, _ref(c))
            out.claims[c.uid] = (v1beta1.NodePrepareResourceResponse(error=got)
                                 if isinstance(got, str)
                                 else v1beta1.NodePrepareResourceResponse(devices=[
                                     v1beta1.Device(request_names=list(d.requests),
                                                    pool_name=d.pool, device_name=d.device,
                                                    cdi_device_ids=list(d.cdi_ids))
                                     for d in got.devices]))
        return out

    async def node_unprepare_resources(
        self, message: v1beta1.NodeUnprepareResourcesRequest
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        out = v1beta1.NodeUnprepareResourcesResponse()
        for c in message.claims:
            out.claims[c.uid] = v1beta1.NodeUnprepareResourceResponse(
                error=await _unprepare_one(self.preparer, _ref(c)))
        return out
