"""What a launcher hands the ranks from this machine: environment variables (how they are passed and shown)
and, for containers, host folders (`Mount`, the Hugging Face cache).

A container starts with an empty environment, so the Docker launcher passes an allow-list: the variables that
configure the collectives, the GPU runtime, Hugging Face and Weights & Biases, plus the names a recipe's
`launch.env` (or `--env NAME`) adds. Secrets are passed but never shown: every plan, table, log line and file
zebra writes carries `******` in their place. A secret is a variable whose name says so (`HF_TOKEN`,
`WANDB_API_KEY`, `DB_PASSWORD`, ...) or that the user marks (`launch.secret_env`, `--secret-env NAME`); in
any other value the credentials of a URL (`https://user:pw@host`) are masked, and such a value is never
written into a job's files either. Slurm jobs inherit the submitting shell's environment through sbatch
itself, so their plan lists the same names for information.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from zebra.core.caches import torch_writes
from zebra.core.errors import ZebraError

MASK = "******"

# Passed to the ranks when set in the launching shell (shell-style patterns).
ALLOWED = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "WANDB_*",
    "ZEBRA_*",
    "NCCL_*",
    "RCCL_*",
    "GLOO_*",
    "TORCH_*",
    "PYTORCH_*",
    "TORCHINDUCTOR_*",
    "TRITON_*",
    "HSA_*",
    "HIP_*",
    "ROCR_*",
    "ROCM_*",
    "MIOPEN_*",
    "CUDA_*",
    "NVIDIA_*",
    "UCX_*",
    "FI_*",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
)

# Never passed (they describe the launching shell, not the ranks), even when a pattern above matches.
BLOCKED = ("CUDA_HOME", "CUDA_PATH")

SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "CREDENTIALS", "AUTH"}

# The userinfo of a URL: `scheme://` then anything up to `@` that is not a path, space or another `@`.
URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def is_secret(name: str) -> bool:
    """True for names that hold credentials (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, ...): one of
    their `_`-separated words is TOKEN, SECRET, PASSWORD, KEY, ... (TOKENIZERS_PARALLELISM is not)."""
    return any(word in SECRET_WORDS for word in re.split(r"[_\W]+", name.upper()))


def mask_urls(text: str) -> str:
    """`text` with the credentials of every URL in it masked: `https://u:pw@host` -> `https://******@host`."""
    return URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


@dataclass(frozen=True)
class EnvVar:
    """One variable for the ranks. `value` None: read from the environment where the rank starts."""

    name: str
    value: str | None
    secret: bool = False

    @property
    def sensitive(self) -> bool:
        """A secret, or a value holding a URL's credentials: never written into a job's files."""
        return self.secret or (self.value is not None and mask_urls(self.value) != self.value)

    def shown(self) -> str:
        """The value as plans and logs may show it."""
        if self.secret:
            return MASK
        return "(from the job's environment)" if self.value is None else mask_urls(self.value)

    def without_secret(self) -> EnvVar:
        """This variable with a sensitive value dropped (to be read again where the rank starts)."""
        return EnvVar(self.name, None, self.secret) if self.sensitive else self


def allowed(name: str, extra: Iterable[str] = ()) -> bool:
    if name in BLOCKED:
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in (*ALLOWED, *extra))


def passthrough(
    environ: Mapping[str, str] | None = None, extra: Iterable[str] = (), secret: Iterable[str] = ()
) -> list[EnvVar]:
    """The allow-listed variables (plus the names in `extra`, and the names in `secret` as secrets) set in
    `environ`, sorted by name; not a default torch, Triton or FLA wrote there itself (`zebra.core.caches.torch_writes`:
    inductor's cache folder once anything in this process compiled, TORCH_WARM_POOL=0, ...), which the ranks
    choose for themselves. A value the process started with (exported in the shell) is passed, whatever it is."""
    environ = os.environ if environ is None else environ
    extra, secret = tuple(extra), tuple(secret)
    theirs = torch_writes(environ)
    return [
        EnvVar(k, environ[k], is_secret(k) or any(fnmatch.fnmatchcase(k, p) for p in secret))
        for k in sorted(environ)
        if allowed(k, (*extra, *secret)) and k not in theirs
    ]


def resolve(variables: Iterable[EnvVar], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Real values for a container: variables without a value are read from `environ` (skipped if unset)."""
    environ = os.environ if environ is None else environ
    values = {}
    for var in variables:
        value = var.value if var.value is not None else environ.get(var.name)
        if value is not None:
            values[var.name] = value
    return values


def masked(variables: Iterable[EnvVar]) -> dict[str, str]:
    """`{name: shown value}`: what a plan prints."""
    return {var.name: var.shown() for var in variables}


@dataclass(frozen=True)
class Mount:
    """A host directory bound into the container (at the same path unless the user says otherwise)."""

    source: str
    target: str
    read_only: bool
    purpose: str  # project | data | run | hf-cache | tokenizer | user

    def describe(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


def parse_mount(text: str) -> Mount:
    """`HOST[:CONTAINER][:ro|rw]` -> Mount (absolute paths; read-write unless `:ro`)."""
    parts = text.split(":")
    mode = "rw"
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        mode = parts.pop()
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ZebraError(
            f"--mount {text!r}: expected HOST[:CONTAINER][:ro]", fix="e.g. --mount /data:/data:ro"
        )
    source = os.path.abspath(os.path.expanduser(parts[0]))
    target = parts[1] if len(parts) == 2 else source
    if not target.startswith("/"):
        raise ZebraError(f"--mount {text!r}: the container path {target!r} is not absolute")
    if not os.path.exists(source):
        raise ZebraError(f"--mount {text!r}: {source} does not exist", fix="create it or fix the path")
    return Mount(source, target, mode == "ro", "user")


def hf_cache() -> Path:
    """The Hugging Face cache folder ranks should share: HF_HOME, else ~/.cache/huggingface."""
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser().resolve()
