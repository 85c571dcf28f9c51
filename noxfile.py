"""Developer sessions: ``nox -s lint typecheck tests`` (CI runs the same via .ci/run)."""

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "vgpud", "tests", "benchmarks")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


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
def bench(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    for script in ("benchmarks/allocate.py",):
        session.run("python", script, *session.posargs)
