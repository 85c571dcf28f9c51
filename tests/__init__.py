"""vgpud's tests; a package so that helpers such as ``tests.standin`` are importable."""
