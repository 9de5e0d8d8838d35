"""KubernetesProvider through the official ``kubernetes`` client against kmock, a Kubernetes API mock
server (an in-memory object store over real HTTP; no kubelet, no admission, no scheduler).

What this proves: the requests the provider makes and how it reads back what the API says (create,
idempotent re-create, status transitions written the way a kubelet writes them, orphan listing,
foreground deletion). What it cannot prove (needs a real cluster, docs/operations.md): that a node
enforces the Pod's security context, that a CNI enforces the NetworkPolicy, that the kubelet reports
these exact reasons.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest_asyncio
import yaml
from kubernetes import client as k8s

from config.settings import SandboxSettings
from core.ports import Resources, SandboxSpec
from sandbox import manifests
from sandbox.kubernetes import ORPHAN_MIN_AGE_SECS, KubernetesProvider
from sandbox.manifests import PodPolicy
from sandbox.registry import make_provider

NS = "fluidbox-sandboxes"


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[tuple[kmock.KubernetesEmulator, KubernetesProvider]]:
    async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as server:
        for resource in ("v1/pods", "v1/secrets", "networking.k8s.io/v1/networkpolicies"):
            emu.resources[resource] = {}  # served before any object of them exists (a real API server knows them)
        emu[kmock.subresource("log")] << kmock.text(
            "fluidbox-runner: starting\nfluidbox-runner: control plane unreachable\n"
        )
        api = k8s.ApiClient(k8s.Configuration(host=str(server.url).rstrip("/")))
        try:
            yield emu, KubernetesProvider(api, PodPolicy(namespace=NS, default_image="registry.test/runner:1"))
        finally:
            api.close()


def spec(run_id: str | None = None, *, bootstrap: str = "fbx_sess_bootstrap0001", **kw: Any) -> SandboxSpec:
    return SandboxSpec(
        run_id=run_id or str(uuid.uuid4()),
        argv=["python", "-m", "runner"],
        env={"FLUIDBOX_SESSION_ID": "x", "FLUIDBOX_CONTROL_URL": "http://fluidbox-api.fluidbox.svc:8000"},
        bootstrap=bootstrap,
        **kw,
    )


def stored(emu: kmock.KubernetesEmulator, plural: str, run_id: str) -> dict[str, Any] | None:
    for key in emu.objects.keys():
        if key[0].plural == plural and key[2] == manifests.object_name(run_id) and not emu.objects[key].deleted:
            return dict(emu.objects[key].raw)
    return None


def set_status(emu: kmock.KubernetesEmulator, run_id: str, status: dict[str, Any]) -> None:
    """Write a Pod's status the way a kubelet would (kmock has none)."""
    key = next(k for k in emu.objects.keys() if k[0].plural == "pods" and k[2] == manifests.object_name(run_id))
    emu.objects[key].patch({"status": status})


def container(state: dict[str, Any]) -> dict[str, Any]:
    return {"name": "runner", "image": "registry.test/runner:1", "imageID": "", "ready": False,
            "restartCount": 0, "state": state}  # fmt: skip


def requests(emu: kmock.KubernetesEmulator, method: str, plural: str) -> list[kmock.Request]:
    return [r for r in emu if str(r.method).endswith(method) and r.resource is not None and r.resource.plural == plural]


