"""The kubelet device plugin (``vgpud plugin``): one per GPU node.

It advertises ``nvidia.com/vgpu-number`` replicas (``<gpu-uuid>::<i>``) to kubelet,
steers and checks kubelet's choice against the scheduler's assignment, writes each
container's limits file, publishes the node's inventory and serves metrics.

Modules, pure first: ``replicas`` (device IDs, preferred choice, reconciliation;
no I/O), ``devices`` (the GPU source interface), ``gpus`` (NVML, the only importer of
pynvml), ``fakegpus`` (a file of devices), ``allocations`` (the on-disk state),
``shim`` (installing the shim library), ``cluster`` (the Kubernetes API calls it
makes), ``podresources`` (kubelet's PodResources client), ``service`` (the gRPC
DevicePlugin servicer), ``kubelet`` (registration and kubelet restarts),
``inventory`` (the node annotation and extended resources), ``metrics`` and ``run``
(one task group). ``_pb`` is generated code (``protos/generate.py``).
"""
