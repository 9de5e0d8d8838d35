"""The `fluidbox` command as a user runs it: demo, up/stop, and readable errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.stack import free_port
from core.ports import SandboxHandle
from sandbox.registry import make_provider

FLUIDBOX = str(Path(sys.executable).parent / "fluidbox")
pytestmark = pytest.mark.stack


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fbxc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    # Neither our settings nor a model key from the calling shell: the replay demo must run here.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLUIDBOX_", "ANTHROPIC_", "OPENAI_"))}
    env.update(
        FLUIDBOX_HOME=str(home),
        FLUIDBOX_BIND=f"127.0.0.1:{free_port()}",
        FLUIDBOX_TEMPORAL_PORT=str(free_port()),
        FLUIDBOX_UI_PORT=str(free_port()),
        FLUIDBOX_REPLAY_DELAY_MS="0",
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def fluidbox_up(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """`fluidbox up` until it says it is ready; SIGTERM (its clean stop) on the way out."""
    up = subprocess.Popen([FLUIDBOX, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if "Press Ctrl-C to stop." in line:
                break
        yield up
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)


def processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in ("Z", "X"):
            found.append(int(pid))
    return found


def test_demo_runs_a_governed_agent_end_to_end(home: Path) -> None:
    env = cli_env(home)
    env.pop("XDG_RUNTIME_DIR", None)  # as on a fresh login shell without a session manager
    proc = subprocess.run([FLUIDBOX, "demo"], env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    # A first run prints nothing that looks like a problem.
    assert not re.search(r"(?i)warn|error|traceback", out + proc.stderr), out + proc.stderr
    assert "needs a human: Bash: ./deploy.sh" in out
    assert "a human approves over HTTP: POST /v1/approvals/" in out
    assert "DENY by policy" in out and "curl" in out
    assert '+    return f"Hello, {name}!"' in out
    assert "── run completed ── Temporal UI: http://127.0.0.1:" in out and "/workflows/run-" in out
    assert (home / "admin-token").stat().st_mode & 0o777 == 0o600
    assert processes_mentioning(str(home)) == [], "the demo must stop everything it started"


def test_up_serves_until_sigterm_and_leaves_no_process_behind(home: Path) -> None:
    env = cli_env(home)
    proc = subprocess.Popen([FLUIDBOX, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Press Ctrl-C to stop." in line:
                break
        text = "".join(lines)
        assert f"API:         http://{env['FLUIDBOX_BIND']}" in text
        assert f"Temporal UI: http://127.0.0.1:{env['FLUIDBOX_UI_PORT']}" in text
        assert f"admin token: {home}/admin-token" in text
        token = (home / "admin-token").read_text().strip()
        ready = httpx.get(f"http://{env['FLUIDBOX_BIND']}/v1/ready", timeout=10)
        assert ready.status_code == 200
        listed = httpx.get(f"http://{env['FLUIDBOX_BIND']}/v1/agents", headers={"authorization": f"Bearer {token}"})
        assert listed.status_code == 200
        assert processes_mentioning(str(home)), "the stack's processes should be running"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert processes_mentioning(str(home)) == []


def test_a_taken_port_is_a_one_line_error_naming_it(home: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = cli_env(home, FLUIDBOX_UI_PORT=str(port))
        proc = subprocess.run([FLUIDBOX, "up"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == [
        f"error: port 127.0.0.1:{port} (Temporal UI) is already in use; stop what holds it or pick another port"
    ]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert processes_mentioning(str(home)) == []


def test_a_bad_worker_process_count_is_a_one_line_error_and_starts_nothing(home: Path) -> None:
    env = cli_env(home, FLUIDBOX_WORKER_PROCESSES="none")
    proc = subprocess.run([FLUIDBOX, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: FLUIDBOX_WORKER_PROCESSES must be a whole number of at least 1, not 'none'"
    assert processes_mentioning(str(home)) == []


def test_up_with_two_api_processes_serves_the_same_control_plane_on_both(home: Path) -> None:
    env = cli_env(home, FLUIDBOX_API_PROCESSES="2")
    proc = subprocess.Popen([FLUIDBOX, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Press Ctrl-C to stop." in line:
                break
        shown = next(line for line in lines if line.strip().startswith("API:")).split()[1:]
        assert len(shown) == 2 and shown[0] == f"http://{env['FLUIDBOX_BIND']}" and shown[1] != shown[0]
        headers = {"authorization": f"Bearer {(home / 'admin-token').read_text().strip()}"}
        made = httpx.post(f"{shown[1]}/v1/agents", json={"name": "two-apis", "harness": "replay"}, headers=headers)
        assert made.status_code == 200, made.text
        assert httpx.get(f"{shown[0]}/v1/agents/two-apis", headers=headers).status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert processes_mentioning(str(home)) == [], "both API processes must stop"


def test_a_bad_api_process_count_is_a_one_line_error_and_starts_nothing(home: Path) -> None:
    env = cli_env(home, FLUIDBOX_API_PROCESSES="0")
    proc = subprocess.run([FLUIDBOX, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: FLUIDBOX_API_PROCESSES must be a whole number of at least 1, not '0'"
    assert processes_mentioning(str(home)) == []


def test_a_missing_temporal_certificate_is_a_one_line_error_and_starts_nothing(home: Path) -> None:
    env = cli_env(home, FLUIDBOX_TEMPORAL_TLS_CA=str(home / "no-ca.pem"))
    proc = subprocess.run([FLUIDBOX, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: FLUIDBOX_TEMPORAL_TLS_CA: the file {home}/no-ca.pem does not exist"
    assert processes_mentioning(str(home)) == []


def test_fluidbox_worker_refuses_an_unknown_queue_role(home: Path) -> None:
    env = cli_env(home, FLUIDBOX_DATABASE_URL="postgresql://nobody@/nowhere?host=/nonexistent")
    proc = subprocess.run([FLUIDBOX, "worker", "--queues", "runs,brokr"], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "fluidbox worker: unknown task queue role(s) 'brokr'"


def test_an_unreachable_api_is_a_one_line_error(home: Path) -> None:
    env = cli_env(home, FLUIDBOX_URL=f"http://127.0.0.1:{free_port()}", FLUIDBOX_ADMIN_TOKEN="x")
    proc = subprocess.run([FLUIDBOX, "runs", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: cannot reach the fluidbox API at http://127.0.0.1:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_commands_drive_runs_and_approvals_over_http(home: Path) -> None:
    """`runs start`, `approvals approve` and `runs watch` against a stack started with `up`."""
    env = cli_env(home)
    with fluidbox_up(env):
        env["FLUIDBOX_URL"] = f"http://{env['FLUIDBOX_BIND']}"

        def fb(*args: str) -> str:
            done = subprocess.run([FLUIDBOX, *args], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        script = home / "script.json"
        script.write_text('[{"tool": "Bash", "input": {"command": "./deploy.sh"}}]')
        fb("agents", "create", "--name", "cli-agent", "--policy", "demo", "--script", str(script))
        import json

        run = json.loads(
            fb(
                "runs",
                "start",
                "--agent",
                "cli-agent",
                "--task",
                "deploy",
                "--workspace",
                str(Path(__file__).resolve().parents[2] / "examples" / "demo-repo"),
            )
        )
        approval_id = None
        for _ in range(300):
            listed = fb("approvals", "list")
            if listed.strip():
                approval_id = listed.split()[0]
                break
            asyncio.run(asyncio.sleep(0.1))
        assert approval_id is not None
        assert json.loads(fb("approvals", "approve", approval_id))["approval"]["status"] == "approved_once"
        timeline = fb("runs", "watch", run["id"])
        assert "rp_001 approved_once by operator" in timeline
        assert "result completed: Replay complete: 1 executed, 0 denied." in timeline
        assert run["id"] in fb("runs", "list")


def start_idle_run(env: dict[str, str], home: Path) -> str:
    """A run whose sandbox idles, once its sandbox runs."""
    api = httpx.Client(
        base_url=f"http://{env['FLUIDBOX_BIND']}",
        headers={"authorization": f"Bearer {(home / 'admin-token').read_text().strip()}"},
    )
    agent = api.post(
        "/v1/agents",
        json={
            "name": "idle",
            "harness": "replay",
            "policy": "demo",
            "harness_config": {"script": [{"sleep_ms": 600000}]},
        },
    )
    assert agent.status_code == 200, agent.text
    run = api.post("/v1/sessions", json={"agent": "idle", "task": "wait"}).json()["session"]
    for _ in range(300):
        if api.get(f"/v1/sessions/{run['id']}").json()["session"]["status"] == "running":
            break
        asyncio.run(asyncio.sleep(0.1))
    assert processes_mentioning("--args"), "a sandbox should be running"
    return str(run["id"])


def test_stopping_the_stack_leaves_its_sandboxes_running(home: Path) -> None:
    env = cli_env(home)
    with fluidbox_up(env):
        run_id = start_idle_run(env, home)
    pidfile = home / "runs" / run_id / "sandbox.pid"
    handle = SandboxHandle.model_validate_json(pidfile.read_text())
    provider = make_provider()
    try:
        assert asyncio.run(provider.status(handle)) == "running", "the sandbox outlives the stop"
        # Everything else the stack started is gone: only the sandbox's own processes remain.
        assert set(processes_mentioning(str(home))) <= set(processes_mentioning("--args"))
    finally:
        asyncio.run(provider.destroy(handle))


def test_stopping_the_stack_with_destroy_sandboxes_on_stop_ends_them(home: Path) -> None:
    env = cli_env(home, FLUIDBOX_DESTROY_SANDBOXES_ON_STOP="1")
    with fluidbox_up(env):
        run_id = start_idle_run(env, home)
    assert processes_mentioning(str(home)) == []
    assert not (home / "runs" / run_id / "sandbox.pid").exists(), "the sandbox was destroyed on stop"


def test_a_sigterm_while_the_stack_is_still_starting_leaves_no_process_behind(home: Path) -> None:
    env = cli_env(home)
    proc = subprocess.Popen([FLUIDBOX, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "starting the worker" in line:  # PostgreSQL and Temporal run, the worker and the API are coming
                break
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert processes_mentioning(str(home)) == []


def test_policies_are_managed_from_the_cli(home: Path) -> None:
    env = cli_env(home)
    with fluidbox_up(env):
        env["FLUIDBOX_URL"] = f"http://{env['FLUIDBOX_BIND']}"

        def fb(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
            done = subprocess.run([FLUIDBOX, *args], env=env, capture_output=True, text=True, timeout=120)
            assert (done.returncode == 0) == ok, done.stdout + done.stderr
            return done

        draft = home / "p.yaml"
        draft.write_text("name: team\ntools:\n  - match: [Bash]\n    action: deny\n")
        assert '"valid": true' in fb("policies", "validate", str(draft)).stdout
        assert '"appended": true' in fb("policies", "import", str(draft)).stdout
        draft.write_text("name: team\ndefaults: {tool_action: deny}\n")
        fb("policies", "publish", "team", str(draft), "--base", "1", "--summary", "deny by default")
        stale = fb("policies", "publish", "team", str(draft), "--base", "1", "--summary", "again", ok=False)
        assert stale.stderr.strip().startswith("error: POST /v1/policies/team/publish → 409: the policy moved to v2")
        assert "team" in fb("policies", "list").stdout and "v2" in fb("policies", "list").stdout
        shown = fb("policies", "show", "team", "--matrix").stdout
        assert any(line.split()[:2] == ["Bash", "deny"] for line in shown.splitlines())
        fb("policies", "revert", "team", "1", "--base", "2")
        assert '"version": 3' in fb("policies", "show", "team").stdout
        draft.write_text("name: team\ndefaults: {tool_actoin: deny}\n")
        bad = fb("policies", "validate", str(draft), ok=False)
        assert "unknown key 'defaults.tool_actoin'" in bad.stderr and "Traceback" not in bad.stderr


async def test_stopping_a_stack_from_inside_an_event_loop_also_destroys_its_sandboxes() -> None:
    """Test fixtures and benchmarks stop their stack from async code; the sandboxes must not outlive it."""
    from cli.stack import Stack

    stack = Stack.ephemeral("fbxs-", {"FLUIDBOX_REPLAY_DELAY_MS": "0"})
    try:
        token = await stack.start()
        async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}) as api:
            script = {"script": [{"sleep_ms": 600000}]}
            await api.post(
                "/v1/agents", json={"name": "idle", "harness": "replay", "policy": "demo", "harness_config": script}
            )
            run_id = (await api.post("/v1/sessions", json={"agent": "idle", "task": "wait"})).json()["session"]["id"]
            for _ in range(300):
                if (await api.get(f"/v1/sessions/{run_id}")).json()["session"]["status"] == "running":
                    break
                await asyncio.sleep(0.1)
        assert any(f"FLUIDBOX_SESSION_ID={run_id}".encode() in _environ(pid) for pid in processes_mentioning("runner"))
    finally:
        stack.stop()
        shutil.rmtree(stack.home, ignore_errors=True)
    assert not [
        pid for pid in processes_mentioning("runner") if f"FLUIDBOX_SESSION_ID={run_id}".encode() in _environ(pid)
    ]


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""
