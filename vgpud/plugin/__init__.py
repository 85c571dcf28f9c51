"""The kubelet device plugin (``vgpud plugin``): one per GPU node.

It advertises replicas (``<gpu-uuid>::<i>``) of ``nvidia.com/vgpu-number`` and of each
other enabled preset's number resource to kubelet, one registration per name, steers
and checks kubelet's choice against the scheduler's assignment, writes each
container's limits file, and serves metrics.

This package is the kubelet *device-plugin adapter* only; what the node knows of its
GPUs, whoever asks (discovery and health, allocations on disk, the shim install, the
inventory annotation, registration, the watchdog, the arbiter), is :mod:`vgpud.node`.

Modules, pure first: ``resources`` (which resource names the node serves, and what one
ID of each means), ``replicas`` (device IDs, preferred choice, reconciliation),
``prestart`` (what PreStartContainer does; these three without I/O),
``podresources`` (kubelet's PodResources client), ``service`` (the gRPC DevicePlugin
servicer, one per resource), ``kubelet`` (registration and kubelet restarts),
``metrics`` and ``run`` (one task group). ``_pb`` is generated code
(``protos/generate.py``).
"""
