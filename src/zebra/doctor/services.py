"""The launchers' services: a Docker engine reachable through the Docker SDK, and a Slurm cluster (`sinfo`).

Both are optional (only `--launcher docker` / `--launcher slurm` need them), so an unreachable one warns;
`zebra doctor --require docker` turns that into a failure.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import subprocess

from zebra.core.errors import first_line
from zebra.doctor.check import Check, ok, warn

DOCKER_FIX = (
    "start the engine (`dockerd &` or `systemctl start docker`), or set DOCKER_HOST to a running one "
    "(Podman: `podman system service -t 0 unix:///run/podman/podman.sock &` and "
    "DOCKER_HOST=unix:///run/podman/podman.sock)"
)
SLURM_FIX = "start munged, slurmctld and slurmd (or check SLURM_CONF), then `sinfo` must list a partition"
USABLE_NODE_STATES = ("idle", "mix", "mixed", "alloc", "allocated", "completing", "planned")


def root_cause(e: BaseException) -> str:
    """The innermost OS error's text ('No such file or directory', 'Connection refused'), else the first line."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        for arg in getattr(seen, "args", ()):  # requests wraps the OSError in a tuple argument
            if isinstance(arg, tuple):
                inner = next((a for a in arg if isinstance(a, OSError) and a.strerror), None)
                if inner is not None:
                    return inner.strerror
        seen = seen.__cause__ or seen.__context__
    return first_line(e, 160)


def check_docker() -> Check:
    """Ping the Docker engine at DOCKER_HOST (default: the local socket) through the Docker SDK."""
    try:
        import docker
    except ImportError:
        return warn("docker", "the Docker SDK is not installed", "pip install 'docker>=7,<8'")
    host = os.environ.get("DOCKER_HOST") or "the default socket unix:///var/run/docker.sock"
    client = None
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        version = client.version()
    except Exception as e:  # the SDK raises DockerException, requests' and OS errors alike
        return warn("docker", f"no Docker engine reachable at {host}: {root_cause(e)}", DOCKER_FIX)
    finally:
        if client is not None:
            client.close()
    engine = version.get("Platform", {}).get("Name") or "Docker Engine"
    return ok("docker", f"{engine} {version.get('Version', '?')} at {host}")


def check_slurm() -> Check:
    """`sinfo` exists, answers, and lists a partition with a usable node; submitit is installed."""
    sinfo = shutil.which("sinfo")
    if not sinfo:
        return warn(
            "slurm",
            "sinfo not found on PATH: no Slurm client here",
            "run on the cluster's login node, or install the client (apt-get install slurm-client)",
        )
    try:
        r = subprocess.run([sinfo, "-h", "-o", "%P|%a|%D|%t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return warn("slurm", "sinfo did not answer within 20 s", SLURM_FIX)
    except OSError as e:
        return warn("slurm", f"sinfo could not run: {e}", SLURM_FIX)
    if r.returncode != 0:
        return warn("slurm", f"sinfo failed: {first_line(r.stderr or r.stdout, 160)}", SLURM_FIX)
    partitions, states = [], {}
    for line in r.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        partition, _avail, nodes, state = parts
        partition = f"{partition[:-1]} (default)" if partition.endswith("*") else partition
        if partition not in partitions:
            partitions.append(partition)
        state = state.rstrip("*~#!%$@^-")
        states[state] = states.get(state, 0) + int(nodes or 0)
    if not partitions:
        return warn("slurm", "sinfo answers but lists no partition", SLURM_FIX)
    nodes = ", ".join(f"{n} {state}" for state, n in states.items())
    detail = f"partitions {', '.join(partitions)}; nodes: {nodes}"
    if not any(s in USABLE_NODE_STATES for s in states):
        return warn(
            "slurm", f"{detail}: no node is up", "resume the nodes: scontrol update nodename=... state=resume"
        )
    try:
        metadata.version("submitit")
    except metadata.PackageNotFoundError:
        return warn(
            "slurm",
            f"{detail}; but submitit (the Slurm launcher) is not installed",
            "pip install 'submitit>=1.5,<2'",
        )
    return ok("slurm", detail)
