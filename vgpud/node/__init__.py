"""The node's own view of its GPUs' users, independent of how kubelet is spoken to.

Today: the processes of GPU containers (``procfs``: what the host's ``/proc`` says of
a PID), their registration with the plugin (``registration``: the kernel says who a
process is, the node checks it belongs to the allocation), and the watchdog that
compares each container's true device memory with its limit (``watchdog``). Layers:
``vgpud.core`` < ``vgpud.kube`` < ``vgpud.node`` < the roles; nothing here imports a
role (``vgpud.plugin``, ``vgpud.extender``).
"""
