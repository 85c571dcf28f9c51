"""vgpud's DRA driver: the ResourceSlice publisher and the kubelet plugin."""
