"""The scheduler service: what any scheduler adapter of vgpud runs on, role-neutral.

It sits between :mod:`vgpud.kube` and its users (the kube-scheduler extender,
:mod:`vgpud.extender`; ``vgpud inspect``, :mod:`vgpud.inspection`; a Volcano adapter
would be another) and imports neither them nor :mod:`vgpud.node` (``lint-imports``,
``[tool.importlinter]`` in pyproject.toml):

* ``projections``: the API's objects as the scheduler keeps them: ``PodInfo``, the one
  pod projection (the assignment is decoded there, once per pod event), ``NodeInfo``,
  PodDisruptionBudgets, and the views preemption derives from them;
* ``state``: ``SchedulerState``, the ledger kept in step with the API by informer
  events, and ``rebuild`` from one list (``vgpud inspect``);
* ``informers``: the four informers, wired to the state;
* ``reschedule``: what to do with a pod kubelet refused (``Planner``, pure);
  ``rescheduler``: the controller that carries it out against the API;
* ``views``: the rows and totals the status page and its JSON API show;
* ``service``: ``SchedulerService``, all of it as one process runs it (the informers,
  the ledger's expiry, the rescheduler), for an adapter to start beside its wire.
"""