async def test_create_makes_a_locked_down_pod_its_bootstrap_secret_and_an_egress_policy(cluster: Any) -> None:
    emu, provider = cluster
    s = spec(resources=Resources(memory_mb=512, cpu_millis=250), deadline_secs=600, runtime_class="gvisor")
    handle = await provider.create(s)

    assert handle.provider == "kubernetes" and handle.ref == f"{NS}/{manifests.object_name(s.run_id)}"
    assert handle.model_validate_json(handle.model_dump_json()) == handle  # opaque and serializable
    pod = stored(emu, "pods", s.run_id)
    assert pod is not None
    assert pod["metadata"]["labels"][manifests.RUN_LABEL] == s.run_id
    ps = pod["spec"]
    assert ps["automountServiceAccountToken"] is False
    assert ps["securityContext"]["runAsNonRoot"] is True
    assert ps["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ps["activeDeadlineSeconds"] == 600 + manifests.DEADLINE_GRACE_SECS
    assert ps["runtimeClassName"] == "gvisor"
    assert all("hostPath" not in v for v in ps["volumes"])
    (c,) = ps["containers"]
    assert c["image"] == "registry.test/runner:1"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["limits"] == {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "4096Mi"}
    # The bootstrap credential is in the Secret only: never in the Pod's environment or command.
    secret = stored(emu, "secrets", s.run_id)
    assert secret is not None and secret["stringData"] == {"token": s.bootstrap}
    assert s.bootstrap not in str(ps)
    policy = stored(emu, "networkpolicies", s.run_id)
    assert policy is not None
    assert policy["spec"]["podSelector"] == {"matchLabels": {manifests.RUN_LABEL: s.run_id}}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["ingress"] == []
    to_control, to_dns = policy["spec"]["egress"]
    assert to_control["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert to_control["to"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "fluidbox-api"}}
    assert {p["port"] for p in to_dns["ports"]} == {53}
    assert "sandbox launched" not in provider.describe(handle) and "gvisor" in provider.describe(handle)


async def test_a_retried_create_finds_its_pod_and_a_new_credential_replaces_it(cluster: Any) -> None:
    emu, provider = cluster
    s = spec()
    first = await provider.create(s)
    again = await provider.create(s)  # the activity retried after the Pod was made
    assert again == first
    assert len(requests(emu, "POST", "pods")) == 1
    assert await provider.find(s.run_id) == first

    # A retried provisioning minted a new bootstrap credential: the old Pod goes, a new one comes.
    renewed = spec(s.run_id, bootstrap="fbx_sess_bootstrap0002")
    await provider.create(renewed)
    assert len(requests(emu, "POST", "pods")) == 2
    pod = stored(emu, "pods", s.run_id)
    assert pod is not None
    assert pod["metadata"]["annotations"][manifests.BOOTSTRAP_DIGEST] == manifests.bootstrap_digest(renewed.bootstrap)
    secret = stored(emu, "secrets", s.run_id)
    assert secret is not None and secret["stringData"] == {"token": renewed.bootstrap}


async def test_status_maps_what_the_kubelet_reports_to_clear_reasons(cluster: Any) -> None:
    emu, provider = cluster
    cases: list[tuple[dict[str, Any], str, str | None]] = [
        ({"phase": "Pending"}, "running", "the sandbox Pod is still pending"),
        (
            {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient memory."}]},
            "running",
            "the sandbox Pod cannot be scheduled: 0/3 nodes are available: 3 Insufficient memory.",
        ),
        ({"phase": "Running", "containerStatuses": [container({"running": {}})]}, "running", None),
        (
            {"phase": "Pending", "containerStatuses": [container(
                {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}})]},
            "exited",
            "the runner image could not be pulled (registry.test/runner:1): Back-off pulling image",
        ),
        (
            {"phase": "Failed",
             "containerStatuses": [container({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})]},
            "exited",
            "the runner ran out of memory (OOMKilled: raise the sandbox memory limit)",
        ),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: ephemeral-storage."},
            "exited",
            "the node evicted the sandbox Pod: The node was low on resource: ephemeral-storage.",
        ),
        ({"phase": "Failed", "reason": "DeadlineExceeded"}, "exited",
         "the sandbox Pod ran past its deadline (activeDeadlineSeconds from the wall-clock budget)"),
        ({"phase": "Succeeded", "containerStatuses": [container({"terminated": {"exitCode": 0}})]}, "exited", None),
    ]  # fmt: skip
    for status, state, failure in cases:
        s = spec()
        handle = await provider.create(s)
        set_status(emu, s.run_id, status)
        assert await provider.status(handle) == state, status
        collected = await provider.collect(handle)
        assert collected.failure == failure, status
        assert "control plane unreachable" in collected.log_tail  # the runner's last words, for the death reason
        if state == "exited":
            assert await provider.find(s.run_id) is None  # an ended Pod is not a live sandbox to adopt


async def test_a_pod_deleted_behind_our_back_is_missing_and_says_so(cluster: Any) -> None:
    _, provider = cluster
    s = spec()
    handle = await provider.create(s)
    await provider.destroy(handle)
    assert await provider.status(handle) == "missing"
    assert "gone" in ((await provider.collect(handle)).failure or "")


async def test_orphan_listing_finds_pods_by_label_and_spares_young_ones(cluster: Any) -> None:
    emu, provider = cluster
    old, young = spec(), spec()
    await provider.create(old)
    await provider.create(young)
    key = next(k for k in emu.objects.keys() if k[0].plural == "pods" and k[2] == manifests.object_name(old.run_id))
    aged = str(int(time.time()) - ORPHAN_MIN_AGE_SECS - 5)
    emu.objects[key].patch({"metadata": {"annotations": {manifests.CREATED_AT: aged}}})
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-ours", "namespace": NS, "labels": {manifests.RUN_LABEL: "x"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    await asyncio.to_thread(provider._core.create_namespaced_pod, NS, foreign)
    assert await provider.sandboxes() == [old.run_id]  # by label: not the young one, not one fluidbox did not make


async def test_destroy_deletes_pod_secret_and_policy_in_the_foreground(cluster: Any) -> None:
    emu, provider = cluster
    s = spec()
    handle = await provider.create(s)
    await provider.destroy(handle, grace_secs=3)
    for plural in ("pods", "secrets", "networkpolicies"):
        assert stored(emu, plural, s.run_id) is None, plural
        (delete,) = requests(emu, "DELETE", plural)
        assert delete.data["propagationPolicy"] == "Foreground"
    (pod_delete,) = requests(emu, "DELETE", "pods")
    assert pod_delete.data["gracePeriodSeconds"] == 3
    await provider.destroy(handle)  # already gone: a retried teardown is a no-op
    assert await provider.sandboxes() == []


def test_the_registry_builds_the_provider_from_a_kubeconfig(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://k8s.test:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    provider = make_provider(SandboxSettings(provider="kubernetes", kube_config=config, kube_namespace="runs"))
    assert isinstance(provider, KubernetesProvider)
    assert provider.namespace == "runs" and provider.workspace_transfer == "archive"
