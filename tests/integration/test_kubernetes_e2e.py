"""A run end to end through the Kubernetes path, with the test playing the node.

The real stack (PostgreSQL, Temporal, worker, API) runs with ``FLUIDBOX_SANDBOX_PROVIDER=kubernetes`` against
kmock (a Kubernetes API mock server). kmock has no kubelet, so this test is one: it watches the Pods the
worker creates, starts the runner from each Pod's spec (its command and environment, its bootstrap Secret
as the mounted file) as a process on this host reaching the API over HTTP exactly as a Pod would, and
writes the Pod's status as a kubelet would (Running, then Succeeded/Failed with the exit code).

Proven this way: the bootstrap exchange (and that it burns the credential), the workspace download with a
verified digest, the gate and a human approval, the final workspace upload, the diff computed by the
control plane, teardown of the Pod, Secret and NetworkPolicy. Not proven (needs a real cluster): image
pulls, the kubelet's enforcement of the security context, the CNI's enforcement of the NetworkPolicy.
The runner process here is not sandboxed: on a cluster the Pod is the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
import yaml
from kubernetes import client as k8s

from cli.stack import Stack, admin_token
from core import wire
from core.ports import SandboxSpec
from sandbox import manifests
from sandbox.kubernetes import ORPHAN_MIN_AGE_SECS
from sandbox.manifests import PodPolicy
from tests.helpers import eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    ROOT,
    events,
    issue_token,
    make_agent,
    start_run,
    wait_pending,
    wait_status,
)

NS = "fluidbox-sandboxes"


class Node:
    """The kubelet's part: start each new Pod's runner from its spec, report its phase, kill it on delete."""

    def __init__(self, emu: kmock.KubernetesEmulator, base: Path, client: k8s.CoreV1Api) -> None:
        self.emu = emu
        self.client = client  # what an operator's kubectl would be
        self.base = base
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.logs: dict[str, Path] = {}
        self.specs: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, str] = {}

    def live_pods(self) -> set[str]:
        return set(self._live("pods"))

    def _live(self, plural: str) -> dict[str, Any]:
        return {
            key[2]: self.emu.objects[key]
            for key in list(self.emu.objects.keys())
            if key[0].plural == plural and key[1] == NS and not self.emu.objects[key].deleted
        }

    async def run(self) -> None:
        while True:
            pods = self._live("pods")
            for name, obj in pods.items():
                if name not in self.procs:
                    await self._start(name, obj)
            for name, proc in self.procs.items():
                if name not in pods and proc.returncode is None:
                    proc.kill()  # the Pod was deleted: its container goes
            await asyncio.sleep(0.05)

    async def _start(self, name: str, obj: Any) -> None:
        pod = dict(obj.raw)
        self.specs[name] = pod
        (container,) = pod["spec"]["containers"]
        secret = self._live("secrets")[name].raw["stringData"]["token"]
        self.secrets[name] = secret
        root = self.base / name
        workspace, bootstrap = root / "workspace", root / "bootstrap"
        workspace.mkdir(parents=True)
        bootstrap.mkdir()
        (bootstrap / "token").write_text(secret)
        (bootstrap / "token").chmod(0o400)
        env = {e["name"]: e["value"] for e in container["env"]}
        # Where this "node" mounts what the Pod mounts; everything else is the Pod's own environment.
        env.update(
            {
                wire.ENV_BOOTSTRAP_FILE: str(bootstrap / "token"),
                wire.ENV_WORKSPACE: str(workspace),
                "HOME": str(workspace),
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(ROOT),
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        command = [sys.executable if part == "python" else part for part in container["command"]]
        log = root / "runner.log"
        self.logs[name] = log
        with open(log, "wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *command, env=env, cwd=workspace, stdout=out, stderr=asyncio.subprocess.STDOUT
            )
        self.procs[name] = proc
        obj.patch({"status": {"phase": "Running", "containerStatuses": [_container({"running": {}})]}})
        asyncio.get_running_loop().create_task(self._reap(name, obj, proc))

    async def _reap(self, name: str, obj: Any, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if not obj.deleted:
            phase = "Succeeded" if code == 0 else "Failed"
            obj.patch(
                {"status": {"phase": phase, "containerStatuses": [_container({"terminated": {"exitCode": code}})]}}
            )

    async def stop(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _container(state: dict[str, Any]) -> dict[str, Any]:
    return {"name": "runner", "image": "runner", "imageID": "", "ready": True, "restartCount": 0, "state": state}


@pytest.fixture(scope="module")
async def kube(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Stack, httpx.AsyncClient, Node]]:
    base = tmp_path_factory.mktemp("node")
    async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as server:
        for resource in ("v1/pods", "v1/secrets", "networking.k8s.io/v1/networkpolicies"):
            emu.resources[resource] = {}  # served before any object of them exists (a real API server knows them)
        emu[kmock.subresource("log")] << kmock.text("")
        config = base / "kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": str(server.url).rstrip("/")}}],
                    "users": [{"name": "worker", "user": {"token": "worker-sa-token"}}],
                    "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "worker"}}],
                    "current-context": "kmock",
                }
            )
        )
        st = Stack.ephemeral(
            "fbxk-", {**FAST, "FLUIDBOX_SANDBOX_PROVIDER": "kubernetes", "FLUIDBOX_SANDBOX_ORPHAN_SWEEP_SECS": "0.5"}
        )
        st.extra_env.update({"FLUIDBOX_KUBE_CONFIG": str(config), "FLUIDBOX_RUNNER_URL": st.api_url})
        node = Node(emu, base, k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=str(server.url).rstrip("/")))))
        playing = asyncio.create_task(node.run())
        try:
            await st.start()
            token = admin_token(st.home)[0]
            async with httpx.AsyncClient(
                base_url=st.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
            ) as client:
                yield st, client, node
        finally:
            playing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await playing
            await node.stop()
            st.stop()
            shutil.rmtree(st.home, ignore_errors=True)


async def test_a_run_goes_end_to_end_through_a_pod(kube: tuple[Stack, httpx.AsyncClient, Node]) -> None:
    stack, api, node = kube
    run_id = await start_run(api, await make_agent(api))
    pending = await wait_pending(api, run_id)
    r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
    assert r.status_code == 200, r.text
    row = await wait_status(api, run_id, {"completed", "failed"})
    name = manifests.object_name(run_id)
    log = node.logs[name].read_text()
    assert row["status"] == "completed", (row, log)

    # The diff was computed by the control plane from what the runner uploaded.
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert '+    return f"Hello, {name}!"' in out["diff"] and "deploy.log" in out["diff"]
    assert out["gate_consulted"] is True
    assert "digest verified" in log
    evs = await events(api, run_id)
    launched = [e["payload"]["data"]["text"] for e in evs if "sandbox launched" in str(e["payload"])]
    assert launched == [f"sandbox launched (kubernetes, pod {NS}/{name}; image ghcr.io/fluidbox/runner:latest)"]

    # The Pod carried no run token, only the one-time credential, and that is spent now.
    env = {e["name"]: e["value"] for e in node.specs[name]["spec"]["containers"][0]["env"]}
    assert not set(env) & {wire.ENV_SESSION_TOKEN, wire.ENV_TOOL_TOKEN, wire.ENV_LLM_TOKEN}
    assert env[wire.ENV_WORKSPACE_SHA256] and env[wire.ENV_CONTROL_URL] == stack.api_url
    again = await api.post(
        f"/internal/sessions/{run_id}/bootstrap", headers={"authorization": f"Bearer {node.secrets[name]}"}
    )
    assert again.status_code == 401, again.text
    assert "already spent" in again.json()["error"]

    # Teardown removed the Pod, its Secret and its NetworkPolicy.
    assert not [k for k in node.emu.objects.keys() if k[2] == name and not node.emu.objects[k].deleted]


async def test_a_pod_left_behind_by_a_finished_run_is_swept(kube: tuple[Stack, httpx.AsyncClient, Node]) -> None:
    """A worker that died between a run's end and its teardown leaves a Pod: the sweep finds it by label."""
    _, api, node = kube
    run_id = await start_run(api, await make_agent(api))
    await wait_pending(api, run_id)
    await api.post(f"/v1/sessions/{run_id}/cancel")
    await wait_status(api, run_id, {"cancelled"})
    stray = manifests.pod(
        SandboxSpec(run_id=run_id, argv=["python", "-m", "runner"], bootstrap="spent"),
        PodPolicy(),
        created_at=int(time.time()) - ORPHAN_MIN_AGE_SECS - 1,
    )
    name = manifests.object_name(run_id)
    assert name in node.procs and name not in node.live_pods()  # its own Pod ran and was torn down
    await asyncio.to_thread(node.client.create_namespaced_pod, NS, stray)  # the node does not run it again
    assert name in node.live_pods()

    async def gone() -> bool | None:
        return True if manifests.object_name(run_id) not in node.live_pods() else None

    await eventually(gone, timeout=30, message="the orphaned Pod was not swept")


