"""The kubelet device plugin (``vgpud plugin``): one per GPU node.

It advertises replicas (``<gpu-uuid>::<i>``) of ``nvidia.com/vgpu-number`` and of each
other enabled preset's number resource to kubelet, one registration per name, steers
and checks kubelet's choice against the scheduler's assignment, writes each
container's limits file, publishes the node's inventory and serves metrics.

Modules, pure first: ``resources`` (which resource names the node serves, and what one
ID of each means), ``replicas`` (device IDs, preferred choice, reconciliation),
``prestart`` (what PreStartContainer does; these three without I/O), ``devices`` (the
GPU source interface), ``gpus`` (NVML, the only importer of pynvml), ``fakegpus`` (a
file of devices), ``allocations`` (the on-disk state), ``shim`` (installing the shim
library), ``cluster`` (the Kubernetes API calls it makes), ``podresources`` (kubelet's
PodResources client), ``service`` (the gRPC DevicePlugin servicer, one per resource),
``kubelet`` (registration and kubelet restarts), ``inventory`` (the node annotation and
extended resources), ``metrics`` and ``run`` (one task group). ``_pb`` is generated code
(``protos/generate.py``).
"""
