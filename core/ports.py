"""Seams between the domain and the outside world.

``ExecutionProvider`` is the only thing that knows where a sandbox runs. The spec describes a run in
host-independent terms (the workspace by reference and digest, the image, resources, the deadline);
the few host paths a local provider binds sit in their own, optional, group. The handle is opaque
plain data: core and the activities read only ``provider`` and ``run_id``, and everything else is the
provider's own, serialized so that a restarted worker (or another worker) can reattach to a sandbox it
did not start.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, Field

SandboxState = Literal["running", "exited", "missing"]
# How the sandbox's tree travels: ``bind`` mounts the control plane's copy (a local provider on the
# worker's host); ``archive`` has the runner download it and upload its final state over the runner plane.
WorkspaceTransfer = Literal["bind", "archive"]


class WorkspaceRef(BaseModel):
    """The prepared workspace, by reference and digest: what the runner downloads and verifies."""

    ref: str  # a runner-plane path, e.g. /internal/sessions/<run>/workspace
    sha256: str  # of the archive bytes (a gzip'd tar); the runner refuses anything else
    size: int = 0


class Resources(BaseModel):
    """Per-sandbox limits; ``None`` leaves the provider's default."""

    cpu_millis: int | None = None
    memory_mb: int | None = None
    ephemeral_mb: int | None = None


class SandboxSpec(BaseModel):
    """What to run, for one run."""

    run_id: str
    env: dict[str, str] = Field(default_factory=dict)  # the complete environment (nothing is inherited)
    # Handed to the runner out of band: a local provider writes them on an inherited pipe
    # (core.contract.SECRETS_FD), never a file, a command line or an environment, where /proc would show
    # them to the agent. A remote provider is handed only a one-time bootstrap credential here (see
    # ``bootstrap``) and never the run's tokens.
    secrets: dict[str, str] = Field(default_factory=dict)
    argv: list[str]  # command run inside the sandbox, cwd /workspace
    workspace: WorkspaceRef | None = None  # set when the tree travels as an archive
    image: str = ""  # the runner image (remote providers); empty: the deployment's default
    runtime_class: str = ""  # a Kubernetes RuntimeClass (gVisor, Kata) for kernel-level isolation; empty: none
    resources: Resources = Field(default_factory=Resources)
    deadline_secs: int | None = None  # the wall-clock budget: the sandbox is ended by its platform past it
    bootstrap: str = ""  # one-time credential a remote runner exchanges for its run tokens (the exchange burns it)
    # Local providers only (host paths on the worker's host); a remote provider ignores them.
    workspace_dir: str = ""  # bound read-write at /workspace: the only writable tree
    socket_dir: str = ""  # host dir holding the gateway socket, bound read-only at /run/fluidbox
    code_dirs: list[str] = Field(default_factory=list)  # host dirs of python packages, bound under /opt/fluidbox
    log_path: str = ""  # host file receiving the sandbox's stdout and stderr


class SandboxHandle(BaseModel):
    """Opaque to everything but its provider; serializable (stored in the run's row).

    ``pid``, ``start_time`` and ``log_path`` are the bubblewrap provider's (kept as fields so handles
    stored by earlier versions still load); ``ref`` and ``extra`` hold whatever a provider needs.
    """

    provider: str
    run_id: str
    ref: str = ""  # the provider's name for the sandbox (a Pod's namespace/name)
    pid: int = 0
    start_time: int = 0  # /proc/<pid>/stat field 22: guards against pid reuse
    log_path: str = ""
    extra: dict[str, str] = Field(default_factory=dict)


class Collected(BaseModel):
    """What ``collect`` brings back from an ended (or ending) sandbox."""

    log_tail: str = ""  # the last few KiB of the sandbox's output
    failure: str | None = None  # why the platform ended it (OOMKilled, Evicted, image pull…), if it says


class ExecutionProvider(Protocol):
    name: str
    workspace_transfer: WorkspaceTransfer

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Start the sandbox; a second call for the same run returns the one already started."""
        ...

    async def status(self, handle: SandboxHandle) -> SandboxState: ...

    async def destroy(self, handle: SandboxHandle, grace_secs: float = 2.0) -> None:
        """End the sandbox and clean up after it; a handle naming only ``run_id`` (the orphan sweep's, from
        ``sandboxes``) ends whatever sandbox this provider holds for that run."""
        ...

    async def find(self, run_id: str, log_path: str = "") -> SandboxHandle | None:
        """The live sandbox this provider started for ``run_id``, if any: how a retried provisioning learns
        that an interrupted attempt already started one (``log_path``: a local provider's hint)."""
        ...

    async def collect(self, handle: SandboxHandle) -> Collected:
        """The sandbox's output tail and the platform's reason for its end, read where it ran."""
        ...

    def describe(self, handle: SandboxHandle) -> str:
        """One line for the ledger saying what was launched (no secret, no host detail beyond the provider's)."""
        ...

    async def sandboxes(self) -> list[str]:
        """The run ids of every live sandbox this provider holds (found where it records them, a label or a
        pidfile, not in memory): the orphan sweep destroys those whose run is over or unknown."""
        ...
