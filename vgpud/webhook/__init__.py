"""``vgpud webhook``: the admission webhook (HTTPS, ``AdmissionReview`` v1).

The decisions are :mod:`vgpud.core.admission`'s; this package reads reviews off the
wire (:mod:`.wire`), serves them (:mod:`.server`), keeps the serving certificate
fresh (:mod:`.tls`, :mod:`.bootstrap`) and knows the cluster's GPUs from the node
inventory annotations (:mod:`.run`).
"""
