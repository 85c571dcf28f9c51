"""The kubelet device plugin (``vgpud plugin``): one per GPU node.

It advertises replicas (``<gpu-uuid>::<i>``) of ``nvidia.com/vgpu-number`` and of each
other enabled preset's number resource to kubelet, one registration per name, steers
and checks kubelet's choice against the scheduler's assignment, writes each
container's limits file, and serves metrics.

This package is the kubelet *device-plugin adapter* only: it starts the node runtime
(:mod:`vgpud.node.runtime`: discovery and health, allocations on disk and their
housekeeping, the shim install, the inventory annotation, registration, the watchdog,
the arbiter, the metrics) and speaks kubelet's device-plugin protocol over it, translating
the node's answers. The node's decisions about a container's start
(:mod:`vgpud.node.startup`, :mod:`vgpud.node.configure`) and device IDs
(:mod:`vgpud.node.ids`) are the node's too.

Modules, pure first: ``resources`` (which resource names the node serves),
``replicas`` (what ListAndWatch advertises, the preferred choice), ``service`` (the gRPC
DevicePlugin servicer, one per resource), ``kubelet`` (registration and kubelet
restarts), ``run`` (the node runtime and the servers over it) and ``command``. ``_pb`` is
generated code (``protos/generate.py``).
"""
