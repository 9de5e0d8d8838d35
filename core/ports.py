"""Seams between the domain and the outside world.

``ExecutionProvider`` is the only thing that knows where a sandbox runs. Its handle is plain data so
a restarted worker can reattach to a sandbox it did not start.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, Field

SandboxState = Literal["running", "exited", "missing"]


class SandboxSpec(BaseModel):
    """What to run, for one run. Paths are host paths."""

    run_id: str
    workspace_dir: str  # bound read-write at /workspace: the only writable tree
    socket_dir: str  # host dir holding the gateway socket, bound read-only at /run/fluidbox
    code_dirs: list[str] = Field(default_factory=list)  # host dirs of python packages, bound under /opt/fluidbox
    env: dict[str, str] = Field(default_factory=dict)  # the complete environment (nothing is inherited)
    # Handed to the sandboxed command on an inherited pipe (core.contract.SECRETS_FD): never a file, a command
    # line or an environment, where /proc/<pid>/cmdline or /proc/<pid>/environ would show them to the agent.
    secrets: dict[str, str] = Field(default_factory=dict)
    argv: list[str]  # command run inside the sandbox, cwd /workspace
    log_path: str  # host file receiving the sandbox's stdout and stderr


class SandboxHandle(BaseModel):
    provider: str
    run_id: str
    pid: int = 0
    start_time: int = 0  # /proc/<pid>/stat field 22: guards against pid reuse
    log_path: str = ""
    extra: dict[str, str] = Field(default_factory=dict)


class ExecutionProvider(Protocol):
    name: str

    async def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    async def status(self, handle: SandboxHandle) -> SandboxState: ...

    async def destroy(self, handle: SandboxHandle, grace_secs: float = 2.0) -> None: ...

    async def find(self, run_id: str, log_path: str) -> SandboxHandle | None:
        """The live sandbox this provider started for ``run_id`` (given the spec's ``log_path``), if any:
        how a retried provisioning learns that an interrupted attempt already started one."""
        ...
