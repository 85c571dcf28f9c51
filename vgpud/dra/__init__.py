"""The DRA kubelet plugin (``vgpud dra``): the second adapter over the node runtime.

On a node whose ``vgpud.io/node-mode`` label says ``dra``, kubelet's DRA manager calls
this plugin instead of the device plugin: it registers through kubelet's plugin watcher
(``pluginregistration/v1``, a socket in ``<root-dir>/plugins_registry``) and serves
``dra/v1`` and ``dra/v1beta1`` ``NodePrepareResources`` / ``NodeUnprepareResources`` on its
own socket under ``<root-dir>/plugins/<driver>/``. Preparing a claim turns its allocation's
consumed capacity (memory, cores) into the same limits file and the same shim the device
plugin gives a container, injected through a CDI spec vgpud writes.

Modules, pure decisions in :mod:`vgpud.core.claims` first: ``cdi`` (the CDI spec of one
prepared claim), ``prepare`` (prepare and unprepare over the node's allocation store, and
their checkpoint), ``service`` (the two gRPC servicers), ``kubelet`` (the registration
socket and the plugin socket), ``run`` (the node runtime with this adapter over it) and
``command``; ``publisher`` keeps this node's ResourceSlices (:mod:`vgpud.core.slices`) in
the API while the plugin is registered. ``_pb`` is generated code (``protos/generate.py``).
"""
