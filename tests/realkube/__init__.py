"""Tests against the real Kubernetes components (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kubelet), built from the official Go modules by ``build.py``.

They are skipped with the reason where Go cannot build them (``VGPUD_REALKUBE_REQUIRED=1``
turns that skip into a failure, as CI sets it)."""