async def test_the_runner_plane_checks_workspace_transfers(kube: tuple[Stack, httpx.AsyncClient, Node]) -> None:
    stack, api, node = kube
    agent = await make_agent(api, harness_config={"runner_image": "registry.test/custom:2", "runtime_class": "gvisor"})
    run_id = await start_run(api, agent)
    await wait_pending(api, run_id)  # the runner is up and waiting on a human: its tokens are live
    pod = node.specs[manifests.object_name(run_id)]["spec"]  # the agent revision chose its image and runtime
    assert pod["containers"][0]["image"] == "registry.test/custom:2" and pod["runtimeClassName"] == "gvisor"
    url = f"/internal/sessions/{run_id}/workspace"
    # The runner holds its tokens in memory; the test mints its own workspace and control tokens.
    auth = {"authorization": f"Bearer {await issue_token(stack.database_url or '', run_id, 'workspace')}"}
    got = await api.get(url, headers=auth)
    assert got.status_code == 200 and got.headers["content-type"] == "application/gzip"
    assert hashlib.sha256(got.content).hexdigest() == got.headers[wire.WORKSPACE_DIGEST_HEADER]
    gzip_type = {"content-type": "application/gzip"}
    bad = await api.put(url, content=got.content, headers={**auth, **gzip_type, wire.WORKSPACE_DIGEST_HEADER: "0" * 64})
    assert bad.status_code == 400 and "does not match" in bad.json()["error"]
    unsigned = await api.put(url, content=got.content, headers={**auth, **gzip_type})
    assert unsigned.status_code == 400 and wire.WORKSPACE_DIGEST_HEADER in unsigned.json()["error"]
    assert (await api.put(url, content=b"{}", headers={**auth, "content-type": "application/json"})).status_code == 415
    control = {"authorization": f"Bearer {await issue_token(stack.database_url or '', run_id, 'control')}"}
    assert (await api.get(url, headers=control)).status_code == 403  # the workspace audience only
    fresh = {"authorization": "Bearer fbx_sess_" + "0" * 32}
    assert (await api.post(f"/internal/sessions/{run_id}/bootstrap", headers=fresh)).status_code == 401
    await api.post(f"/v1/sessions/{run_id}/cancel")
    await wait_status(api, run_id, {"cancelled"})
