"""Execution providers by name: plain dispatch, because the set is small and fixed at build time."""

from __future__ import annotations

from core.ports import ExecutionProvider
from sandbox.account import DEFAULT_SANDBOX_USER
from sandbox.bubblewrap import DEFAULT_MEMORY_MB, DEFAULT_PIDS, BubblewrapProvider
from sandbox.limits import MIB, Limits
from sandbox.manifests import PodPolicy

KNOWN_PROVIDERS = ("bwrap", "kubernetes")


def make_provider(
    name: str,
    *,
    bwrap_path: str = "bwrap",
    limits_mode: str = "best-effort",
    memory_mb: int = DEFAULT_MEMORY_MB,
    pids: int = DEFAULT_PIDS,
    syscall_filter: bool = True,
    sandbox_user: str = DEFAULT_SANDBOX_USER,
    pod_policy: PodPolicy | None = None,
    kube_config: str | None = None,
    state_dir: str | None = None,
) -> ExecutionProvider:
    """Build the execution provider called ``name``.

    ``limits_mode`` is ``best-effort``, ``required`` or ``off``; a ``memory_mb`` or ``pids`` of 0 leaves
    that resource unlimited. ``sandbox_user`` is the account a root worker starts sandboxes as.
    ``state_dir`` is where bubblewrap sandboxes' run directories are (``FLUIDBOX_HOME/runs``), for its
    orphan listing.

    Raises:
        ValueError: no provider has that name, or an unknown limits mode.
    """
    if name == "bwrap":
        limits = Limits(memory_bytes=memory_mb * MIB if memory_mb > 0 else None, pids=pids if pids > 0 else None)
        return BubblewrapProvider(
            bwrap_path=bwrap_path,
            limits_mode=limits_mode,
            limits=limits,
            syscall_filter=syscall_filter,
            sandbox_user=sandbox_user,
            state_dir=state_dir,
        )
    if name == "kubernetes":
        # Imported here: the client costs about 0.5 s to import, and a bubblewrap worker never needs it.
        from kubernetes import config as kube

        from sandbox.kubernetes import KubernetesProvider

        if kube_config:
            api_client = kube.new_client_from_config(config_file=kube_config)  # type: ignore[no-untyped-call]
        else:
            kube.load_incluster_config()  # type: ignore[no-untyped-call]
            from kubernetes.client import ApiClient

            api_client = ApiClient()
        return KubernetesProvider(api_client, pod_policy)
    raise ValueError(f"unknown execution provider {name!r}; known: {', '.join(KNOWN_PROVIDERS)}")
