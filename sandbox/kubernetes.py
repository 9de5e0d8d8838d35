"""Run each sandbox as one locked-down Pod in a dedicated namespace, through the official client.

Why it is shaped this way:

* Every object of a run (Pod, bootstrap Secret, NetworkPolicy) is named after the run and labelled with
  its id, so a retried ``create`` finds what an interrupted attempt made, ``find`` and the orphan sweep
  work from labels alone, and nothing about the sandbox lives on the worker's disk.
* The Pod never holds a run token. It gets a one-time bootstrap credential (a Secret mounted read-only)
  that the runner exchanges, once, for its run tokens held in memory: the exchange burns it, so what
  the agent could read from the mount afterwards opens nothing.
* The workspace travels over the runner plane (``workspace_transfer = "archive"``): the runner downloads
  the prepared archive and verifies its digest, then uploads its final state before its result.
* The client is synchronous; every call runs in a thread, and an API refusal surfaces as a
  ``KubernetesSandboxError`` naming the status (never the client's dump of headers and body).
* ``status`` is what the liveness sweep asks: a Pod the platform gave up on (image pull, OOM, eviction,
  deadline) counts as exited, and ``collect`` says why in words a user can act on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from core.ports import Collected, SandboxHandle, SandboxSpec, SandboxState, WorkspaceTransfer
from sandbox import manifests
from sandbox.manifests import PodPolicy

log = logging.getLogger(__name__)

# Container waiting reasons that never resolve by themselves: the sandbox is over before it began.
FATAL_WAITING = {
    "ImagePullBackOff": "the runner image could not be pulled",
    "ErrImagePull": "the runner image could not be pulled",
    "InvalidImageName": "the runner image name is invalid",
    "CreateContainerConfigError": "the runner container could not be configured",
    "CreateContainerError": "the runner container could not be created",
}
CLEAN_EXIT = "the runner exited"  # over, but the platform has nothing to add (the log may)
ORPHAN_MIN_AGE_SECS = 120  # a Pod younger than this may belong to a provisioning not recorded yet
_DELETE_WAIT_SECS = 30.0
_POLL_SECS = 0.2


class KubernetesSandboxError(RuntimeError):
    """The Pod (or one of its objects) could not be created."""


class KubernetesProvider:
    """``ExecutionProvider`` running each sandbox as a Pod in ``policy.namespace``."""

    name: str = "kubernetes"
    workspace_transfer: WorkspaceTransfer = "archive"

    def __init__(self, api_client: k8s.ApiClient, policy: PodPolicy | None = None) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._net = k8s.NetworkingV1Api(api_client)
        self.policy = policy or PodPolicy()

    @property
    def namespace(self) -> str:
        return self.policy.namespace

    # ---- lifecycle ------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        if not spec.argv:
            raise ValueError("the sandbox command is empty")
        if not spec.bootstrap:
            raise ValueError("a Kubernetes sandbox needs a bootstrap credential (it never receives run tokens)")
        return await _in_thread(self._create, spec)

    def _create(self, spec: SandboxSpec) -> SandboxHandle:
        name = manifests.object_name(spec.run_id)
        want = manifests.bootstrap_digest(spec.bootstrap)
        existing = self._read_pod(name)
        if existing is not None:
            annotations = _meta(existing).annotations or {}
            if annotations.get(manifests.BOOTSTRAP_DIGEST) == want and _meta(existing).deletion_timestamp is None:
                return self._handle(spec.run_id, existing)  # the same create, retried: it is already there
            # A Pod of an earlier attempt (its credential was replaced): it goes before the new one comes.
            self._delete_all(spec.run_id, grace_secs=0)
            self._wait_gone(name)
        # Plain dicts (sandbox.manifests): the client sends them as they are.
        policy: Any = manifests.network_policy(spec.run_id, self.policy)
        secret = manifests.secret(spec, self.policy)
        self._apply(
            lambda: self._net.create_namespaced_network_policy(self.namespace, policy),
            lambda: self._net.replace_namespaced_network_policy(name, self.namespace, policy),
        )
        self._apply(
            lambda: self._core.create_namespaced_secret(self.namespace, cast(Any, secret)),
            lambda: self._core.replace_namespaced_secret(name, self.namespace, cast(Any, secret)),
        )
        body = manifests.pod(spec, self.policy, created_at=int(time.time()))
        try:
            created: k8s.V1Pod | None = self._core.create_namespaced_pod(self.namespace, cast(Any, body))
        except ApiException as err:
            if err.status != 409:
                raise KubernetesSandboxError(f"cannot create Pod {name}: {_reason(err)}") from None
            created = self._read_pod(name)  # a concurrent attempt won the race: adopt its Pod
        if created is None:
            raise KubernetesSandboxError(f"Pod {name} exists and vanished again")
        return self._handle(spec.run_id, created)

    def _apply(self, create: Any, replace: Any) -> None:
        try:
            create()
        except ApiException as err:
            if err.status != 409:
                raise KubernetesSandboxError(f"cannot create sandbox object: {_reason(err)}") from None
            replace()

    def _handle(self, run_id: str, pod: k8s.V1Pod) -> SandboxHandle:
        meta = _meta(pod)
        extra = {"namespace": meta.namespace or self.namespace, "uid": meta.uid or ""}
        spec = pod.spec
        if spec is not None and spec.runtime_class_name:
            extra["runtime_class"] = spec.runtime_class_name
        if spec is not None and spec.containers:
            extra["image"] = spec.containers[0].image or ""
        return SandboxHandle(provider=self.name, run_id=run_id, ref=f"{extra['namespace']}/{meta.name}", extra=extra)

    async def status(self, handle: SandboxHandle) -> SandboxState:
        pod = await _in_thread(self._read_pod, _pod_name(handle))
        if pod is None or not _same_pod(handle, pod):
            return "missing"
        return "exited" if _ended(pod) is not None else "running"

    async def find(self, run_id: str, log_path: str = "") -> SandboxHandle | None:
        def _find() -> SandboxHandle | None:
            pods = self._core.list_namespaced_pod(
                self.namespace, label_selector=f"{manifests.RUN_LABEL}={run_id.lower()}"
            ).items
            for pod in pods:
                # The selector again, client-side: what the server filtered is checked, not assumed.
                if (_meta(pod).labels or {}).get(manifests.RUN_LABEL) != run_id.lower():
                    continue
                if _meta(pod).deletion_timestamp is None and _ended(pod) is None:
                    return self._handle(run_id, pod)
            return None

        return await _in_thread(_find)

    async def destroy(self, handle: SandboxHandle, grace_secs: float = 2.0) -> None:
        def _destroy() -> None:
            self._delete_all(handle.run_id, grace_secs=int(grace_secs))
            self._wait_gone(_pod_name(handle))

        await _in_thread(_destroy)

    def _delete_all(self, run_id: str, *, grace_secs: int) -> None:
        """Foreground deletion of the Pod (its dependents go first), then its Secret and NetworkPolicy."""
        name = manifests.object_name(run_id)
        options = k8s.V1DeleteOptions(propagation_policy="Foreground", grace_period_seconds=max(0, grace_secs))
        deletes: tuple[Callable[[], object], ...] = (
            lambda: self._core.delete_namespaced_pod(name, self.namespace, body=options),
            lambda: self._core.delete_namespaced_secret(name, self.namespace, body=options),
            lambda: self._net.delete_namespaced_network_policy(name, self.namespace, body=options),
        )
        for delete in deletes:
            try:
                delete()
            except ApiException as err:
                if err.status != 404:
                    raise

    def _wait_gone(self, name: str) -> None:
        deadline = time.monotonic() + _DELETE_WAIT_SECS
        while self._read_pod(name) is not None:
            if time.monotonic() >= deadline:
                log.warning("Pod %s/%s is still terminating after %ss", self.namespace, name, _DELETE_WAIT_SECS)
                return
            time.sleep(_POLL_SECS)

    def _read_pod(self, name: str) -> k8s.V1Pod | None:
        try:
            return self._core.read_namespaced_pod(name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    # ---- what happened --------------------------------------------------------------------------

    async def collect(self, handle: SandboxHandle) -> Collected:
        def _collect() -> Collected:
            pod = self._read_pod(_pod_name(handle))
            if pod is None or not _same_pod(handle, pod):
                return Collected(failure="the sandbox Pod is gone (deleted outside fluidbox, or its node was lost)")
            try:
                tail = self._core.read_namespaced_pod_log(
                    _meta(pod).name or _pod_name(handle), self.namespace, container=manifests.CONTAINER, tail_lines=60
                )
            except (ApiException, ValueError, OSError):
                tail = ""  # no logs yet (never started), or the node is gone
            failure = _ended(pod) or _stuck(pod)
            return Collected(
                log_tail=tail if isinstance(tail, str) else "", failure=None if failure == CLEAN_EXIT else failure
            )

        return await _in_thread(_collect)

    def describe(self, handle: SandboxHandle) -> str:
        parts = [f"{self.name}, pod {handle.ref}"]
        if handle.extra.get("image"):
            parts.append(f"image {handle.extra['image']}")
        if handle.extra.get("runtime_class"):
            parts.append(f"runtime class {handle.extra['runtime_class']}")
        return "; ".join(parts)

    async def sandboxes(self) -> list[str]:
        """Run ids of the sandbox Pods in the namespace (by label), sparing Pods younger than
        ``ORPHAN_MIN_AGE_SECS``: their provisioning may not have recorded them yet."""

        def _list() -> list[str]:
            now = time.time()
            pods = self._core.list_namespaced_pod(
                self.namespace, label_selector=f"{manifests.MANAGED_BY}={manifests.MANAGER}"
            ).items
            found: list[str] = []
            for pod in pods:
                meta = _meta(pod)
                if (meta.labels or {}).get(manifests.MANAGED_BY) != manifests.MANAGER:
                    continue
                run_id = (meta.labels or {}).get(manifests.RUN_LABEL, "")
                created = (meta.annotations or {}).get(manifests.CREATED_AT, "")
                young = created.isdigit() and now - int(created) < ORPHAN_MIN_AGE_SECS
                if run_id and not young:
                    found.append(run_id)
            return sorted(set(found))

        return await _in_thread(_list)


T = TypeVar("T")


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    try:
        return await asyncio.to_thread(fn, *args)
    except ApiException as err:
        raise KubernetesSandboxError(f"Kubernetes API refused: {_reason(err)}") from None
    except urllib3.exceptions.HTTPError as err:
        raise KubernetesSandboxError(f"Kubernetes API unreachable: {type(err).__name__}") from None


def _meta(pod: k8s.V1Pod) -> k8s.V1ObjectMeta:
    return pod.metadata if pod.metadata is not None else k8s.V1ObjectMeta()


def _pod_name(handle: SandboxHandle) -> str:
    return handle.ref.rsplit("/", 1)[-1] if handle.ref else manifests.object_name(handle.run_id)


def _same_pod(handle: SandboxHandle, pod: k8s.V1Pod) -> bool:
    """A Pod re-created under the same name (a later attempt) is not the one this handle names."""
    want = handle.extra.get("uid")
    return not want or not _meta(pod).uid or _meta(pod).uid == want


def _ended(pod: k8s.V1Pod) -> str | None:
    """Why the Pod is over, in words a user can act on; None while it runs (or may still start)."""
    status = pod.status
    if _meta(pod).deletion_timestamp is not None:
        return "the sandbox Pod is being deleted"
    if status is None:
        return None
    if status.reason == "Evicted":
        return f"the node evicted the sandbox Pod: {status.message or 'no message'}"
    if status.reason == "DeadlineExceeded":
        return "the sandbox Pod ran past its deadline (activeDeadlineSeconds from the wall-clock budget)"
    for cs in status.container_statuses or []:
        state = cs.state
        if state is None:
            continue
        if state.waiting is not None and state.waiting.reason in FATAL_WAITING:
            detail = state.waiting.message or state.waiting.reason
            return f"{FATAL_WAITING[state.waiting.reason]} ({cs.image}): {detail}"
        if state.terminated is not None:
            term = state.terminated
            if term.reason == "OOMKilled":
                return "the runner ran out of memory (OOMKilled: raise the sandbox memory limit)"
            if term.exit_code not in (0, None):
                return f"the runner exited with code {term.exit_code}" + (f" ({term.reason})" if term.reason else "")
            return CLEAN_EXIT
    if status.phase == "Failed":
        return f"the sandbox Pod failed: {status.reason or status.message or 'no reason given'}"
    if status.phase == "Succeeded":
        return CLEAN_EXIT
    return None


def _stuck(pod: k8s.V1Pod) -> str | None:
    """Why a Pod that has not ended is still not running (Pending: unschedulable, or a container waiting)."""
    status = pod.status
    if status is None or status.phase != "Pending":
        return None
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"the sandbox Pod cannot be scheduled: {cond.message or cond.reason or 'no reason given'}"
    for cs in status.container_statuses or []:
        if cs.state is not None and cs.state.waiting is not None and cs.state.waiting.reason:
            waiting = cs.state.waiting
            return f"the sandbox Pod is still pending: {waiting.reason}" + (
                f" ({waiting.message})" if waiting.message else ""
            )
    return "the sandbox Pod is still pending"


def _reason(err: ApiException) -> str:
    return f"HTTP {err.status} {err.reason or ''}".strip()
