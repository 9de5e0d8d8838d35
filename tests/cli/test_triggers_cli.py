"""`fluidbox triggers …` and `fluidbox invoke` as a user runs them, against a real stack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cli.stack import Stack

FLUIDBOX = str(Path(sys.executable).parent / "fluidbox")
pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
async def stack() -> AsyncIterator[tuple[Stack, str]]:
    st = Stack.ephemeral("fbxtc-", {"FLUIDBOX_REPLAY_DELAY_MS": "0", "FLUIDBOX_LOG_LEVEL": "WARNING"})
    try:
        token = await st.start()
        yield st, token
    finally:
        st.stop()
        shutil.rmtree(st.home, ignore_errors=True)


def fluidbox(st: tuple[Stack, str], *args: str, ok: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLUIDBOX_")}
    base.update(FLUIDBOX_URL=st[0].api_url, FLUIDBOX_ADMIN_TOKEN=st[1], FLUIDBOX_HOME=str(st[0].home), **env)
    done = subprocess.run([FLUIDBOX, *args], env=base, capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0) == ok, (args, done.returncode, done.stdout, done.stderr)
    return done


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


async def test_create_invoke_replay_disable_rotate_and_run_now_from_the_command_line(
    stack: tuple[Stack, str], tmp_path: Path
) -> None:
    agent = f"cli-agent-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"say": "done"}]))
    fluidbox(stack, "agents", "create", "--name", agent, "--policy", "demo", "--script", str(script))
    name = f"cli-trig-{uuid.uuid4().hex[:6]}"
    made = as_json(
        fluidbox(stack, "triggers", "create", "--agent", agent, "--name", name, "--template", "Triage {{ticket}}")
    )
    sid, token = made["subscription"]["id"], made["token"]
    assert token.startswith("fbx_trig_")

    listed = fluidbox(stack, "triggers", "list").stdout
    assert f"{sid}  {name}  api  enabled  allow" in listed and token not in listed

    first = as_json(fluidbox(stack, "invoke", sid, "--token", token, "-c", "ticket=T-1", "--key", "k1"))
    again = as_json(fluidbox(stack, "invoke", sid, "-c", "ticket=T-1", "--key", "k1", FLUIDBOX_TRIGGER_TOKEN=token))
    assert first["replay"] is False and again["replay"] is True and again["session_id"] == first["session_id"]

    missing = fluidbox(stack, "invoke", sid, "--token", token, ok=False)
    assert "invoke → 400: task_template references '{{ticket}}'" in missing.stderr

    fluidbox(stack, "triggers", "disable", sid)
    off = fluidbox(stack, "invoke", sid, "--token", token, "-c", "ticket=T-2", ok=False)
    assert "invoke → 409: trigger subscription is disabled" in off.stderr
    fluidbox(stack, "triggers", "enable", sid)

    rotated = as_json(fluidbox(stack, "triggers", "rotate", sid))
    assert rotated["revoked"] == 1 and rotated["token"] != token
    stale = fluidbox(stack, "invoke", sid, "--token", token, "-c", "ticket=T-3", ok=False)
    assert "invoke → 401: unauthorized" in stale.stderr

    # run-now renders only {{fire_time}}: this template needs more, and says so.
    refused = fluidbox(stack, "triggers", "run-now", sid, ok=False)
    assert "→ 400: task_template references '{{ticket}}'" in refused.stderr
    # This stack has no FLUIDBOX_CREDENTIAL_KEY: a signed callback cannot be custodied, and nothing is stored.
    sealed = fluidbox(
        stack, "triggers", "create", "--agent", agent, "--name", name + "-cb", "--template", "t",
        "--callback-url", "https://hooks.example.com/fluidbox", ok=False,
    )  # fmt: skip
    assert "→ 503: credential storage is disabled: set FLUIDBOX_CREDENTIAL_KEY" in sealed.stderr
    assert name + "-cb" not in fluidbox(stack, "triggers", "list").stdout
    shown = as_json(fluidbox(stack, "triggers", "show", sid))
    assert [s["id"] for s in shown["sessions"]] == [first["session_id"]]
    assert rotated["token"] not in json.dumps(shown) and token not in json.dumps(shown)


def test_invoke_without_a_token_says_how_to_give_one() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUIDBOX_")}
    done = subprocess.run([FLUIDBOX, "invoke", str(uuid.uuid4())], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "no trigger token: pass --token or set FLUIDBOX_TRIGGER_TOKEN" in done.stderr
