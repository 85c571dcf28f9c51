"""Generated kubelet gRPC bindings (betterproto2 + grpclib). Do not edit: run
``python protos/generate.py``."""
