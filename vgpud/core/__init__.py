"""The pure allocator: devices, requests, fit, scoring, the ledger, codecs.

Everything here is synchronous and free of I/O. It may import the standard
library, numpy and pydantic-free frozen dataclasses only: never anyio, aiohttp,
grpclib, kubernetes_asyncio or pynvml (``tests/core/test_purity.py`` enforces it).
Functions return decisions as values (placements, reasons, patches); the shells in
``vgpud.extender``, ``vgpud.plugin`` and ``vgpud.simulate`` carry them out.
"""
