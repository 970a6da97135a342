"""The container launcher: one node's ranks in a container, through the Docker SDK (Docker Engine, or Podman's
Docker-compatible socket through DOCKER_HOST).

`container_spec` describes the container (image, GPUs, mounts, environment, the IPC/network/security options
ROCm and the collectives need, command); `run_container` starts it, streams its output into this console,
forwards Ctrl-C / SIGTERM as SIGTERM (the trainer saves a checkpoint and exits 0), returns its exit code and
removes it. Host networking only: the rendezvous and collectives bind where the host's do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from zebra.errors import ZebraError
from zebra.launch.environment import EnvVar, masked, resolve

if TYPE_CHECKING:
    from zebra.launch.plan import LaunchPlan, Mount
    from zebra.recipes import LaunchSpec

POLL_S = 0.5
STOP_GRACE_S = 600  # after the first Ctrl-C the ranks save; a second one kills at once
IMAGE_FIX = "docker pull {image} where a registry is reachable (or docker load it), or pass --image with a local image (`docker images` lists them)"


@dataclass
class ContainerSpec:
    """One container: what `docker run` would be given. `env` values of secrets are masked when shown."""

    image: str
    command: list[str]  # the ranks' command (torchrun or one rank's entry)
    name: str
    mounts: list[Mount]
    env: list[EnvVar]
    gpu_vendor: str | None  # amd | nvidia | None (CPU ranks)
    gpus: int
    devices: list[str] = field(default_factory=list)
    group_add: list[str] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    shm_size: str = "64g"
    user: str | None = None
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)
    ipc_mode: str = "host"
    network_mode: str = "host"
    python: str = "python3"
    init: bool = True  # docker --init: PID 1 forwards signals and reaps zombies
    setup: str = ""  # shell line run before `command` (launch.container_setup)

    @property
    def full_command(self) -> list[str]:
        """What the container runs: `command`, after `setup` when there is one."""
        if not self.setup:
            return self.command
        return ["/bin/sh", "-c", f"{self.setup} && exec {shlex.join(self.command)}"]

    def describe(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "name": self.name,
            "gpu_vendor": self.gpu_vendor,
            "gpus": self.gpus,
            "devices": self.devices,
            "device_requests": [{"driver": "nvidia", "count": self.gpus, "capabilities": [["gpu"]]}]
            if self.gpu_vendor == "nvidia"
            else [],
            "group_add": self.group_add,
            "cap_add": self.cap_add,
            "security_opt": self.security_opt,
            "ipc_mode": self.ipc_mode,
            "network_mode": self.network_mode,
            "shm_size": self.shm_size,
            "user": self.user,
            "workdir": self.workdir,
            "init": self.init,
            "mounts": [m.describe() for m in self.mounts],
            "env": masked(self.env),
            "command": shlex.join(self.full_command),
        }

    def without_secret_values(self) -> ContainerSpec:
        """This spec with secret values dropped: they are read again where the container starts."""
        return replace(self, env=[v.without_secret() for v in self.env])

    def sdk_kwargs(self, environ: dict[str, str] | None = None) -> dict[str, Any]:
        """Keyword arguments of `client.containers.create(image, ...)` (real values: never print them)."""
        import docker

        kwargs: dict[str, Any] = dict(
            command=self.full_command,
            name=self.name,
            environment=resolve(self.env, environ),
            mounts=[
                docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only)
                for m in self.mounts
            ],
            ipc_mode=self.ipc_mode,
            network_mode=self.network_mode,
            shm_size=self.shm_size,
            working_dir=self.workdir,
            labels=self.labels,
            init=self.init,
            detach=True,
        )
        if self.user:
            kwargs["user"] = self.user
        for key in ("devices", "group_add", "cap_add", "security_opt"):
            if getattr(self, key):
                kwargs[key] = getattr(self, key)
        if self.gpu_vendor == "nvidia":
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=self.gpus, capabilities=[["gpu"]])]
        if self.gpu_vendor:
            kwargs["ulimits"] = [
                docker.types.Ulimit(name="memlock", soft=-1, hard=-1),
                docker.types.Ulimit(name="stack", soft=67108864, hard=67108864),
            ]
        return kwargs


def container_name(run_dir: str) -> str:
    """A name that says which run a container belongs to: `zebra-<run>-<hash of its path>`."""
    base = re.sub(r"[^a-zA-Z0-9_.-]", "-", os.path.basename(run_dir.rstrip("/")))[:40] or "run"
    return f"zebra-{base}-{hashlib.sha1(run_dir.encode()).hexdigest()[:8]}"


def container_spec(plan: LaunchPlan, spec: LaunchSpec, pythonpath: list[str]) -> ContainerSpec:
    """The container that runs one node of `plan` (its mounts must already be in `plan.mounts`)."""
    from zebra.launch import devices
    from zebra.launch.plan import hf_cache

    vendor = devices.guess_vendor(spec.gpu_vendor, spec.image) if plan.device == "cuda" else None
    options: dict[str, Any] = {}
    if vendor == "amd":
        options = devices.amd_options()
    elif vendor == "nvidia":
        options = devices.nvidia_options(plan.gpus_per_node)
        options.pop("gpus")
    env = {v.name: v for v in plan.env}
    added = {"PYTHONPATH": os.pathsep.join(pythonpath), "PYTHONUNBUFFERED": "1"}
    if any(m.purpose == "hf-cache" for m in plan.mounts):
        added["HF_HOME"] = str(hf_cache())
    if plan.device == "cpu" and "OMP_NUM_THREADS" not in env:
        from zebra.train.launch import cpu_threads_per_rank

        added["OMP_NUM_THREADS"] = str(cpu_threads_per_rank(plan.ranks_per_node))
    user = None
    if os.getuid() != 0:  # files in the run directory stay the user's
        user = f"{os.getuid()}:{os.getgid()}"
        added["HOME"] = "/tmp"
    env.update({k: EnvVar(k, v) for k, v in added.items()})
    return ContainerSpec(
        image=spec.image,
        command=plan.command,
        setup=spec.container_setup,
        name=container_name(str(plan.run_dir)),
        mounts=list(plan.mounts),
        env=sorted(env.values(), key=lambda v: v.name),
        gpu_vendor=vendor,
        gpus=plan.gpus_per_node,
        shm_size=spec.shm_size,
        user=user,
        workdir=str(plan.run_dir),
        labels={"zebra.run_dir": str(plan.run_dir), "zebra.recipe": plan.recipe},
        python=spec.container_python,
        init=spec.container_init,
        **options,
    )


def docker_client(timeout: int = 60):
    """A Docker SDK client connected to a running engine, or a one-line ZebraError saying how to start one."""
    try:
        import docker
    except ImportError:
        raise ZebraError(
            "the docker launcher needs the Docker SDK", fix="pip install 'zebra-llama[launch]'"
        ) from None
    from zebra.doctor.services import DOCKER_FIX, root_cause

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    client = None
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as e:  # DockerException, requests' and OS errors alike
        if client is not None:
            client.close()
        raise ZebraError(f"no Docker engine reachable at {host}: {root_cause(e)}", fix=DOCKER_FIX) from None
    return client


def ensure_image(client, image: str, log=print, progress=None) -> None:
    """Pull `image` when this engine does not have it; a one-line ZebraError when that fails.

    Args:
        progress: called as `progress(done_mb, total_mb)` while layers download.
    """
    import docker
    from docker.utils import parse_repository_tag

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    log(f"pulling {image} (not on this machine yet)")
    repository, tag = parse_repository_tag(image)
    layers: dict[str, tuple[int, int]] = {}
    try:
        for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
            if "error" in event:
                raise docker.errors.APIError(event["error"], explanation=event["error"])
            detail = event.get("progressDetail") or {}
            if event.get("id") and detail.get("total"):
                layers[event["id"]] = (detail.get("current", 0), detail["total"])
                if progress is not None:
                    done, total = (sum(x) / 1e6 for x in zip(*layers.values(), strict=True))
                    progress(done, total)
        client.images.get(image)
    except docker.errors.APIError as e:
        raise ZebraError(
            f"image {image} is not on this machine and pulling it failed: {_explain(e)[:200]}",
            fix=IMAGE_FIX.format(image=image),
        ) from None


class RunningContainer:
    """A started container whose output is copied to `stream` until it exits."""

    def __init__(self, client, container, stream: BinaryIO):
        self.client, self.container, self.name = client, container, container.name
        self._logs = threading.Thread(target=self._copy_logs, args=(stream,), daemon=True)
        self._logs.start()

    def _copy_logs(self, stream: BinaryIO) -> None:
        with contextlib.suppress(Exception):  # the container went away: nothing more to copy
            for chunk in self.container.logs(stream=True, follow=True):
                stream.write(chunk)
                stream.flush()

    def signal(self, sig: str = "SIGTERM") -> None:
        import docker

        with contextlib.suppress(docker.errors.APIError):  # already stopped
            self.container.kill(signal=sig)

    def exited(self) -> bool:
        import docker

        try:
            self.container.reload()
        except docker.errors.NotFound:
            return True
        return self.container.status in ("exited", "dead")

    def exit_code(self) -> int:
        code = int(self.container.wait(timeout=60).get("StatusCode", 1))
        self._logs.join(timeout=10)
        return code

    def remove(self) -> None:
        import docker

        with contextlib.suppress(docker.errors.APIError):
            self.container.remove(force=True)


def start_container(
    spec: ContainerSpec, client=None, stream: BinaryIO | None = None, log=print
) -> RunningContainer:
    """Create and start the container of `spec` (pulling its image first if needed)."""
    import docker

    client = client or docker_client()
    ensure_image(client, spec.image, log)
    with contextlib.suppress(docker.errors.NotFound):  # a leftover of an earlier, killed launcher
        client.containers.get(spec.name).remove(force=True)
    try:
        container = client.containers.create(spec.image, **spec.sdk_kwargs())
    except docker.errors.APIError as e:
        raise ZebraError(
            f"docker could not create the container from {spec.image}: {_explain(e)}",
            fix="check the container spec with --dry-run",
        ) from None
    try:
        container.start()
    except docker.errors.APIError as e:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
        raise ZebraError(
            f"docker could not start {spec.image}: {_explain(e)}",
            fix="on a machine without GPUs train on CPU ranks (--nproc N); check the devices with --dry-run",
        ) from None
    return RunningContainer(client, container, stream or sys.stdout.buffer)


def _explain(e) -> str:
    return (getattr(e, "explanation", None) or str(e)).strip().splitlines()[0][:300]


@dataclass
class ContainerOutcome:
    exit_code: int
    stopped_by: str | None  # the signal this launcher forwarded (the ranks saved and stopped), else None


def run_container(
    spec: ContainerSpec, *, client=None, stream: BinaryIO | None = None, log=print
) -> ContainerOutcome:
    """Run `spec` to the end in the foreground and remove the container.

    The first SIGINT or SIGTERM is forwarded as SIGTERM (the trainer saves a checkpoint and exits 0); a second
    SIGINT kills the container. The container is removed however this ends.
    """
    running = start_container(spec, client, stream, log)
    received: list[str] = []

    def on_signal(signum, _frame):
        received.append(signal.Signals(signum).name)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        forwarded = 0
        deadline = None
        while not running.exited():
            if len(received) > forwarded:
                if forwarded == 0:
                    log(
                        f"{received[0]}: stopping container {running.name} (the run saves a checkpoint; Ctrl-C again to kill)"
                    )
                    running.signal("SIGTERM")
                    deadline = time.monotonic() + STOP_GRACE_S
                elif "SIGINT" in received[forwarded:]:
                    running.signal("SIGKILL")
                forwarded = len(received)
            if deadline is not None and time.monotonic() > deadline:
                running.signal("SIGKILL")
            time.sleep(POLL_S)
        return ContainerOutcome(running.exit_code(), received[0] if received else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        running.remove()


def stop_and_wait(name: str) -> int:
    """Send SIGTERM to container `name` and wait for it to exit (through a client of its own, so that this
    is safe inside a signal handler); returns its exit code."""
    import docker

    client = docker_client()
    try:
        container = client.containers.get(name)
        with contextlib.suppress(docker.errors.APIError):
            container.kill(signal="SIGTERM")
        return int(container.wait().get("StatusCode", 1))
    except docker.errors.NotFound:
        return 0
    finally:
        client.close()
