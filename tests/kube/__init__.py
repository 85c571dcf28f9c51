"""Tests of vgpud.kube and of the API stand-in, over real HTTP with kubernetes_asyncio."""
