"""Pure builders for what a Kubernetes sandbox is made of: a Pod, its bootstrap Secret, its NetworkPolicy.

Plain dicts in the API's JSON shape: the official client sends them as they are, ``kubernetes-validate``
checks them offline, and a test can assert every security property without a cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from core.ports import SandboxSpec

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "fluidbox"
RUN_LABEL = "fluidbox.dev/run-id"
BOOTSTRAP_DIGEST = "fluidbox.dev/bootstrap-sha256"  # which bootstrap credential a Pod was made for
CREATED_AT = "fluidbox.dev/created-at"  # epoch seconds, set by the worker (orphan sweep spares the young)
CONTAINER = "runner"
BOOTSTRAP_DIR = "/var/run/fluidbox/bootstrap"
BOOTSTRAP_FILE = BOOTSTRAP_DIR + "/token"
RUNNER_UID = 10001
# Seconds past the wall-clock budget before Kubernetes kills the Pod itself: the workflow's own timer
# ends the run first and collects the workspace; this is the backstop when the control plane cannot.
DEADLINE_GRACE_SECS = 300


@dataclass(frozen=True)
class PodPolicy:
    """Deployment-wide choices for every sandbox Pod (``KubernetesProvider`` settings)."""

    namespace: str = "fluidbox-sandboxes"
    default_image: str = "ghcr.io/fluidbox/runner:latest"
    runtime_class: str = ""  # gVisor (runsc) or Kata for kernel-level isolation; empty: the node's default
    cpu_millis: int = 1000
    memory_mb: int = 2048
    ephemeral_mb: int = 4096  # bounds the workspace and /tmp (emptyDirs) and the container's logs
    workspace_mb: int = 2048
    # Where runners may connect: the API Pods serving the runner plane (selected in their namespace).
    control_namespace: str = "fluidbox"
    control_pod_labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name": "fluidbox-api"})
    control_port: int = 8000
    # Resolving the control plane's Service name needs cluster DNS; with an IP in FLUIDBOX_CONTROL_URL it can go.
    allow_dns: bool = True
    image_pull_secret: str = ""


def object_name(run_id: str) -> str:
    """One name per run for its Pod, Secret and NetworkPolicy: a retried create finds what it made."""
    return f"fbx-run-{run_id.lower()}"


def labels(run_id: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, RUN_LABEL: run_id.lower()}


def bootstrap_digest(bootstrap: str) -> str:
    return hashlib.sha256(bootstrap.encode()).hexdigest()[:32]


def secret(spec: SandboxSpec, policy: PodPolicy) -> dict[str, Any]:
    """The one-time bootstrap credential, mounted read-only into the Pod (never an environment variable)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": object_name(spec.run_id), "namespace": policy.namespace, "labels": labels(spec.run_id)},
        "type": "Opaque",
        "stringData": {"token": spec.bootstrap},
    }


def network_policy(run_id: str, policy: PodPolicy) -> dict[str, Any]:
    """No ingress; egress only to the control plane's runner endpoint (and cluster DNS if allowed)."""
    egress: list[dict[str, Any]] = [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": policy.control_namespace}},
                    "podSelector": {"matchLabels": dict(policy.control_pod_labels)},
                }
            ],
            "ports": [{"protocol": "TCP", "port": policy.control_port}],
        }
    ]
    if policy.allow_dns:
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": object_name(run_id), "namespace": policy.namespace, "labels": labels(run_id)},
        "spec": {
            "podSelector": {"matchLabels": {RUN_LABEL: run_id.lower()}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def pod(spec: SandboxSpec, policy: PodPolicy, *, created_at: int) -> dict[str, Any]:
    """The run's Pod: non-root, read-only root, no capabilities, RuntimeDefault seccomp, no API token,
    no host path, bounded CPU/memory/disk and a deadline."""
    res = spec.resources
    cpu = res.cpu_millis or policy.cpu_millis
    memory = res.memory_mb or policy.memory_mb
    ephemeral = res.ephemeral_mb or policy.ephemeral_mb
    limits = {"cpu": f"{cpu}m", "memory": f"{memory}Mi", "ephemeral-storage": f"{ephemeral}Mi"}
    env = [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no environment variables naming every Service of the namespace
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNNER_UID,
            "runAsGroup": RUNNER_UID,
            "fsGroup": RUNNER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.image or policy.default_image,
                "imagePullPolicy": "IfNotPresent",
                "command": list(spec.argv),
                "workingDir": "/workspace",
                "env": env,
                "resources": {"limits": limits, "requests": dict(limits)},
                "securityContext": {
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "privileged": False,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": [
                    {"name": "workspace", "mountPath": "/workspace"},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "bootstrap", "mountPath": BOOTSTRAP_DIR, "readOnly": True},
                ],
            }
        ],
        "volumes": [
            {"name": "workspace", "emptyDir": {"sizeLimit": f"{policy.workspace_mb}Mi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            {
                "name": "bootstrap",
                "secret": {"secretName": object_name(spec.run_id), "defaultMode": 0o400},
            },
        ],
    }
    if spec.deadline_secs:
        pod_spec["activeDeadlineSeconds"] = int(spec.deadline_secs) + DEADLINE_GRACE_SECS
    runtime_class = spec.runtime_class or policy.runtime_class
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    if policy.image_pull_secret:
        pod_spec["imagePullSecrets"] = [{"name": policy.image_pull_secret}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": object_name(spec.run_id),
            "namespace": policy.namespace,
            "labels": labels(spec.run_id),
            "annotations": {BOOTSTRAP_DIGEST: bootstrap_digest(spec.bootstrap), CREATED_AT: str(created_at)},
        },
        "spec": pod_spec,
    }
