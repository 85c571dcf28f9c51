"""The node's own view of its GPUs and their users, independent of how kubelet is
spoken to (the device plugin in :mod:`vgpud.plugin` today; a DRA driver would be a
second adapter over the same modules).

``devices`` (the backend interface and the node's devices with their health), ``nvml``
(the NVML backend, the only importer of pynvml), ``fakegpus`` (a file of devices),
``allocations`` (per-allocation directories on disk), ``edits`` (what a container
needs from the node: env, device nodes, CDI names, mounts), ``shim`` (installing the shim
library), ``cluster`` (the Kubernetes API calls a node makes), ``inventory`` (the
``vgpud.io/node-devices`` annotation and extended resources), ``procfs`` (what the
host's ``/proc`` says of a PID), ``registration`` (processes registering with the
node), ``watchdog`` (true device memory against limits) and ``arbiter`` (the per-GPU
priority records).

Layers, enforced by import-linter (``lint-imports``, ``[tool.importlinter]`` in
pyproject.toml): ``vgpud.core`` < ``vgpud.kube`` < ``vgpud.node`` < the roles
(``vgpud.plugin``, ``vgpud.extender``, ``vgpud.webhook``), which never import each other.
"""
