"""Python and package checks: the interpreter, torch's build, and the versions zebra was tested with.

Supported ranges come from zebra's own distribution metadata (pyproject.toml), and for transformers from
FLA's, so there is one source of truth. Versions are read with importlib.metadata: nothing heavy is imported.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from zebra.doctor.check import Check, fail, ok, warn

MIN_PYTHON = (3, 11)
TORCH_INSTALL = "pip install torch==2.13.0"
TORCH_PICKER = "https://pytorch.org/get-started/locally/"


@dataclass(frozen=True)
class Package:
    """A package the doctor reports on.

    Args:
        name: the check's name (`fla`, `lm-eval`, ...).
        dists: distribution names to look for, first match wins (Triton ships under several).
        required: a missing required package fails; a missing optional one warns.
        fix: the command that installs it (the supported range is appended when known).
        why: what it is for, shown when it is missing.
    """

    name: str
    dists: tuple[str, ...]
    required: bool
    fix: str
    why: str


PACKAGES = (
    Package("transformers", ("transformers",), True, "pip install", "model classes and tokenizers"),
    Package("megatron-core", ("megatron-core",), True, "pip install", "the indexed dataset format"),
    Package(
        "fla",
        ("flash-linear-attention",),
        False,
        "pip install 'flash-linear-attention==0.6.0' 'fla-core[cpu]==0.6.0'   # on GPUs: "
        "pip install 'flash-linear-attention[cuda]==0.6.0'",
        "the Triton GDN/KDA kernels and `zebra convert --to fla`",
    ),
    Package(
        "triton",
        ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-rocm"),
        False,
        "pip install 'triton>=3.7.1'",
        "FLA's kernels (and building FLA's model classes)",
    ),
    Package(
        "mamba-ssm",
        ("mamba-ssm",),
        False,
        "pip install wheel && MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip install "
        "--no-build-isolation 'zebra-llama[mamba]'   # pure Python + Triton, no nvcc needed",
        "the Mamba2 scan that kernel_backend auto runs on GPUs, about 4% faster in Mamba2 hybrids; "
        "FLA's scan and the torch kernels run without it",
    ),
    Package(
        "torchao",
        ("torchao",),
        False,
        "pip install 'zebra-llama[fp8]'",
        "train.fp8, float8 training: the 1B recipes 9-18% faster on an H100",
    ),
    Package("lm-eval", ("lm-eval",), False, "pip install", "`zebra eval` benchmarks"),
)


def installed(dists: Sequence[str]) -> tuple[str, str] | None:
    """(distribution, version) of the first of `dists` that is installed, else None."""
    for dist in dists:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def declared_spec(dist: str, by: str = "zebra-llama") -> str | None:
    """The version specifier that distribution `by` declares for `dist` (any extra), e.g. '<6,>=5.6.2'."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        requires = metadata.requires(by) or []
    except metadata.PackageNotFoundError:
        return None
    want = canonicalize_name(dist)
    for line in requires:
        req = Requirement(line)
        if canonicalize_name(req.name) == want and req.specifier:
            return str(req.specifier)
    return None


def in_spec(version: str, spec: str) -> bool:
    """True when `version` satisfies `spec` (pre-releases and local tags like +cpu allowed)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _pretty(spec: str) -> str:
    """'<6,>=5.6.2' -> '>=5.6.2,<6' (lower bound first)."""
    return ",".join(sorted(spec.split(","), key=lambda s: not s.startswith(">")))


def check_python(version: Sequence[int] = tuple(sys.version_info[:3])) -> Check:
    """Python >= 3.11 (the oldest version zebra and megatron-core 0.16 support)."""
    shown = ".".join(map(str, version))
    if tuple(version[:2]) >= MIN_PYTHON:
        return ok("python", f"Python {shown} ({sys.executable})")
    need = ".".join(map(str, MIN_PYTHON))
    return fail(
        "python",
        f"Python {shown} is older than {need}",
        f"install Python >= {need} (e.g. `pyenv install 3.11`) and reinstall zebra in it",
    )


def check_package(pkg: Package, found: tuple[str, str] | None, spec: str | None) -> Check:
    """Presence and version of one package against its supported range `spec` (None: any version)."""
    fix = pkg.fix
    if fix == "pip install":  # plain packages: install the supported range
        fix = f"pip install '{pkg.dists[0]}{_pretty(spec) if spec else ''}'"
    if found is None:
        problem = f"{pkg.name} is not installed (needed for {pkg.why})"
        return fail(pkg.name, problem, fix) if pkg.required else warn(pkg.name, problem, fix)
    dist, version = found
    label = pkg.name if dist == pkg.dists[0] else f"{pkg.name} ({dist})"
    if spec and not in_spec(version, spec):
        return fail(
            pkg.name,
            f"{label} {version} is outside the supported range {_pretty(spec)}",
            f"pip install '{dist}{_pretty(spec)}'",
        )
    return ok(pkg.name, f"{label} {version}" + (f" (supported {_pretty(spec)})" if spec else ""))


def transformers_spec() -> tuple[str | None, str]:
    """The transformers range to enforce and where it comes from: zebra's declared range, narrowed by FLA's
    metadata when FLA is installed (zebra's floor is the first release with the native export classes)."""
    from packaging.specifiers import SpecifierSet

    own = declared_spec("transformers")
    fla = declared_spec("transformers", by="flash-linear-attention")
    if fla:
        fla_version = metadata.version("flash-linear-attention")
        both = str(SpecifierSet(fla) & SpecifierSet(own or ""))
        return both, f"FLA {fla_version} supports {_pretty(fla)}" + (
            f", zebra needs {_pretty(own)}" if own else ""
        )
    return own, "zebra's declared range"


def check_packages() -> list[Check]:
    """One check per package in `PACKAGES`."""
    checks = []
    for pkg in PACKAGES:
        found = installed(pkg.dists)
        if pkg.name == "transformers":
            spec, source = transformers_spec()
            check = check_package(pkg, found, spec)
            if check.status != "ok" and spec:
                check = Check(check.name, check.status, f"{check.detail}; {source}", check.fix)
            checks.append(check)
            continue
        spec = declared_spec(found[0] if found else pkg.dists[0]) if pkg.name != "triton" else None
        checks.append(check_package(pkg, found, spec))
    return checks


def check_torch(
    version: str | None, spec: str | None, backend: str, runtime: str | None, gpu_device_nodes: bool
) -> Check:
    """torch's version and build (CUDA, ROCm/HIP or CPU).

    Args:
        version: torch's version, None when it is not installed.
        spec: the supported range, or None.
        backend: 'cuda', 'rocm' or 'cpu': what the build targets.
        runtime: the CUDA or HIP version the build was made with.
        gpu_device_nodes: whether the machine shows GPU device files (/dev/nvidia0, /dev/kfd).
    """
    if version is None:
        return fail("torch", "torch is not installed", TORCH_INSTALL)
    if spec and not in_spec(version, spec):
        return fail(
            "torch",
            f"torch {version} is outside the supported range {_pretty(spec)}",
            f"pip install 'torch{_pretty(spec)}'",
        )
    build = {"cuda": f"CUDA {runtime} build", "rocm": f"ROCm build (HIP {runtime})", "cpu": "CPU build"}[
        backend
    ]
    if backend == "cpu" and gpu_device_nodes:
        return warn(
            "torch",
            f"torch {version} is a CPU build, but this machine has GPU devices",
            f"install the CUDA or ROCm build of torch for this machine ({TORCH_PICKER})",
        )
    return ok("torch", f"torch {version}, {build}")
