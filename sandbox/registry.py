"""Execution providers by name: plain dispatch, because the set is small and fixed at build time."""

from __future__ import annotations

from config.settings import SandboxSettings
from core.ports import ExecutionProvider
from sandbox.bubblewrap import BubblewrapProvider
from sandbox.limits import MIB, Limits
from sandbox.manifests import PodPolicy

KNOWN_PROVIDERS = ("bwrap", "kubernetes")


def pod_policy(group: SandboxSettings) -> PodPolicy:
    """The Kubernetes provider's deployment-wide Pod choices, from the sandbox settings group."""
    return PodPolicy(
        namespace=group.kube_namespace,
        default_image=group.runner_image,
        runtime_class=group.kube_runtime_class,
        cpu_millis=group.cpu_millis,
        memory_mb=group.memory_mb or 2048,
        ephemeral_mb=group.ephemeral_mb,
        control_namespace=group.kube_control_namespace,
        control_port=group.kube_control_port,
        allow_dns=group.kube_allow_dns,
    )


def make_provider(group: SandboxSettings | None = None) -> ExecutionProvider:
    """Build the execution provider ``group.provider`` names (default: bubblewrap with every default).

    ``limits`` is ``best-effort``, ``required`` or ``off``; a ``memory_mb`` or ``pids`` of 0 leaves that
    resource unlimited. ``user`` is the account a root worker starts sandboxes as. ``state_dir`` is where
    bubblewrap sandboxes' run directories are (``FLUIDBOX_HOME/runs``), for its orphan listing.

    Raises:
        ValueError: no provider has that name, or an unknown limits mode.
    """
    group = group or SandboxSettings()
    if group.provider == "bwrap":
        memory_mb, pids = group.memory_mb, group.pids
        limits = Limits(memory_bytes=memory_mb * MIB if memory_mb > 0 else None, pids=pids if pids > 0 else None)
        return BubblewrapProvider(
            bwrap_path=group.bwrap_path,
            limits_mode=group.limits,
            limits=limits,
            syscall_filter=group.syscall_filter,
            sandbox_user=group.user,
            state_dir=str(group.state_dir) if group.state_dir else None,
        )
    if group.provider == "kubernetes":
        # Imported here: the client costs about 0.5 s to import, and a bubblewrap worker never needs it.
        from kubernetes import config as kube

        from sandbox.kubernetes import KubernetesProvider

        if group.kube_config:
            api_client = kube.new_client_from_config(config_file=str(group.kube_config))  # type: ignore[no-untyped-call]
        else:
            kube.load_incluster_config()  # type: ignore[no-untyped-call]
            from kubernetes.client import ApiClient

            api_client = ApiClient()
        return KubernetesProvider(api_client, pod_policy(group))
    raise ValueError(f"unknown execution provider {group.provider!r}; known: {', '.join(KNOWN_PROVIDERS)}")
