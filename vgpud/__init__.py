"""vgpud: GPU sharing for Kubernetes."""
