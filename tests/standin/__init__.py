"""A stand-in Kubernetes API server for vgpud's tests (there is no real one here).

``ApiServer`` serves nodes, pods (+binding, +status), events, configmaps and leases
over real HTTP with list/watch/patch semantics close to the real server (streaming
lists too, with ``watch_list=True``), plus fault injection. Run it in-process
(``async with ApiServer() as api: api.url``) or as a process
(``python -m tests.standin --port N [--state FILE] [--watch-list]``). See
``apiserver.py``; tests/realkube/test_standin_agrees.py runs the same checks on it and
on kube-apiserver 1.37.2.
"""

from tests.standin.apiserver import ApiServer
from tests.standin.faults import FaultRule

__all__ = ["ApiServer", "FaultRule"]
