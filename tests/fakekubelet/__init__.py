"""A fake kubelet for the device plugin's tests, built with grpcio from the official
kubelet protos (a different gRPC implementation than the plugin's grpclib).

It serves ``Registration`` on ``<dir>/kubelet.sock`` and ``PodResourcesLister`` on
its own socket, and drives the registered plugins (one per resource name) the way
kubelet's device manager does: ListAndWatch, GetPreferredAllocation, Allocate at
admission, PreStartContainer at container start. See :mod:`tests.fakekubelet.kubelet`.
"""

from tests.fakekubelet.kubelet import AdmitError, FakeKubelet, FakePod

__all__ = ["AdmitError", "FakeKubelet", "FakePod"]
