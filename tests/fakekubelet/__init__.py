"""A fake kubelet for the device plugin's tests, built with grpcio from the official
kubelet protos (a different gRPC implementation than the plugin's grpclib).

It serves ``Registration`` on ``<dir>/kubelet.sock`` and ``PodResourcesLister`` on
its own socket, and drives the registered plugins the way kubelet 1.37's device manager
does: ListAndWatch, GetPreferredAllocation and Allocate at admission (with the reuse of
init containers' devices), PreStartContainer at each container start. What it imitates,
with the kubelet source it follows and its deliberate differences:
:mod:`tests.fakekubelet.kubelet`; checked against the real kubelet by
``tests/realkube/test_fakekubelet_agrees.py``.
"""

from tests.fakekubelet.kubelet import AdmitError, Call, FakeKubelet, FakePod

__all__ = ["AdmitError", "Call", "FakeKubelet", "FakePod"]
