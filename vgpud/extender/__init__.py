"""The kube-scheduler extender (``vgpud scheduler``): filter, prioritize, bind.

Imports: ``vgpud.core`` (decisions), ``vgpud.kube`` (I/O), aiohttp (HTTP),
prometheus-client. ``wire`` parses and renders kube-scheduler's extender v1 JSON,
``state`` keeps the allocator in step with the API, ``routes`` maps a request to
core decisions and back, ``server`` serves them, ``run`` wires one task group.
"""
