"""The Kubernetes API layer of vgpud: the only package that talks to the API server.

Imports: kubernetes_asyncio, aiohttp, anyio, structlog; never ``vgpud.core`` (the
core stays pure; callers convert between the two). Everything takes an injected
``Clock`` where time matters and runs inside the caller's task group.

- ``client``: ``KubeClient`` (configuration, request budget, error mapping).
- ``errors``: the exception tree (drawn in its docstring).
- ``budget``: ``RequestBudget``, the client-side token bucket.
- ``clock``: ``Clock`` protocol and ``SYSTEM_CLOCK``, vgpud's one clock; ``backoff``:
  ``Backoff``, its one backoff.
- ``timestamps``: RFC 3339 as the API writes it (``Time``, ``MicroTime``) and reads it.
- ``resources``: ``Resource`` descriptors (``PODS``, ``NODES``, ``EVENTS``, ``LEASES``).
- ``watch``: raw paged list and watch streams (``list_pages``, ``open_watch``).
- ``cache``: ``Informer`` — a cache with projections and change events, synced by a
  streaming list (``sendInitialEvents``) where the server offers one, else a paged list,
  then a watch.
- ``writes``: ``PodWriter`` (annotation patch), ``PodBinder`` (the Binding, which carries
  the assignment annotations: one write), ``EventRecorder``.
- ``lease``: ``LeaderElector``.
- ``lazyclient``: kubernetes_asyncio's client package, loaded on first use.
"""

from vgpud.kube.lazyclient import install as _lazy_client

# Before any module of this package imports kubernetes_asyncio: its client package
# then loads the API classes it is asked for, not all ~750 generated models (about
# 30 MiB per process; see lazyclient).
_lazy_client()
