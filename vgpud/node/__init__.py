"""The node runtime: the node's own view of its GPUs and their users, independent of how
kubelet is spoken to (the device plugin in :mod:`vgpud.plugin` today; a DRA kubelet
plugin would be a second adapter over the same runtime).

``runtime`` (one task group that owns every task of the node, :func:`run_node`, and the
:class:`~vgpud.node.runtime.Node` an adapter is handed), ``devices`` (the backend
interface and the node's devices with their health), ``nvml`` (the NVML backend, the
only importer of pynvml), ``fakegpus`` (a file of devices), ``vendors`` (the one place
that chooses a backend), ``allocations`` (per-allocation directories on disk), ``ids``
(device IDs and their units), ``startup`` (pure decisions about a container's start),
``configure`` (a container configured from its pod's assignment), ``edits`` (what a
container needs from the node: env, device nodes, CDI names, mounts), ``shim``
(installing the shim library), ``cluster`` (the Kubernetes API calls a node makes),
``pods`` (the node's pods, watched), ``podresources`` (kubelet's PodResources client;
generated code in ``_pb``), ``inventory`` (the ``vgpud.io/node-devices`` annotation and
extended resources), ``procfs`` (what the host's ``/proc`` says of a PID),
``registration`` (processes registering with the node), ``watchdog`` (true device memory
against limits), ``arbiter`` (the per-GPU priority records), ``tenant`` and
``usage_state`` (reading the containers' usage files) and ``metrics`` (``/metrics``).

Layers, enforced by import-linter (``lint-imports``, ``[tool.importlinter]`` in
pyproject.toml): ``vgpud.core`` < ``vgpud.kube`` < ``vgpud.node`` < the roles
(``vgpud.plugin``, ``vgpud.extender``, ``vgpud.webhook``), which never import each other;
an adapter imports the runtime, never the parts it wires (the registrar, the watchdog,
the arbiter, the metrics, the usage-file reader).
"""
