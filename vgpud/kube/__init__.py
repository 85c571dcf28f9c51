"""The Kubernetes API layer of vgpud: the only package that talks to the API server.

Imports: kubernetes_asyncio, aiohttp, anyio, structlog; never ``vgpud.core`` (the
core stays pure; callers convert between the two). Everything takes an injected
``Clock`` where time matters and runs inside the caller's task group.

- ``client``: ``KubeClient`` (configuration, request budget, error mapping).
- ``errors``: the exception tree (drawn in its docstring).
- ``budget``: ``RequestBudget``, the client-side token bucket.
- ``clock``: ``Clock`` protocol and ``SYSTEM_CLOCK``; ``backoff``: ``Backoff``.
- ``resources``: ``Resource`` descriptors (``PODS``, ``NODES``, ``EVENTS``, ``LEASES``).
- ``watch``: raw paged list and watch streams (``list_pages``, ``open_watch``).
- ``cache``: ``Informer`` — list+watch cache with projections and change events.
- ``writes``: ``PodWriter`` (annotation patch), ``PodBinder`` (+ binding), ``EventRecorder``.
- ``lease``: ``LeaderElector``.
"""
