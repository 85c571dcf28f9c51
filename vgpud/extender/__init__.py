"""The kube-scheduler extender (``vgpud scheduler``): filter, prioritize, bind, preempt.

The kube-scheduler adapter over the scheduler service (:mod:`vgpud.scheduling`: the
projections, the ledger's rebuild, the informers, the rescheduler, the status views).
Imports: ``vgpud.scheduling``, ``vgpud.core`` (decisions), ``vgpud.kube`` (I/O), aiohttp
(HTTP), prometheus-client. ``wire`` parses and renders kube-scheduler's extender v1
JSON, ``routes`` maps a request to core decisions and back, ``server`` serves them
(``status``: the status page's rendering and routes), ``metrics`` counts them, ``run``
wires one task group.
"""
