"""The Docker launcher: runs a `ContainerSpec` through the Docker SDK (Docker Engine, or Podman's
Docker-compatible socket through DOCKER_HOST).

`run_docker` starts a container, streams its output into this console, forwards Ctrl-C / SIGTERM as
SIGTERM (the trainer saves a checkpoint and exits 0), turns a failing exit code into a ZebraError and removes
the container. Slurm tasks with `launch.container` use `start_container` and `stop_and_wait`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from zebra.core.errors import ZebraError, first_line
from zebra.doctor.services import DOCKER_FIX, root_cause
from zebra.launch.container import ContainerSpec
from zebra.launch.environment import resolve

POLL_S = 0.5
STOP_GRACE_S = 600  # after the first Ctrl-C the ranks save; a second one kills at once
IMAGE_FIX = "docker pull {image} where a registry is reachable (or docker load it), or pass --image with a local image (`docker images` lists them)"


def sdk_kwargs(spec: ContainerSpec, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments of `client.containers.create(image, ...)` (real values: never print them)."""
    import docker

    kwargs: dict[str, Any] = dict(
        command=spec.full_command,
        name=spec.name,
        environment=resolve(spec.env, environ),
        mounts=[
            docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in spec.mounts
        ],
        ipc_mode=spec.ipc_mode,
        network_mode=spec.network_mode,
        shm_size=spec.shm_size,
        working_dir=spec.workdir,
        labels=spec.labels,
        init=spec.init,
        detach=True,
    )
    if spec.user:
        kwargs["user"] = spec.user
    for key in ("devices", "group_add", "cap_add", "security_opt"):
        if getattr(spec, key):
            kwargs[key] = getattr(spec, key)
    if spec.gpu_vendor == "nvidia":
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
    if spec.gpu_vendor:
        kwargs["ulimits"] = [
            docker.types.Ulimit(name="memlock", soft=-1, hard=-1),
            docker.types.Ulimit(name="stack", soft=67108864, hard=67108864),
        ]
    return kwargs


def docker_client(timeout: int = 60):
    """A Docker SDK client connected to a running engine, or a one-line ZebraError saying how to start one."""
    try:
        import docker
    except ImportError:
        raise ZebraError(
            "the docker launcher needs the Docker SDK", fix="pip install 'zebra-llama[launch]'"
        ) from None
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
    remove_leftover(client, spec.name)
    try:
        container = client.containers.create(spec.image, **sdk_kwargs(spec))
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


def refuse_running(client, name: str) -> None:
    """A one-line ZebraError when container `name` runs: another launch of the same run, still training."""
    import docker

    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return
    if container.status in ("running", "restarting", "paused"):
        started = container.attrs.get("State", {}).get("StartedAt", "")[:19].replace("T", " ")
        raise ZebraError(
            f"container {name} is already running this run (since {started or 'an unknown time'} UTC)",
            fix=f"wait for it to end, or stop it (its ranks save a checkpoint first): docker stop -t 600 {name}",
        )


def remove_leftover(client, name: str) -> None:
    """Remove a stopped container `name`, left by an earlier launcher that was killed; refuse a running one."""
    import docker

    refuse_running(client, name)
    with contextlib.suppress(docker.errors.NotFound):
        client.containers.get(name).remove(force=True)


def _explain(e) -> str:
    return first_line(getattr(e, "explanation", None) or e, 300)


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


def run_docker(
    spec: ContainerSpec, log: Callable[[str], None] = print, stream: BinaryIO | None = None
) -> str | None:
    """Run the container of `spec` in the foreground; the signal that stopped it early (it saved), or None.

    Raises:
        ZebraError: the engine, the image or the container failed; a failing run's exit code becomes the
        error's.
    """
    outcome = run_container(spec, stream=stream, log=log)
    if outcome.exit_code:
        raise ZebraError(
            f"training in container {spec.name} ({spec.image}) failed with exit code {outcome.exit_code}",
            fix="its output is above" if not outcome.stopped_by else "it was killed before it saved",
            exit_code=outcome.exit_code,
        )
    return outcome.stopped_by


def check_docker(
    image: str, log: Callable[[str], None] = print, progress=None, container_name: str | None = None
) -> None:
    """The engine answers, has `image` (pulled if needed, reporting `progress(done_mb, total_mb)`) and runs
    no container `container_name` (another launch of the same run)."""
    client = docker_client()
    try:
        if container_name:
            refuse_running(client, container_name)
        ensure_image(client, image, log, progress)
    finally:
        client.close()
