"""nox sessions for zebra. They run in the current environment (no virtualenv, so torch is not downloaded
again): install once with `pip install torch==2.13.0 && pip install -e '.[dev]'`, then `nox` (lint + tests),
`nox -s gpu` on a GPU machine, `nox -s bench`."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]

# The README's test command: the whole suite on one xdist worker per core (tests/conftest.py groups them); `gpu`
# tests skip themselves without a GPU, `infra` tests without dockerd/slurmd (.ci/run starts them and makes their
# absence a failure).
TEST_COMMAND = ("python3", "-m", "pytest", "-q", "-n", "auto", "--dist", "loadgroup")


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The CPU test suite (extra arguments go to pytest: `nox -s tests -- tests/recipes -x`)."""
    session.run(*TEST_COMMAND, *session.posargs)


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff lint and format check, and the import layers (all configured in pyproject.toml)."""
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", env={"PYTHONPATH": "src:kernels"})  # grimp misses editable hooks


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """Only the `gpu`-marked tests: run it on a CUDA/ROCm machine."""
    session.run(*TEST_COMMAND, "-m", "gpu", *session.posargs)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """The `zebra bench` measurements that run anywhere; their figures go to docs/benchmarks.md."""
    session.run("zebra", "bench", "startup", *session.posargs)
